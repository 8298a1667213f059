"""The metrics durable records: one table read by both ways of reading them (an OpenTelemetry
meter and the Prometheus text of ``durable.metrics_view``), the dashboard's test and the docs.

Prometheus names: the dots become underscores; a counter gains ``_total``, a histogram is
``_bucket`` / ``_sum`` / ``_count``; no unit suffix (every duration is in seconds).
"""

from __future__ import annotations

from dataclasses import dataclass

COUNTER = "counter"
HISTOGRAM = "histogram"
GAUGE = "gauge"

#: Bucket bounds, in seconds, of every histogram: from a local step's milliseconds to a run's day.
BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    900.0,
    3600.0,
    21600.0,
    86400.0,
)


@dataclass(frozen=True)
class Instrument:
    name: str
    kind: str
    description: str
    attributes: tuple[str, ...]
    unit: str = ""

    @property
    def prometheus(self) -> str:
        """The name of its family in Prometheus text (a counter's samples add ``_total``)."""
        return self.name.replace(".", "_")


_RUN = ("workflow", "namespace")
_STEP = ("step", "queue", "namespace")

INSTRUMENTS = (
    Instrument("durable.runs.started", COUNTER, "Runs whose first turn began", _RUN, "{run}"),
    Instrument("durable.runs.completed", COUNTER, "Runs that completed", _RUN, "{run}"),
    Instrument("durable.runs.failed", COUNTER, "Runs that failed for good", _RUN, "{run}"),
    Instrument("durable.runs.cancelled", COUNTER, "Runs that were cancelled", _RUN, "{run}"),
    Instrument(
        "durable.runs.dead", COUNTER, "Runs whose turns crashed MAX_RECOVERY_ATTEMPTS times", _RUN, "{run}"
    ),
    Instrument(
        "durable.steps.attempts",
        COUNTER,
        "Step attempts that ended, by outcome: completed, retried (failed, another is due) or failed (for good)",
        (*_STEP, "outcome"),
        "{attempt}",
    ),
    Instrument(
        "durable.step.duration", HISTOGRAM, "A step attempt, started to recorded", (*_STEP, "outcome"), "s"
    ),
    Instrument(
        "durable.step.queue_wait", HISTOGRAM, "A dispatched step attempt, sent to started", _STEP, "s"
    ),
    Instrument(
        "durable.turn.duration", HISTOGRAM, "A turn of a run, claimed to settled", (*_RUN, "outcome"), "s"
    ),
    Instrument(
        "durable.run.duration", HISTOGRAM, "A run that ended, first turn to end", (*_RUN, "status"), "s"
    ),
    Instrument(
        "durable.timers.due",
        GAUGE,
        "Suspended runs whose timer is due and not yet fired (the timer sweep's backlog)",
        ("namespace",),
        "{run}",
    ),
    Instrument(
        "durable.timers.oldest_due_age",
        GAUGE,
        "How long the most overdue timer of a suspended run has been due (the timer sweep's lag), 0 when none",
        ("namespace",),
        "s",
    ),
    Instrument(
        "durable.runs.waiting_first_turn",
        GAUGE,
        "Runs started and not yet in their first turn",
        ("namespace",),
        "{run}",
    ),
    Instrument(
        "durable.steps.oldest_unstarted_age",
        GAUGE,
        "How long the oldest sent, not yet started step attempt of a queue has waited",
        ("queue", "namespace"),
        "s",
    ),
)

BY_NAME = {instrument.name: instrument for instrument in INSTRUMENTS}
