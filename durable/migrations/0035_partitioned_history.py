"""On PostgreSQL, the run and checkpoint tables become tables partitioned by ranges of run id:
a day's runs and positions in a pair of partitions of their own, which retention drops whole
(``durable.models.partitions``; how the tables are converted in place, and back, in
``_partitioned_history``). Other databases keep plain tables.

A run table partitioned by id cannot hold a unique index without the id, so the index that let one
run gather a debounce key's calls goes: calls for one key take turns under an advisory lock
instead (``durable.models.debounced``).

Non-atomic: the checkpoint table's new key is built CONCURRENTLY first; the conversion itself is
one short transaction under an exclusive lock (catalogue changes, and a scan of the runs for their
keys to their parents), the other tables' keys to runs are validated after it without stopping
writes."""

from datetime import UTC, datetime

from django.db import migrations

from ._partitioned_history import partition, unpartition


def _days_ahead(apps, schema_editor):
    from ..models import partitions

    db = schema_editor.connection.alias
    if not partitions.is_partitioned(db):
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(f"SELECT EXISTS (SELECT FROM {partitions.RUNS})")
        empty = not cursor.fetchone()[0]
    # An empty history (a new install) is partitioned from today on; a filled one from tomorrow.
    partitions.ensure_ahead(db, datetime.now(UTC), today=empty)


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("durable", "0034_progress_at")]

    operations = [
        migrations.RemoveConstraint(model_name="run", name="durable_run_one_debounce"),
        migrations.RunPython(partition, unpartition),
        migrations.RunPython(_days_ahead, migrations.RunPython.noop),
    ]
