from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("durable", "0014_entities"),
    ]

    operations = [
        migrations.CreateModel(
            name="FlowGate",
            fields=[
                ("key", models.CharField(max_length=255, primary_key=True, serialize=False)),
                ("next_seq", models.BigIntegerField(default=0)),
                ("waiting", models.BigIntegerField(default=0)),
            ],
        ),
        migrations.CreateModel(
            name="FlowStart",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("key", models.CharField(max_length=255)),
                ("at", models.DateTimeField()),
            ],
        ),
        migrations.AddField(
            model_name="checkpoint",
            name="flow",
            field=models.CharField(blank=True, max_length=16, null=True),
        ),
        migrations.AddField(
            model_name="checkpoint",
            name="flow_key",
            field=models.CharField(blank=True, max_length=255, null=True),
        ),
        migrations.AddField(
            model_name="checkpoint",
            name="flow_seq",
            field=models.BigIntegerField(blank=True, null=True),
        ),
        migrations.AddIndex(
            model_name="checkpoint",
            index=models.Index(
                condition=models.Q(("flow__isnull", False)),
                fields=["flow_key", "flow", "flow_seq"],
                name="durable_checkpoint_flow",
            ),
        ),
        migrations.AddIndex(
            model_name="flowstart",
            index=models.Index(fields=["key", "at"], name="durable_flowstart_window"),
        ),
    ]
