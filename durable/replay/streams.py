"""``ctx.write_stream`` and ``ctx.close_stream``: values a body hands to its stream readers.

Each is a position, recorded once: the engine appends the value to the stream (or closes it) in
the transaction that records the position, so a replay finds the position and appends nothing.
A write after the body closed the stream is refused, as it would be on every replay.
"""

from __future__ import annotations

from typing import Any

from ..errors import InvalidInput
from ..values import stored
from .history import COMPLETED, STREAM_CLOSE, STREAM_WRITE
from .positions import Positions

#: Kinds of the positions that write to and close a stream (named by the stream's key).
WRITE, CLOSE = STREAM_WRITE, STREAM_CLOSE
#: The longest stream key (its column).
KEY_LENGTH = 200


def checked_key(key: Any, what: str) -> str:
    if not isinstance(key, str) or not key or len(key) > KEY_LENGTH:
        raise InvalidInput(f"{what} needs a stream key of 1 to {KEY_LENGTH} characters, got {key!r:.100}")
    return key


class Streams(Positions):
    """Mixed into ``Context``."""

    def write_stream(self, key: str, value: Any) -> None:
        """Append ``value`` (JSON, or a type durable converts) to this run's stream ``key``, for
        ``durable.read_stream(run_id, key)``; once, however often the body is replayed."""
        checked_key(key, "ctx.write_stream()")
        shown = stored(
            value, what=f"the value written to stream {key!r}", max_bytes=self._limits.max_payload_bytes
        )
        if self._position(WRITE, key) is not None:
            return
        if key in self._turn.closed_streams:
            raise InvalidInput(f"stream {key!r} was closed by this run: nothing more can be written to it")
        rec = self._new(WRITE, key, status=COMPLETED, output=shown)
        rec.finished_at = self._now()

    def close_stream(self, key: str) -> None:
        """End the stream ``key``: its readers stop once they have read every value."""
        checked_key(key, "ctx.close_stream()")
        # A new write comes after every recorded position, so the closes replayed before it are
        # all that can refuse it.
        self._turn.closed_streams.add(key)
        if self._position(CLOSE, key) is not None:
            return
        rec = self._new(CLOSE, key, status=COMPLETED)
        rec.finished_at = self._now()
