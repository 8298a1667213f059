"""Drop the PostgreSQL ``_like`` twin of OffloadedPayload's name key (looked up by equality only).
A migration of its own: the twin is created by the deferred SQL that runs once 0025 ends."""

from django.db import migrations

from ._pattern_indexes import drop_pattern_indexes


class Migration(migrations.Migration):
    dependencies = [
        ("durable", "0025_offloaded_payloads"),
    ]

    operations = [migrations.RunPython(drop_pattern_indexes, migrations.RunPython.noop)]
