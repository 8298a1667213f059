"""Runs waiting in a line (a lane's, a singleton's) are admitted by ``priority``, then start
order; a lane's key keeps the lane's concurrency on its slot row.

``priority`` has a database default of 0: adding it rewrites no row on PostgreSQL (a default
kept in the catalogue), and every insert that names no priority gets 0. The slot's ``limit`` is
nullable without a default."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("durable", "0031_debounce")]

    operations = [
        migrations.AddField(
            model_name="run",
            name="priority",
            field=models.IntegerField(db_default=0, default=0),
        ),
        migrations.AddField(
            model_name="singletonslot",
            name="limit",
            field=models.IntegerField(blank=True, null=True),
        ),
    ]
