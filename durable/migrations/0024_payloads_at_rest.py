"""Payloads at rest: the ``view_payloads`` permission, and the plain column that says a position
is a Celery task used as a step (its input, which also says so, may be encoded from now on)."""

from django.db import migrations, models


def mark_tasks(apps, schema_editor):
    # Only the attempts still in flight are asked about by the orphan sweep; rows written before
    # this migration hold plain JSON, so the lookup inside the input still works here.
    Checkpoint = apps.get_model("durable", "Checkpoint")
    db = schema_editor.connection.alias
    Checkpoint.objects.using(db).filter(kind="step", status="pending", input__has_key="task").update(
        task=True
    )


class Migration(migrations.Migration):
    dependencies = [
        ("durable", "0023_partial_indexes"),
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
                    ("view_payloads", "Can see the payloads of runs, steps, messages and entities"),
                ]
            },
        ),
        migrations.AddField(
            model_name="checkpoint",
            name="task",
            field=models.BooleanField(default=False),
        ),
        migrations.RunPython(mark_tasks, migrations.RunPython.noop),
    ]
