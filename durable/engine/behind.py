"""The turns waiting behind the one running, in the same ``durable.advance_batch`` message.

The turns of a batch run one after the other in one process, and a turn that runs an attempt's
body in place holds that process for as long as the body runs: a run started in the same loop
as a ten-step workflow's would wait for all ten. So, just before a body runs in place, the turns
still behind it leave in messages of their own (``wake_batches``), for any free process to take.
A batch of short turns still costs one message; a long one never makes the runs behind it wait.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

log = logging.getLogger("durable.engine")

_rest: ContextVar[Callable[[], None] | None] = ContextVar("durable_turns_behind", default=None)


@contextmanager
def waiting(hand_over: Callable[[], None] | None) -> Iterator[None]:
    """While the turn in this block runs, ``hand_over`` sends the turns behind it away (None:
    none wait)."""
    token = _rest.set(hand_over)
    try:
        yield
    finally:
        _rest.reset(token)


def let_go() -> None:
    """An attempt's body is about to run inside this turn: send the turns behind it away, once.

    A failure to send is logged, not raised: the attempt is already written as started here, and
    the turns behind it then run after it, as they did before, rather than the attempt being lost.
    """
    hand_over = _rest.get()
    if hand_over is None:
        return
    _rest.set(None)
    try:
        hand_over()
    except Exception:  # noqa: BLE001 - the step must still run; the rest runs after it instead
        log.warning("durable: the turns behind this one stay in its batch", exc_info=True)
