"""A run keeps the key of the ``durable.debounce`` calls it gathers, with two partial indexes
(only debounced runs waiting to start are in them): one the timer pass reads for the runs whose
start is due, one that lets a single run gather a key's calls at a time.

The new column is nullable without a default: adding it rewrites no row. On PostgreSQL both
indexes are built CONCURRENTLY, so a table of millions of runs keeps taking writes meanwhile
(hence a non-atomic migration). Other databases build them in place."""

from django.db import migrations, models

WAITING = {"debounce_key__isnull": False, "admitted": False}
INDEX = models.Index(fields=["wake_at"], name="durable_run_debouncing", condition=models.Q(**WAITING))
CONSTRAINT = models.UniqueConstraint(
    fields=["namespace", "workflow", "debounce_key"],
    name="durable_run_one_debounce",
    condition=models.Q(**WAITING, status="pending"),
)


def _add(apps, schema_editor):
    model = apps.get_model("durable", "Run")
    if schema_editor.connection.vendor != "postgresql":
        schema_editor.add_index(model, INDEX)
        schema_editor.add_constraint(model, CONSTRAINT)
        return
    for made in (INDEX, CONSTRAINT):
        sql = str(made.create_sql(model, schema_editor))
        sql = sql.replace("CREATE INDEX", "CREATE INDEX CONCURRENTLY", 1)
        sql = sql.replace("CREATE UNIQUE INDEX", "CREATE UNIQUE INDEX CONCURRENTLY", 1)
        # A try cut short leaves an invalid index of that name: dropped first.
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {schema_editor.quote_name(made.name)}")
        schema_editor.execute(sql)


def _remove(apps, schema_editor):
    model = apps.get_model("durable", "Run")
    if schema_editor.connection.vendor != "postgresql":
        schema_editor.remove_constraint(model, CONSTRAINT)
        schema_editor.remove_index(model, INDEX)
        return
    for made in (CONSTRAINT, INDEX):
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {schema_editor.quote_name(made.name)}")


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("durable", "0030_on_parent_close")]

    operations = [
        migrations.AddField(
            model_name="run",
            name="debounce_key",
            field=models.CharField(blank=True, max_length=200, null=True),
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddIndex(model_name="run", index=INDEX),
                migrations.AddConstraint(model_name="run", constraint=CONSTRAINT),
            ],
            database_operations=[migrations.RunPython(_add, _remove)],
        ),
    ]
