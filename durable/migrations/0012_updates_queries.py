from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("durable", "0011_namespaces")]

    operations = [
        migrations.AddField(
            model_name="run",
            name="exposed",
            field=models.JSONField(blank=True, default=dict),
        ),
        migrations.AddField(
            model_name="signal",
            name="is_update",
            field=models.BooleanField(default=False),
        ),
        migrations.AddField(
            model_name="signal",
            name="idempotency_key",
            field=models.CharField(blank=True, max_length=255, null=True),
        ),
        migrations.AddField(
            model_name="signal",
            name="reply",
            field=models.JSONField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="signal",
            name="replied_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddConstraint(
            model_name="signal",
            constraint=models.UniqueConstraint(
                condition=models.Q(("idempotency_key__isnull", False)),
                fields=("run", "idempotency_key"),
                name="durable_signal_idempotency",
            ),
        ),
    ]
