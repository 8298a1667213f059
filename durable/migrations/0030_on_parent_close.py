"""A child run keeps what becomes of it when its parent ends (``ctx.child(on_parent_close=...)``).

Nullable without a default (None is the default policy, "cancel"): adding it rewrites no row."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("durable", "0029_forks")]

    operations = [
        migrations.AddField(
            model_name="run",
            name="on_parent_close",
            field=models.CharField(blank=True, max_length=16, null=True),
        ),
    ]
