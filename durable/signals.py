"""Lifecycle signals: Django signals a project connects to for alerts, metrics and audit.

Each is sent after the transaction that made the change commits (never from inside a turn's
transaction), with ``send_robust``: a receiver that raises is logged by Django and changes
nothing. Run signals are sent with ``sender=durable.models.Run`` and these keyword arguments:
``run_id``, ``workflow``, ``version``, ``namespace``, ``status``, ``queue_wait`` (created to first
turn, a ``timedelta`` or None), ``duration`` (first turn to now or to the end) and, where they
apply, ``output``, ``error`` (durable's error dict) and ``wake_at`` (a suspended run's timer).
Step signals are sent with ``sender=durable.models.Checkpoint`` and ``run_id``, ``seq``,
``name``, ``attempt``, ``queue``, ``queue_wait`` (sent to started), ``duration`` (started to
recorded) and, where they apply, ``output``, ``error`` and ``retry_at`` (when the next attempt
is due). ``run_evicting`` is the exception: sent inside the retention sweep's transaction (see
its comment). Keep this module a flat list of signals.
"""

from __future__ import annotations

from django.dispatch import Signal

#: A run's first turn began.
run_started = Signal()
#: A turn ended with the run waiting (a step, a timer, a signal ...); ``wake_at`` is its timer.
run_suspended = Signal()
#: A run completed with ``output``.
run_completed = Signal()
#: A run failed for good with ``error``.
run_failed = Signal()
#: A run was cancelled.
run_cancelled = Signal()
#: A run's turns crashed or lost their lease MAX_RECOVERY_ATTEMPTS times in a row.
run_dead = Signal()
#: A turn found the body asking for other than the run's history holds (a change of code, or a
#: body that is not deterministic) and parked the run (ON_NONDETERMINISM "park"): nothing of the
#: turn was written and the run stays ``suspended``, tried again at ``wake_at`` and at every
#: worker start. Sent at every blocked turn, with ``error`` (its ``details``: ``seq``,
#: ``recorded`` and ``requested`` as [kind, name], ``parked`` turns since ``parked_since``),
#: ``wake_at`` and ``reason`` (what the admin says: where, the usual causes and the remedy).
run_blocked = Signal()

#: A step attempt started on a worker, or (local and in-place steps) ran inside a turn.
step_started = Signal()
#: A step attempt's output was recorded.
step_completed = Signal()
#: A step failed for good (its last attempt failed, or the failure was not retryable).
step_failed = Signal()
#: A step attempt failed and the next one is due at ``retry_at``.
step_retried = Signal()

#: Sent by the retention sweep before it deletes a finished run's tree, with ``sender`` the Run
#: model, ``run`` the root Run and ``run_ids`` every run of the tree (the root first). Sent inside
#: the deleting transaction, so a receiver reads the whole tree as it is. A receiver that raises
#: keeps the tree (logged; the next pass tries again): archive it, then let it go.
run_evicting = Signal()
