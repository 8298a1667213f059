"""A what-if for the findings, not used by ``run.py``: the example project's settings plus
Celery's ``CELERY_DB_REUSE_MAX``, so Celery's Django fix-up stops closing the database connection
before and after every task (``BENCH_WHATIF=1 python bench/run.py`` measures with it)."""

from project.settings import *  # noqa: F403

CELERY_DB_REUSE_MAX = 1_000_000
