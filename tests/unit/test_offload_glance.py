"""The glance that spares small payloads an encoding before they are written: it may answer
"not sure" for a small one (json.dumps then decides), never "within" for one past the limit."""

from __future__ import annotations

import json
import random

import pytest

from durable.models.payloads import _surely_within


def _size(value: object) -> int:
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())


def _value(rng: random.Random, depth: int = 0) -> object:
    pick = rng.randrange(8 if depth < 3 else 5)
    if pick == 0:
        return rng.choice([None, True, False, 0.1 + rng.random() * 1e300, -1e-300])
    if pick == 1:
        return rng.choice([0, -1, 2 ** rng.randrange(200), -(2 ** rng.randrange(200))])
    if pick in (2, 3, 4):
        return "".join(rng.choice('a\x01"\\é€𝄞\n') for _ in range(rng.randrange(40)))
    if pick == 5:
        return [_value(rng, depth + 1) for _ in range(rng.randrange(6))]
    return {str(_value(rng, 3)): _value(rng, depth + 1) for _ in range(rng.randrange(6))}


@pytest.mark.parametrize("seed", range(20))
def test_within_is_never_said_of_a_payload_past_the_limit(seed):
    rng = random.Random(seed)
    for _ in range(500):
        value = _value(rng)
        size = _size(value)
        for limit in (size - 1, size // 2, 8):
            if limit >= 0 and size > limit:
                assert not _surely_within(value, limit), (value, limit)


def test_the_values_nearly_every_write_holds_are_told_at_a_glance():
    for value in (7, "done", None, 3.5, {"args": [1], "kwargs": {}}, [1, 2, 3], {"total": "12.34"}):
        assert _surely_within(value, 1024)
    assert not _surely_within(list(range(100)), 10**9)  # more parts than a glance: dumps decides
    assert not _surely_within(object(), 10**9)
