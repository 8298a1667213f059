"""The ids durable gives the runs it starts: time-ordered UUIDs (version 7 of RFC 9562), as 32
hexadecimal digits, like the ``uuid4().hex`` they replace.

A run started later gets a larger id: to the millisecond across processes, and to a quarter of a
microsecond within one (the twelve bits after the version carry the fraction of the millisecond,
the RFC's third method), as long as the clock does not step back; an id out of order costs only
that locality and the order of runs due at the same instant, never correctness. Runs started
together then sit together: the primary key grows at its right edge rather than at random pages of
an index of millions, and a sweep that takes the runs due at one instant in id order takes them
oldest first, in the order their rows were written.

The id shows when its run started. A caller who wants an id that shows nothing passes its own
``run_id`` to ``durable.start()``.
"""

from __future__ import annotations

import os
import time

_VERSION = 0x7
_VARIANT = 0b10  # RFC 9562's variant: the two bits after the sub-millisecond fraction


def run_id(now_ns: int | None = None) -> str:
    """A new run id for the instant ``now_ns`` (nanoseconds since the epoch; now by default)."""
    ms, rest = divmod(time.time_ns() if now_ns is None else now_ns, 1_000_000)
    fraction = rest * 4096 // 1_000_000
    random_bits = int.from_bytes(os.urandom(8), "big") >> 2
    value = (ms << 80) | (_VERSION << 76) | (fraction << 64) | (_VARIANT << 62) | random_bits
    return f"{value:032x}"
