"""Streams (``ctx.write_stream``, ``durable.write_stream``, ``durable.read_stream``): a head row per
stream of a run, locked while a value is appended, and the values by position. New tables:
nothing existing is rewritten. Both go with their run (deleted by retention and ``delete_run``)."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("durable", "0032_lanes"),
    ]

    operations = [
        migrations.CreateModel(
            name="StreamHead",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("key", models.CharField(max_length=200)),
                ("next_position", models.BigIntegerField(default=0)),
                ("closed", models.BooleanField(default=False)),
                (
                    "run",
                    models.ForeignKey(
                        db_index=False, on_delete=django.db.models.deletion.CASCADE, to="durable.run"
                    ),
                ),
            ],
            options={
                "constraints": [models.UniqueConstraint(fields=("run", "key"), name="durable_stream_head")],
            },
        ),
        migrations.CreateModel(
            name="StreamValue",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("key", models.CharField(max_length=200)),
                ("position", models.BigIntegerField()),
                ("value", models.JSONField(blank=True, null=True)),
                ("seq", models.PositiveIntegerField()),
                ("attempt", models.PositiveIntegerField(default=0)),
                ("index", models.PositiveIntegerField(default=0)),
                ("written_at", models.DateTimeField()),
                (
                    "run",
                    models.ForeignKey(
                        db_index=False, on_delete=django.db.models.deletion.CASCADE, to="durable.run"
                    ),
                ),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(fields=("run", "key", "position"), name="durable_stream_value"),
                    models.UniqueConstraint(
                        fields=("run", "key", "seq", "attempt", "index"), name="durable_stream_once"
                    ),
                ],
            },
        ),
    ]
