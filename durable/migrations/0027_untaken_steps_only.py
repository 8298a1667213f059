"""``durable_checkpoint_untaken`` holds steps only (``kind = 'step'`` in its condition), so a take,
whose guards never name the kind, cannot be planned on it: without statistics on a fresh fan's
rows, the planner read the whole index (every untaken member of the fan) for each take.

On PostgreSQL the new index is built CONCURRENTLY beside the old one, which is then dropped and
the new one renamed: a table of millions of checkpoints keeps taking writes meanwhile (hence a
non-atomic migration). Other databases rebuild it in place."""

from django.db import migrations, models

NAME = "durable_checkpoint_untaken"
FIELDS = ["queue", "enqueued_at"]
BEFORE = models.Q(status="pending", started_at__isnull=True, enqueued_at__isnull=False)
AFTER = models.Q(status="pending", started_at__isnull=True, enqueued_at__isnull=False, kind="step")


def _swap(condition: models.Q):
    def swap(apps, schema_editor):
        model = apps.get_model("durable", "Checkpoint")
        old = next(index for index in model._meta.indexes if index.name == NAME)
        new = models.Index(fields=FIELDS, name=NAME, condition=condition)
        if schema_editor.connection.vendor != "postgresql":
            schema_editor.remove_index(model, old)
            schema_editor.add_index(model, new)
            return
        building = models.Index(fields=FIELDS, name=f"{NAME}_new", condition=condition)
        quote = schema_editor.quote_name
        sql = str(building.create_sql(model, schema_editor)).replace(
            "CREATE INDEX", "CREATE INDEX CONCURRENTLY", 1
        )
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {quote(building.name)}")  # a try cut short
        schema_editor.execute(sql)
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {quote(NAME)}")
        schema_editor.execute(f"ALTER INDEX {quote(building.name)} RENAME TO {quote(NAME)}")

    return swap


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("durable", "0026_lean_offload_index"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveIndex(model_name="checkpoint", name=NAME),
                migrations.AddIndex(
                    model_name="checkpoint", index=models.Index(fields=FIELDS, name=NAME, condition=AFTER)
                ),
            ],
            database_operations=[migrations.RunPython(_swap(AFTER), _swap(BEFORE))],
        ),
    ]
