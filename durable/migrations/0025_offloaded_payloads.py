"""Large payloads (claim check): the row that accounts for each object a payload column refers to
in OFFLOAD_STORAGE, so deleting runs deletes their objects and a rolled-back write leaks none."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("durable", "0024_payloads_at_rest"),
    ]

    operations = [
        migrations.CreateModel(
            name="OffloadedPayload",
            fields=[
                ("name", models.CharField(max_length=100, primary_key=True, serialize=False)),
                ("created_at", models.DateTimeField()),
                ("released", models.BooleanField(default=False)),
            ],
            options={
                "indexes": [
                    models.Index(
                        condition=models.Q(("released", True)),
                        fields=["name"],
                        name="durable_offload_released",
                    )
                ],
            },
        ),
    ]
