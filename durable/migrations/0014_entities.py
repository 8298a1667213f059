"""Durable entities: a row per (name, key) with its state, a row per op sent to it."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("durable", "0013_lean_indexes"),
    ]

    operations = [
        migrations.CreateModel(
            name="Entity",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("name", models.CharField(max_length=200)),
                ("key", models.CharField(max_length=255)),
                ("state", models.JSONField(blank=True, null=True)),
                ("version", models.CharField(default="1", max_length=32)),
                ("applied", models.BigIntegerField(default=0)),
                ("last_op", models.BigIntegerField(blank=True, null=True)),
                ("created_at", models.DateTimeField()),
                ("updated_at", models.DateTimeField()),
            ],
            options={
                "verbose_name_plural": "entities",
                "constraints": [models.UniqueConstraint(fields=("name", "key"), name="durable_entity_key")],
            },
        ),
        migrations.CreateModel(
            name="EntityOp",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("entity", models.CharField(max_length=200)),
                ("key", models.CharField(max_length=255)),
                ("op", models.CharField(max_length=100)),
                ("op_id", models.CharField(max_length=300)),
                ("arg", models.JSONField(blank=True, null=True)),
                (
                    "status",
                    models.CharField(
                        choices=[("pending", "Pending"), ("applied", "Applied"), ("failed", "Failed")],
                        default="pending",
                        max_length=16,
                    ),
                ),
                ("result", models.JSONField(blank=True, null=True)),
                ("error", models.JSONField(blank=True, null=True)),
                ("caller_run_id", models.CharField(blank=True, max_length=255, null=True)),
                ("caller_seq", models.PositiveIntegerField(blank=True, null=True)),
                ("created_at", models.DateTimeField()),
                ("applied_at", models.DateTimeField(blank=True, null=True)),
            ],
            options={
                "verbose_name": "entity op",
                "indexes": [
                    models.Index(
                        condition=models.Q(("status", "pending")),
                        fields=["entity", "key", "id"],
                        name="durable_entityop_pending",
                    ),
                    models.Index(
                        condition=models.Q(("status", "pending")),
                        fields=["id"],
                        name="durable_entityop_stranded",
                    ),
                ],
                "constraints": [
                    models.UniqueConstraint(fields=("entity", "key", "op_id"), name="durable_entityop_once")
                ],
            },
        ),
    ]
