"""A worker for durable's remote steps in plain Python: kombu only, no Django, no Celery, no durable.

It shows the whole protocol (durable/protocol/v1/) in one place, so that a worker in any language
can be written from it:

1. Consume the step's queue. Each message is a Celery protocol 2 task message: the step's name in
   the ``task`` header, ``[args, kwargs, embed]`` as the JSON body, and a ``durable_attempt``
   header naming the attempt (``run_id``, ``seq``, ``attempt``, ``token``) and the queue to report
   to (``reply_to``).
2. Run the step. While it runs, send ``durable.heartbeat`` now and then: the first beat marks the
   attempt started (so it is not sent again), later ones keep it alive.
3. Send ``durable.step_result`` with ``output``, or with ``error`` (``message``, ``type``, and
   ``non_retryable`` to stop the step's retries), then acknowledge the message. A worker that dies
   before acknowledging gets the message again, and its attempt counts as lost once its beats stop;
   a duplicate report is ignored by durable.

Under a codec (``DURABLE["CODEC"]`` on durable's side) every payload (each argument, the output,
the progress) travels as an envelope ``{"__durable__": "encoded", "v": "<base64>"}``: ``open_payload``
and ``seal_payload`` below undo and redo durable.codecs.Zlib and durable.codecs.Fernet. Give the
fleet's Fernet keys (first encrypts) in ``DURABLE_CODEC_KEYS``, comma-separated, and set
``DURABLE_CODEC_ZLIB=1`` when durable's CODEC list starts with Zlib.

Run it: ``python remote_worker.py redis://localhost:6379/0 remote`` serves the example handlers
below on queue ``remote``; import ``RemoteWorker`` to serve your own.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import socket
import sys
import time
import uuid
import zlib
from collections.abc import Callable
from typing import Any

from kombu import Connection, Consumer, Exchange, Producer, Queue

log = logging.getLogger("remote_worker")

PROTOCOL = 1


class Codec:
    """durable's ``CODEC = ["durable.codecs.Zlib", "durable.codecs.Fernet"]`` (or either alone),
    from the environment: ``DURABLE_CODEC_KEYS`` (comma-separated Fernet keys, the first
    encrypts; needs ``cryptography``) and ``DURABLE_CODEC_ZLIB=1``. Neither set: no codec."""

    def __init__(self, keys: list[str], zlib_first: bool) -> None:
        self.zlib = zlib_first
        self.fernet = None
        if keys:
            from cryptography.fernet import Fernet, MultiFernet

            self.fernet = MultiFernet([Fernet(key) for key in keys])

    @classmethod
    def from_env(cls) -> Codec | None:
        keys = [k.strip() for k in os.environ.get("DURABLE_CODEC_KEYS", "").split(",") if k.strip()]
        zlib_first = os.environ.get("DURABLE_CODEC_ZLIB") == "1"
        return cls(keys, zlib_first) if keys or zlib_first else None

    def open(self, value: Any) -> Any:
        """The payload an envelope holds (any other value as it is)."""
        if not (isinstance(value, dict) and value.keys() == {"__durable__", "v"}):
            return value
        data = base64.b64decode(value["v"])
        if self.fernet is not None:
            data = self.fernet.decrypt(data)  # InvalidToken: none of the keys opens it
        if self.zlib:
            data = zlib.decompress(data)
        return json.loads(data)

    def seal(self, value: Any) -> dict[str, str]:
        """The envelope of ``value``: JSON, then zlib, then Fernet, then base64."""
        data = json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
        if self.zlib:
            data = zlib.compress(data)
        if self.fernet is not None:
            data = self.fernet.encrypt(data)
        return {"__durable__": "encoded", "v": base64.b64encode(data).decode("ascii")}


class Attempt:
    """The attempt a handler runs: its identity, and ``heartbeat()`` to report progress."""

    def __init__(self, worker: RemoteWorker, header: dict[str, Any]) -> None:
        self.worker = worker
        self.header = header
        self.run_id, self.seq, self.attempt = header["run_id"], header["seq"], header["attempt"]

    def report(self) -> dict[str, Any]:
        """The keyword arguments that name this attempt in a report."""
        return {key: self.header[key] for key in ("run_id", "seq", "attempt", "token")}

    def heartbeat(self, progress: Any = None) -> None:
        progress = self.worker.seal(progress) if progress is not None else None
        # sent_at: durable keeps the last beat sent's progress, in whatever order it takes them.
        beat = {**self.report(), "progress": progress, "sent_at": time.time()}
        self.worker.send("durable.heartbeat", beat, self.header["reply_to"])


Handler = Callable[..., Any]


class RemoteWorker:
    """Runs the handlers registered with ``step(name)`` for the steps sent to ``queue``."""

    def __init__(self, broker_url: str, queue: str, codec: Codec | None = None) -> None:
        self.codec = codec
        self.connection = Connection(broker_url)
        self.queue = Queue(queue, Exchange(queue, "direct"), routing_key=queue)
        self.handlers: dict[str, Handler] = {}
        self.origin = f"remote_worker@{socket.gethostname()}:{os.getpid()}"

    def step(self, name: str) -> Callable[[Handler], Handler]:
        """Register ``fn(attempt, *args, **kwargs)`` as the body of step ``name``."""

        def register(fn: Handler) -> Handler:
            self.handlers[name] = fn
            return fn

        return register

    def open(self, value: Any) -> Any:
        return self.codec.open(value) if self.codec is not None else value

    def seal(self, value: Any) -> Any:
        return self.codec.seal(value) if self.codec is not None else value

    def result_message(
        self, attempt: Attempt, output: Any = None, error: Exception | None = None
    ) -> dict[str, Any]:
        """The keyword arguments of ``durable.step_result`` for how the attempt ended."""
        if error is None:
            return {**attempt.report(), "output": self.seal(output)}
        return {
            **attempt.report(),
            "error": {
                "message": str(error) or type(error).__name__,
                "type": type(error).__name__,
                "code": getattr(error, "code", None)
                if isinstance(getattr(error, "code", None), str)
                else None,
                "details": None,
                "non_retryable": bool(getattr(error, "non_retryable", False)),
            },
        }

    def handle(self, body: Any, message: Any) -> None:
        header = message.headers.get("durable_attempt")
        task = message.headers.get("task")
        handler = self.handlers.get(task)
        if not isinstance(header, dict) or header.get("protocol") != PROTOCOL or handler is None:
            # Not ours to run: durable re-sends an attempt nobody started, so dropping is safe.
            log.warning(
                "remote worker: dropped %s (no handler, or not a protocol %s attempt)", task, PROTOCOL
            )
            message.ack()
            return
        args, kwargs, _embed = body
        attempt = Attempt(self, header)
        log.info("remote worker: running %s attempt %s of %s", task, attempt.attempt, attempt.run_id)
        attempt.heartbeat()  # started: durable will not send it again while the beats go on
        try:
            args = [self.open(arg) for arg in args]
            kwargs = {name: self.open(value) for name, value in kwargs.items()}
            report = self.result_message(attempt, output=handler(attempt, *args, **kwargs))
        except Exception as exc:  # noqa: BLE001 - any failure of the step is reported, not raised
            report = self.result_message(attempt, error=exc)
        self.send("durable.step_result", report, header["reply_to"])
        message.ack()  # after the report: a crash before it gets the message again

    def send(self, task: str, kwargs: dict[str, Any], queue: str) -> None:
        """Publish a Celery protocol 2 message calling ``task`` with ``kwargs``."""
        task_id = str(uuid.uuid4())
        headers = {
            "lang": "py",
            "task": task,
            "id": task_id,
            "root_id": task_id,
            "parent_id": None,
            "group": None,
            "shadow": None,
            "eta": None,
            "expires": None,
            "retries": 0,
            "timelimit": [None, None],
            "argsrepr": "()",
            "kwargsrepr": "{...}",
            "origin": self.origin,
            "ignore_result": True,
        }
        body = [[], kwargs, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}]
        target = Queue(queue, Exchange(queue, "direct"), routing_key=queue)
        with self.connection.clone() as connection:
            Producer(connection).publish(
                body,
                exchange=target.exchange,
                routing_key=queue,
                declare=[target],
                serializer="json",
                headers=headers,
                correlation_id=task_id,
                retry=True,
            )

    def run(self, until: Callable[[], bool] = lambda: False) -> None:
        """Serve the queue one message at a time until ``until()`` says stop."""
        consumer = Consumer(
            self.connection, [self.queue], callbacks=[self.handle], accept=["json"], prefetch_count=1
        )
        with self.connection, consumer:
            log.warning("remote worker ready on %s (%s)", self.queue.name, ", ".join(sorted(self.handlers)))
            while not until():
                try:
                    self.connection.drain_events(timeout=1)
                except TimeoutError:  # nothing came within the second: look at until() again
                    continue


def example(broker_url: str, queue: str) -> RemoteWorker:
    """The example handlers: ``examples.shout`` and ``examples.count_words`` (which beats)."""
    worker = RemoteWorker(broker_url, queue, Codec.from_env())

    @worker.step("examples.shout")
    def shout(attempt: Attempt, text: str) -> str:
        if not text:
            raise ValueError("nothing to shout")
        return text.upper()

    @worker.step("examples.count_words")
    def count_words(attempt: Attempt, lines: list[str]) -> int:
        total = 0
        for done, line in enumerate(lines, 1):
            total += len(line.split())
            attempt.heartbeat({"done": done})
            time.sleep(0.05)
        return total

    return worker


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    loaded = sorted(name for name in ("durable", "celery", "django.conf", "django.db") if name in sys.modules)
    log.warning("remote worker modules: %s", loaded or "no durable, no Celery, no Django settings or ORM")
    example(sys.argv[1], sys.argv[2]).run()
