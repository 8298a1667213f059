"""Whether an exception that escaped a body or a step is its process leaving, not the code failing.

A deploy stops workers in the middle of turns and steps, and Celery's shutdown paths raise inside
the code they interrupt: a prefork child told to end raises ``SystemExit``, gevent kills running
greenlets with ``GreenletExit``, the solo pool's cold shutdown raises whatever its signal handler
raised. Such an exception says nothing of the workflow: the turn records nothing and is handed
back, the step's attempt is lost (as if its process had been killed), never failed by it.

The worker's wiring (``durable.celery``) registers the probe that knows Celery's shutdown state;
outside a worker nothing is registered and every exception is the code's.
"""

from __future__ import annotations

from collections.abc import Callable

from .errors import _ControlFlow

Probe = Callable[[BaseException], bool]

_probes: list[Probe] = []


def recognise(probe: Probe) -> None:
    """Add ``probe``: true for an exception raised because this process is leaving."""
    if probe not in _probes:
        _probes.append(probe)


def is_leaving(exc: BaseException) -> bool:
    """Whether ``exc`` was raised because this process is leaving (a worker shutting down).
    durable's own control flow (a turn suspending, a lease lost) never is: it means what it says."""
    return not isinstance(exc, _ControlFlow) and any(probe(exc) for probe in _probes)
