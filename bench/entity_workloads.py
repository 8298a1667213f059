"""The entity the entity benchmark sends ops to (imported by its worker with ``--include``)."""

import durable


@durable.entity("bench.counter")
class Counter:
    def initial_state(self) -> dict:
        return {"n": 0}

    def add(self, state: dict, k: int) -> int:
        state["n"] += k
        return state["n"]
