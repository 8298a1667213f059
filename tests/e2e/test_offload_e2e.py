"""Large payloads end to end: a step on a real ``celery worker`` returns about 5 MB; the worker
writes it to OFFLOAD_STORAGE (the example project's folder under its VAR_DIR, which this process
shares), the rows keep references under 1 KB, and the caller reads the value back equal."""

from __future__ import annotations

import json

import pytest
from django.db import connection

import durable

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

SIZE = 5 * 1024 * 1024
#: Above the 5 MB value, in the worker (which checks the step's result) as in this process.
MAX_PAYLOAD_BYTES = 8 * 1024 * 1024


@pytest.fixture
def durable_worker_options():
    return {"env": {"DURABLE_MAX_PAYLOAD_BYTES": str(MAX_PAYLOAD_BYTES)}}


@durable.step(name="tests.e2e_offload.produce", retry=durable.Retry(max_attempts=1))
def produce(size):
    return "claim-check:" + "x" * size


@durable.workflow(name="tests.e2e_offload.flow")
def flow(ctx, size):
    return ctx.step(produce, size)


def raw_length(sql: str, run_id: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(sql, [run_id])
        (value,) = cursor.fetchone()
    return len(value if isinstance(value, str) else json.dumps(value))  # psycopg parses jsonb


def test_a_5_mb_step_result_crosses_a_real_worker_with_rows_under_1_kb(durable_worker, settings):
    settings.DURABLE = {**settings.DURABLE, "MAX_PAYLOAD_BYTES": MAX_PAYLOAD_BYTES}
    run = durable.start(flow, SIZE)
    assert durable.result(run.id, timeout="120s") == "claim-check:" + "x" * SIZE
    step = "SELECT output FROM durable_checkpoint WHERE run_id = %s AND kind = 'step'"
    assert raw_length(step, run.id) < 1024
    assert raw_length("SELECT output FROM durable_run WHERE id = %s", run.id) < 1024
    durable.delete_run(run.id)
