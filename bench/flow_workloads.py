"""What the flow-control benchmark runs, importable by the worker
(``--include bench.workloads,bench.flow_workloads``).

Twins that differ only by a ``concurrency`` limit set far above anything the run reaches, so the
ratio of their times is the cost of the limit's bookkeeping (a gate locked and counted at each
start, the slot handed on at each end), not of waiting for a slot. A third twin takes the limit
from a lane shared by two steps (alternating in sequence, half and half in the fan): one gate for
both, as two workflows sharing a lane would have.
"""

from __future__ import annotations

import durable

STEPS = 10
NEVER_REACHED = 100_000


@durable.step(name="bench.flow_free", timeout="1h")
def free(i: int) -> int:
    """A no-op step (run in place on a worker of its queue, its timeout enforced there)."""
    return i


@durable.step(name="bench.flow_limited", timeout="1h", concurrency=NEVER_REACHED)
def limited(i: int) -> int:
    """The same step under a concurrency limit it never reaches."""
    return i


@durable.workflow(name="bench.flow_seq_free")
def seq_free(ctx: durable.Context, _input: object) -> int:
    return sum(ctx.step(free, i) for i in range(STEPS))


@durable.workflow(name="bench.flow_seq_limited")
def seq_limited(ctx: durable.Context, _input: object) -> int:
    return sum(ctx.step(limited, i) for i in range(STEPS))


@durable.workflow(name="bench.flow_fan_free")
def fan_free(ctx: durable.Context, n: int) -> int:
    return sum(ctx.map(free, range(n)))


@durable.workflow(name="bench.flow_fan_limited")
def fan_limited(ctx: durable.Context, n: int) -> int:
    return sum(ctx.map(limited, range(n)))


#: A lane shared by two steps, never reached either.
LANE = durable.Lane("bench.flow_lane", concurrency=NEVER_REACHED)


@durable.step(name="bench.flow_lane_a", timeout="1h", lane=LANE)
def lane_a(i: int) -> int:
    return i


@durable.step(name="bench.flow_lane_b", timeout="1h", lane=LANE)
def lane_b(i: int) -> int:
    return i


@durable.workflow(name="bench.flow_seq_lane")
def seq_lane(ctx: durable.Context, _input: object) -> int:
    return sum(ctx.step(lane_a if i % 2 else lane_b, i) for i in range(STEPS))


@durable.workflow(name="bench.flow_fan_lane")
def fan_lane(ctx: durable.Context, n: int) -> int:
    return sum(ctx.all([ctx.defer(lane_a if i % 2 else lane_b, i) for i in range(n)]))
