"""``ctx.upsert_search_attributes``: merged into the run row, checked by the workflow's schema."""

from __future__ import annotations

import pytest

import durable
from durable.models import Run

pytestmark = pytest.mark.django_db


@durable.step(local=True)
def noop():
    return None


@durable.workflow(
    name="tests.search_order", search_attributes_schema={"customer": str, "cents": (int, float)}
)
def order(ctx, customer):
    ctx.upsert_search_attributes({"customer": customer})
    ctx.step(noop)  # a local step flushes mid-turn: the upsert must still reach the run row
    ctx.upsert_search_attributes({"cents": 500})
    ctx.wait_for_signal("go")
    ctx.upsert_search_attributes({"cents": None})
    return "done"


@durable.workflow(name="tests.search_free")
def free(ctx, value):
    ctx.upsert_search_attributes({"anything": value})


@durable.workflow(name="tests.search_wrong", search_attributes_schema={"cents": int})
def wrong(ctx, value):
    ctx.upsert_search_attributes(value)


def test_upserts_merge_into_the_run_and_are_queried_with_the_orm(durable_env):
    run = durable.start(order, "acme")
    durable.start(order, "other")
    durable_env.run_until_idle()
    assert durable.get_run(run.id).search_attributes == {"customer": "acme", "cents": 500}
    assert list(Run.objects.filter(search_attributes__customer="acme").values_list("id", flat=True)) == [
        run.id
    ]
    durable.signal(run.id, "go")
    durable_env.run_until_idle()
    # Replays do not apply an upsert twice; a None removes the attribute.
    assert durable.get_run(run.id).search_attributes == {"customer": "acme"}
    assert durable.result(run.id) == "done"


def test_without_a_schema_any_json_goes(durable_env):
    run = durable.start(free, [1, {"a": 2}])
    durable_env.run_until_idle()
    assert durable.get_run(run.id).search_attributes == {"anything": [1, {"a": 2}]}


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ({"cents": "5"}, "must be int"),
        ({"cents": True}, "must be int"),
        ({"who": 1}, "not in"),
        ([1], "a dict"),
    ],
)
def test_attributes_the_schema_refuses_fail_the_run(durable_env, value, says):
    run = durable.start(wrong, value)
    durable_env.run_until_idle()
    error = durable.get_run(run.id).error
    assert error["type"] == "InvalidInput" and says in error["message"]
    assert durable.get_run(run.id).search_attributes == {}


def test_a_schema_must_map_names_to_json_scalar_types():
    with pytest.raises(durable.InvalidInput, match="search_attributes_schema maps"):
        durable.workflow(
            lambda ctx, _: None, name="tests.search_bad", search_attributes_schema={"when": list}
        )


def test_start_sets_the_first_search_attributes_and_upserts_merge_into_them(durable_env):
    run = durable.start(order, "acme", search_attributes={"cents": 120, "customer": None})
    assert durable.get_run(run.id).search_attributes == {"cents": 120}
    durable_env.run_until_idle()
    assert durable.get_run(run.id).search_attributes == {"customer": "acme", "cents": 500}


@pytest.mark.parametrize(
    ("attributes", "problem"),
    [
        ({"cents": "a lot"}, "must be int or float"),
        ({"colour": "red"}, "not in tests.search_order's search_attributes_schema"),
        (["customer"], "a dict of names to values"),
    ],
)
def test_start_refuses_search_attributes_the_schema_refuses_before_storing(durable_env, attributes, problem):
    with pytest.raises(durable.InvalidInput, match=problem):
        durable.start(order, "acme", search_attributes=attributes)
    assert not Run.objects.exists()
    assert durable_env.pending() == []


def test_start_of_an_existing_run_id_keeps_its_search_attributes(durable_env):
    durable.start(free, 1, run_id="tests-search-same", search_attributes={"first": 1})
    durable.start(free, 1, run_id="tests-search-same", search_attributes={"second": 2})
    assert durable.get_run("tests-search-same").search_attributes == {"first": 1}
