"""Every failed step attempt, kept apart from the position it failed at: a retry of the run
forgets the position (it is replayed as new), never the failure that made an operator retry."""

from __future__ import annotations

from django.db import models

from .runs import Run


class AttemptErrorQuerySet(models.QuerySet["AttemptError"]):
    def of(self, run_id: str) -> AttemptErrorQuerySet:
        errors: AttemptErrorQuerySet = self.filter(run_id=run_id).order_by("seq", "id")
        return errors


class AttemptError(models.Model):
    """One failed attempt of a step: its error and, when it raised, its traceback."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="attempt_errors", db_index=False)
    seq = models.PositiveIntegerField()
    name = models.CharField(max_length=255)
    attempt = models.PositiveIntegerField()
    error = models.JSONField(null=True, blank=True)
    traceback = models.TextField(blank=True, default="")
    failed_at = models.DateTimeField()

    objects = AttemptErrorQuerySet.as_manager()

    class Meta:
        indexes = [models.Index(fields=["run", "seq", "attempt"], name="durable_attempt_error_run")]
        ordering = ["run", "seq", "id"]

    def __str__(self) -> str:
        return f"{self.run_id}#{self.seq} {self.name} attempt {self.attempt}"
