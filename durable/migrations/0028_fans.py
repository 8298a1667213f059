"""``durable_fan``: how many members of each fan are still pending, in shards (see
durable/models/fans.py). On PostgreSQL its pages are kept half empty (``fillfactor``), so that a
shard updated once per member stays a HOT update beside its row. Fans already open keep no
count: their members are asked, as before."""

import django.db.models.deletion
from django.db import migrations, models


def _fillfactor(percent: int):
    def alter(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(f"ALTER TABLE durable_fan SET (fillfactor = {percent})")

    return alter


class Migration(migrations.Migration):
    dependencies = [
        ("durable", "0027_untaken_steps_only"),
    ]

    operations = [
        migrations.CreateModel(
            name="Fan",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("first", models.PositiveIntegerField()),
                ("shard", models.PositiveIntegerField()),
                ("pending", models.IntegerField()),
                (
                    "run",
                    models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="fans",
                        to="durable.run",
                    ),
                ),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(fields=("run", "first", "shard"), name="durable_fan_shard")
                ],
            },
        ),
        migrations.RunPython(_fillfactor(50), migrations.RunPython.noop),
    ]
