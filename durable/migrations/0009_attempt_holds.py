from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("durable", "0008_singletons")]

    operations = [
        migrations.AddField(
            model_name="checkpoint",
            name="token",
            field=models.CharField(blank=True, max_length=64, null=True),
        ),
        migrations.AddField(
            model_name="checkpoint",
            name="held_by",
            field=models.CharField(blank=True, max_length=255, null=True),
        ),
        migrations.AddField(
            model_name="checkpoint",
            name="held_until",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddIndex(
            model_name="checkpoint",
            index=models.Index(
                condition=models.Q(("held_by__isnull", False)),
                fields=["held_until"],
                name="durable_checkpoint_held",
            ),
        ),
    ]
