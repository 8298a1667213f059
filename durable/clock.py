"""The one clock every engine comparison and stored time comes from (never SQL now())."""

from __future__ import annotations

from datetime import datetime

from django.utils import timezone


def now() -> datetime:
    return timezone.now()
