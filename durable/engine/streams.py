"""Streams written by runs and read while they run (``models.streams``): the body's writes go
with the turn's write of their positions, a step's writes each in a transaction of its own, and
readers follow a stream by position until it is closed or its run ends."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from .. import clock, conf
from ..errors import InvalidInput, WaitTimeout
from ..models import TERMINAL, Run, StreamHead, StreamValue
from ..models.streams import CLOSED
from ..replay.history import Record
from ..replay.stepscope import next_write
from ..replay.streams import CLOSE
from ..values import decode

#: Values one read takes at most.
BATCH = 500
#: How long a reader waits between looks at a stream with nothing new: from the first, doubling
#: up to the last while nothing comes.
FIRST_PAUSE, LAST_PAUSE = 0.01, 0.5


def write_from_run(run_id: str, written: list[Record], db: str) -> None:
    """Append what the body wrote (or close what it closed: ``TurnState.new_stream_writes``), in
    the transaction that records those positions."""
    if not written:
        return  # most turns: nothing more on their path than this look
    heads = StreamHead.objects.using(db)
    now = clock.now()
    for rec in written:
        if rec.kind == CLOSE:
            heads.close(run_id, rec.name)
        else:
            heads.append(run_id, rec.name, rec.output, seq=rec.seq, attempt=0, index=0, now=now)


def write_from_step(key: str, stored: Any) -> None:
    """Append ``stored`` to the stream ``key`` of the run whose step attempt is running here."""
    info, index = next_write()
    settings = conf.get()
    heads = StreamHead.objects.using(settings.DATABASE)
    # ALREADY: this very write was stored by a try whose commit answer was lost.
    found = heads.append(
        info.run_id, key, stored, seq=info.seq, attempt=info.attempt, index=index, now=clock.now()
    )
    if found == CLOSED:
        raise InvalidInput(
            f"stream {key!r} of run {info.run_id} is closed: nothing more can be written to it"
        )


class Follower:
    """Where a reader is in a stream, and how long it waits before its next look."""

    def __init__(self, run_id: str, key: str, timeout: float | None) -> None:
        self.run_id, self.key, self.timeout = run_id, key, timeout
        self.position, self.pause, self.since = 0, FIRST_PAUSE, time.monotonic()

    def look(self) -> tuple[list[Any], bool]:
        """The next values (a batch), and whether the stream is over with nothing left."""
        batch, self.position, over = look(self.run_id, self.key, self.position)
        if batch:
            self.pause, self.since = FIRST_PAUSE, time.monotonic()
        return batch, over

    def wait(self) -> float:
        """Seconds to wait before the next look; ``WaitTimeout`` once none came for ``timeout``."""
        pause, self.pause = self.pause, min(self.pause * 2, LAST_PAUSE)
        if self.timeout is None:
            return pause
        left = self.since + self.timeout - time.monotonic()
        if left <= 0:
            raise WaitTimeout(
                f"no value came on stream {self.key!r} of run {self.run_id} for {self.timeout} s"
            )
        return min(pause, left)


def read(run_id: str, key: str, timeout: float | None) -> Iterator[Any]:
    """The stream's values in order, waiting for more until it is closed or the run ended;
    ``WaitTimeout`` when none came for ``timeout`` seconds."""
    follower = Follower(run_id, key, timeout)
    while True:
        batch, over = follower.look()
        yield from batch
        if over:
            return
        if not batch:
            time.sleep(follower.wait())


def look(run_id: str, key: str, position: int) -> tuple[list[Any], int, bool]:
    """The values from ``position`` on (a batch), the position after them, and whether the
    stream is over (closed, or its run ended) with nothing left past them."""
    db = conf.get().DATABASE
    # Read before the values: whatever was written before the close or the end is then read.
    closed = StreamHead.objects.using(db).filter(run_id=run_id, key=key, closed=True).exists()
    ended = closed or Run.objects.using(db).filter(id=run_id, status__in=TERMINAL).exists()
    rows = list(
        StreamValue.objects.using(db)
        .filter(run_id=run_id, key=key, position__gte=position)
        .order_by("position")
        .values_list("position", "value")[:BATCH]
    )
    if rows:
        return [decode(value) for _, value in rows], rows[-1][0] + 1, False
    return [], position, ended
