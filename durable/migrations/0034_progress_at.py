"""When the worker sent the beat whose progress a position keeps (beats sent as messages), so an
older beat taken later by another process does not overwrite a newer one's progress.

Nullable without a default: adding it rewrites no row."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("durable", "0033_streams")]

    operations = [
        migrations.AddField(
            model_name="checkpoint",
            name="progress_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
