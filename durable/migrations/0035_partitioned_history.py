"""A run table partitioned by id cannot hold a unique index without the id, so the index that let
one run gather a debounce key's calls goes: calls for one key take turns under an advisory lock
instead (``durable.models.debounced``)."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("durable", "0034_progress_at")]

    operations = [
        migrations.RemoveConstraint(model_name="run", name="durable_run_one_debounce"),
    ]
