"""The pure parts of remote turns: where their turns are claimed, and the history as JSON."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import jsonschema
import pytest

from durable import protocol, routing
from durable.replay import wire
from durable.replay.history import Limits, Record


def test_a_remote_queues_turns_are_claimed_on_the_default_queue_of_their_namespace():
    remote = {"edge", "gpu.big"}
    assert routing.turn_queue("edge", remote, "durable") == "durable"
    assert routing.turn_queue("edge.tenant-a", remote, "durable") == "durable.tenant-a"
    assert routing.turn_queue("gpu.big.t1", remote, "durable") == "durable.t1"
    assert routing.turn_queue("edges", remote, "durable") == "edges"
    assert routing.turn_queue("durable.tenant-a", remote, "durable") == "durable.tenant-a"


def test_a_record_survives_the_trip_through_json():
    at = datetime(2026, 1, 2, 3, 4, 5, 6000, tzinfo=UTC)
    rec = Record(
        3,
        "step",
        "shop.charge",
        attempt=2,
        input={"args": [1], "kwargs": {}},
        enqueued_at=at,
        wake_at=at + timedelta(seconds=30),
        token="t",
        stored_as=("pending", 1),
        dirty=True,
        failures=[{"attempt": 1, "error": {"message": "x"}, "traceback": None, "at": at}],
    )
    assert wire.record_in(json.loads(json.dumps(wire.record_out(rec)))) == rec


def test_limits_survive_the_trip_through_json():
    limits = Limits(
        reconcile_interval=timedelta(minutes=5),
        redispatch_after=timedelta(seconds=90),
        timeout_grace=timedelta(seconds=5),
        heartbeat_throttle=timedelta(seconds=10),
        default_queue="durable",
        max_payload_bytes=1000,
        remote_queues=frozenset({"gpu"}),
        redispatch_limit=4,
    )
    assert wire.limits_in(json.loads(json.dumps(wire.limits_out(limits)))) == limits


@pytest.mark.parametrize("name", ["record", "turn", "decision", "turn_heartbeat"])
def test_the_remote_turn_schemas_are_valid_json_schemas(name):
    jsonschema.Draft202012Validator.check_schema(protocol.schema(name))
