"""The schedule row is ``CronSchedule`` (``durable.Schedule`` is the declaration in code). Its
table keeps its name; the admin permissions granted on it follow the new model name."""

from django.db import migrations

ACTIONS = ("add", "change", "delete", "view")


def _rename_permissions(apps, schema_editor, old, new):
    try:
        content_types = apps.get_model("contenttypes", "ContentType")
        permissions = apps.get_model("auth", "Permission")
    except LookupError:  # a project without django.contrib.auth has no grants to keep
        return
    db = schema_editor.connection.alias
    # Before or after contenttypes renamed the content type itself, whichever ran first.
    for content_type in content_types.objects.using(db).filter(app_label="durable", model__in=[old, new]):
        rows = permissions.objects.using(db).filter(content_type=content_type)
        for action in ACTIONS:
            if not rows.filter(codename=f"{action}_{new}").exists():
                rows.filter(codename=f"{action}_{old}").update(codename=f"{action}_{new}")


def keep_permissions(apps, schema_editor):
    _rename_permissions(apps, schema_editor, "schedule", "cronschedule")


def restore_permissions(apps, schema_editor):
    _rename_permissions(apps, schema_editor, "cronschedule", "schedule")


class Migration(migrations.Migration):
    dependencies = [("durable", "0009_attempt_holds")]

    operations = [
        # Pin the table's name first, so that the rename below leaves the table as it is.
        migrations.AlterModelTable(name="schedule", table="durable_schedule"),
        # A top-level RenameModel: Django's contenttypes renames the content type after it.
        migrations.RenameModel(old_name="Schedule", new_name="CronSchedule"),
        migrations.AlterModelOptions(
            name="cronschedule", options={"verbose_name": "schedule", "verbose_name_plural": "schedules"}
        ),
        migrations.RunPython(keep_permissions, restore_permissions),
    ]
