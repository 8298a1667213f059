"""kombu's filesystem transport with atomic writes: the broker of the embedded default.

kombu's own transport creates a message file and then writes into it, so a consumer polling the
folder can take the file while it is still empty: it fails to decode it and the message is lost.
Writing to a name consumers ignore and renaming it into place makes each message appear whole.
"""

from __future__ import annotations

import itertools
import os
import uuid
from time import monotonic_ns
from typing import Any

from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps

# Consumers take files in name order: a fixed-width clock and a per-process sequence keep the
# messages of one process in the order it sent them, even within one clock tick.
_sequence = itertools.count()


class Channel(filesystem.Channel):
    # kombu names the parameter two ways (AbstractChannel: message; filesystem.Channel: payload).
    def _put(self, queue: str, payload: Any, **kwargs: Any) -> None:  # type: ignore[override]
        name = f"{monotonic_ns():020d}_{next(_sequence):012d}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        partial = f"{final}.partial"  # consumers only take names ending in ".<queue>.msg"
        try:
            with open(partial, "wb") as f:
                f.write(str_to_bytes(dumps(payload)))
            os.replace(partial, final)
        except OSError as exc:
            raise filesystem.ChannelError(f"Cannot add file {final!r} to directory") from exc


class Transport(filesystem.Transport):
    Channel = Channel
