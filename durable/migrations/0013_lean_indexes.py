"""The retention sweep reads finished roots oldest first through an index of their own; the
``varchar_pattern_ops`` indexes PostgreSQL gets for every indexed text column (``..._like``) serve
no query of durable's (no LIKE 'prefix%' on them) and only cost every write: dropped."""

from django.db import migrations, models

from ._pattern_indexes import drop_pattern_indexes


class Migration(migrations.Migration):
    dependencies = [("durable", "0012_updates_queries")]

    operations = [
        migrations.AddIndex(
            model_name="run",
            index=models.Index(
                condition=models.Q(("finished_at__isnull", False), ("parent__isnull", True)),
                fields=["finished_at", "id"],
                name="durable_run_root_finished",
            ),
        ),
        # A text column declared later with db_index=True, unique or as a key gets such a twin
        # again: declare new indexes in Meta.indexes, which Django creates without one.
        migrations.RunPython(drop_pattern_indexes, migrations.RunPython.noop),
    ]
