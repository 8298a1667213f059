"""What the streams benchmark runs on the worker (``--include bench.workloads,bench.stream_workloads``):
one step that writes ``n`` values to its run's stream, then the body closes it."""

from __future__ import annotations

import durable

KEY = "values"


@durable.step(name="bench.stream_produce", timeout="1h")
def produce(n: int) -> int:
    for i in range(n):
        durable.write_stream(KEY, i)
    return n


@durable.workflow(name="bench.stream_flow")
def stream_flow(ctx: durable.Context, n: int) -> int:
    written = ctx.step(produce, n)
    ctx.close_stream(KEY)
    return written
