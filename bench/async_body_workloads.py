"""What ``bench/async_bodies.py`` runs: the ten-local-step family (``bench.local10``) written as an
``async def`` body, step for step."""

from __future__ import annotations

import durable
from bench.workloads import STEPS, noop_local

ALOCAL10 = "bench.alocal10"


@durable.workflow(name=ALOCAL10)
async def alocal10(ctx: durable.Context, _input: object) -> int:
    return sum([await ctx.step(noop_local, i) for i in range(STEPS)])
