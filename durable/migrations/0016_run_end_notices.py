"""PostgreSQL announces every run's end: a trigger sends ``NOTIFY durable_run_ended, '<run id>'``
in the transaction that makes a run terminal (delivered when it commits), which wakes the callers
of ``durable.result()`` waiting for it. A trigger, not a statement of the engine's: no round trip
more per run, and no path that ends a run can forget it. Other databases: nothing (callers poll)."""

from django.db import migrations

CREATE = """
CREATE OR REPLACE FUNCTION durable_announce_run_end() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('durable_run_ended', NEW.id);
    RETURN NULL;
END
$$;
CREATE TRIGGER durable_run_ended AFTER UPDATE OF status ON durable_run FOR EACH ROW
WHEN (NEW.status IN ('completed', 'failed', 'cancelled', 'dead') AND OLD.status IS DISTINCT FROM NEW.status)
EXECUTE FUNCTION durable_announce_run_end();
"""

DROP = """
DROP TRIGGER IF EXISTS durable_run_ended ON durable_run;
DROP FUNCTION IF EXISTS durable_announce_run_end();
"""


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE)


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP)


class Migration(migrations.Migration):
    dependencies = [("durable", "0015_flow_control")]

    operations = [migrations.RunPython(create, drop)]
