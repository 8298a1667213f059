"""A run keeps where it was forked from (``durable.fork``): the origin's id, indexed for the
origin's page, and the position; and the permission to fork from the admin.

The new columns are nullable without a default: adding them rewrites no row. On PostgreSQL their
index (partial: only forks are in it) is built CONCURRENTLY, so a table of millions of runs keeps
taking writes meanwhile (hence a non-atomic migration). Other databases build it in place."""

from django.db import migrations, models

INDEX = models.Index(
    fields=["forked_from_id"], name="durable_run_forked", condition=models.Q(forked_from_id__isnull=False)
)


def _add_index(apps, schema_editor):
    model = apps.get_model("durable", "Run")
    if schema_editor.connection.vendor != "postgresql":
        schema_editor.add_index(model, INDEX)
        return
    sql = str(INDEX.create_sql(model, schema_editor)).replace("CREATE INDEX", "CREATE INDEX CONCURRENTLY", 1)
    # A try cut short leaves an invalid index of that name: dropped first.
    schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {schema_editor.quote_name(INDEX.name)}")
    schema_editor.execute(sql)


def _remove_index(apps, schema_editor):
    model = apps.get_model("durable", "Run")
    if schema_editor.connection.vendor != "postgresql":
        schema_editor.remove_index(model, INDEX)
        return
    schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {schema_editor.quote_name(INDEX.name)}")


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("durable", "0028_fans"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="run",
            options={
                "permissions": [
                    ("retry_run", "Can retry a failed, dead or cancelled run"),
                    ("cancel_run", "Can cancel a run, with or without compensation"),
                    ("signal_run", "Can send a signal or an update to a run"),
                    ("resume_run", "Can wake a waiting run now"),
                    ("fork_run", "Can fork a run from one of its positions"),
                    ("view_payloads", "Can see the payloads of runs, steps, messages and entities"),
                ]
            },
        ),
        migrations.AddField(
            model_name="run",
            name="forked_at",
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="run",
            name="forked_from_id",
            field=models.CharField(blank=True, max_length=255, null=True),
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.AddIndex(model_name="run", index=INDEX)],
            database_operations=[migrations.RunPython(_add_index, _remove_index)],
        ),
    ]
