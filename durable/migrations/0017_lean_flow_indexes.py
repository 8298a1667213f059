"""The flow gates' text key got PostgreSQL's unused ``_like`` twin (see ``_pattern_indexes``)."""

from django.db import migrations

from ._pattern_indexes import drop_pattern_indexes


class Migration(migrations.Migration):
    dependencies = [("durable", "0016_run_end_notices")]

    operations = [migrations.RunPython(drop_pattern_indexes, migrations.RunPython.noop)]
