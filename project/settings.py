"""Settings for the example project, driven by environment variables.

With no environment set it runs on the embedded default: SQLite and kombu's filesystem
transport under ``var/``, so nothing needs a server. Production sets DATABASE_URL and
CELERY_BROKER_URL (see docs/production.md).
"""

import os
from pathlib import Path
from urllib.parse import unquote, urlparse

from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("DURABLE_VAR_DIR", BASE_DIR / "var"))
# The README's test command runs the suite in several processes side by side (pytest-xdist's
# gw0, gw1, ...): each has a var/ folder of its own (SQLite file, embedded broker), and below a
# Redis database of its own, so processes share no file, row or message (pytest-django suffixes
# PostgreSQL's test database). Written back to the environment, which the worker subprocesses a
# test starts inherit: they take these as they are.
TEST_PROCESS = os.environ.get("PYTEST_XDIST_WORKER", "")
TEST_PROCESS_SETTLED = TEST_PROCESS and os.environ.get("DURABLE_TEST_PROCESS") == TEST_PROCESS
if TEST_PROCESS and not TEST_PROCESS_SETTLED:
    VAR_DIR = VAR_DIR / TEST_PROCESS
    os.environ["DURABLE_VAR_DIR"] = str(VAR_DIR)


def env_flag(name: str, default: bool) -> bool:
    return os.environ.get(name, "1" if default else "0").strip().lower() in ("1", "true", "yes", "on")


# DEBUG is on unless DJANGO_DEBUG=0, so the embedded default runs with no setup. With it off (as
# docker-compose.yml sets it) the project refuses to start on the development key.
DEV_SECRET_KEY = "dev-only-not-secret"
DEBUG = env_flag("DJANGO_DEBUG", True)
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY") or DEV_SECRET_KEY
if not DEBUG and SECRET_KEY == DEV_SECRET_KEY:
    raise ImproperlyConfigured(
        "DJANGO_DEBUG is off but DJANGO_SECRET_KEY is not set: the development key is public. Set "
        'DJANGO_SECRET_KEY to a long random value, e.g. the output of python -c "from '
        'django.core.management.utils import get_random_secret_key; print(get_random_secret_key())"'
    )
ALLOWED_HOSTS = os.environ.get("DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1").split(",")

# HTTPS settings, off for local development, set by docker-compose.yml (`manage.py check --deploy`
# passes with its values). Behind a proxy that terminates TLS, it must send X-Forwarded-Proto.
SECURE_SSL_REDIRECT = env_flag("DJANGO_SECURE_SSL_REDIRECT", False)
SECURE_HSTS_SECONDS = int(os.environ.get("DJANGO_SECURE_HSTS_SECONDS", "0"))
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_flag("DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = env_flag("DJANGO_SECURE_HSTS_PRELOAD", False)
SESSION_COOKIE_SECURE = env_flag("DJANGO_SESSION_COOKIE_SECURE", False)
CSRF_COOKIE_SECURE = env_flag("DJANGO_CSRF_COOKIE_SECURE", False)
if env_flag("DJANGO_BEHIND_TLS_PROXY", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_celery_results",
    "durable",
    "durable_admin",
    "project.shop",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "project.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
WSGI_APPLICATION = "project.wsgi.application"


def database_from_url(url: str) -> dict:
    """Turn ``postgres://user:pass@host:port/name`` or ``sqlite:///path`` into a DATABASES entry."""
    parsed = urlparse(url)
    if parsed.scheme == "sqlite":
        return sqlite_database(Path(unquote(parsed.path)))
    if parsed.scheme in ("postgres", "postgresql"):
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": unquote(parsed.path.lstrip("/")),
            "USER": unquote(parsed.username or ""),
            "PASSWORD": unquote(parsed.password or ""),
            "HOST": parsed.hostname or "",
            "PORT": str(parsed.port or ""),
            # One connection per worker process, kept across tasks; durable drops it when it
            # broke or outlived this age, and health checks ping it before a task uses it.
            "CONN_MAX_AGE": int(os.environ.get("DATABASE_CONN_MAX_AGE", "60")),
            "CONN_HEALTH_CHECKS": True,
            "TEST": {"NAME": os.environ.get("DATABASE_TEST_NAME") or None},
            "OPTIONS": prepared_statements(os.environ.get("DATABASE_PREPARED_STATEMENTS", "1")),
        }
    raise ValueError(f"DATABASE_URL: unsupported scheme {parsed.scheme!r}; use postgres:// or sqlite://")


def prepared_statements(setting: str) -> dict:
    """Server-side binding, and statements PostgreSQL plans once per connection (psycopg prepares
    a statement from its fifth use on): a step's few statements then cost no planning each time.
    Django leaves both off because a pooler in transaction mode (PgBouncer before 1.21, or with
    ``max_prepared_statements`` 0) cannot keep prepared statements: behind one, set
    DATABASE_PREPARED_STATEMENTS=0."""
    if setting not in ("0", "1"):
        raise ValueError(
            f"DATABASE_PREPARED_STATEMENTS={setting!r}: use 1 (the default) or 0 (behind a pooler)"
        )
    return {"server_side_binding": True, "prepare_threshold": 5} if setting == "1" else {}


def sqlite_database(path: Path) -> dict:
    path.parent.mkdir(parents=True, exist_ok=True)
    return {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": path,
        # Several worker processes write at once: WAL, a busy timeout, and writers that take
        # the lock up front instead of failing with "database is locked".
        "OPTIONS": {
            "timeout": 30,
            "transaction_mode": "IMMEDIATE",
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        },
        # Tests share the database with real worker subprocesses, so it must be a file.
        "TEST": {"NAME": str(path.with_name(f"test_{path.name}"))},
    }


DATABASES = {
    "default": database_from_url(os.environ["DATABASE_URL"])
    if os.environ.get("DATABASE_URL")
    else sqlite_database(VAR_DIR / "db.sqlite3")
}
if os.environ.get("DATABASE_LISTEN_URL"):
    # Behind a pooler in transaction mode (DATABASE_URL names PgBouncer), the same database
    # reached directly: the one connection per process that LISTENs for runs' ends needs a
    # session of its own (DURABLE["LISTEN_DATABASE"], set below). Its tests use default's.
    DATABASES["listen"] = {
        **database_from_url(os.environ["DATABASE_LISTEN_URL"]),
        "TEST": {"MIRROR": "default"},
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "var" / "static"
# Where durable writes payloads larger than DURABLE["OFFLOAD_BYTES"] (DURABLE["OFFLOAD_STORAGE"]
# names this key): a folder under VAR_DIR, which workers on the same machine share. A fleet on
# several machines points it at shared storage instead (S3 through django-storages, see
# docs/payloads.md).
STORAGES = {
    "default": {
        "BACKEND": "django.core.files.storage.FileSystemStorage",
        "OPTIONS": {"location": VAR_DIR / "media"},
    },
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}

# Celery: JSON only, results in the database through django-celery-results.
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", "filesystem://")


def broker_of_test_process(url: str, process: str) -> str:
    """The broker URL test process ``process`` (gw<K>) uses: Redis database N + K for database N."""
    index = int(process.removeprefix("gw"))
    parsed = urlparse(url)
    if parsed.scheme in ("redis", "rediss"):
        db = int(parsed.path.lstrip("/") or 0) + index
        if db > 15:
            raise ImproperlyConfigured(
                f"CELERY_BROKER_URL={url!r} with test process {process}: Redis database {db} does not "
                "exist; use a lower database number or fewer processes (pytest -n)"
            )
        return parsed._replace(path=f"/{db}").geturl()
    if parsed.scheme in ("amqp", "amqps", "pyamqp") and index > 0:
        raise ImproperlyConfigured(
            "CELERY_BROKER_URL is RabbitMQ: test processes side by side would share its vhost's "
            "queues; run its tests in one process (pytest -n 0), as CI's rabbitmq suite does"
        )
    return url


if TEST_PROCESS and not TEST_PROCESS_SETTLED:
    _own_broker = broker_of_test_process(CELERY_BROKER_URL, TEST_PROCESS)
    if _own_broker != CELERY_BROKER_URL:  # only then: Celery prefers the variable to its conf
        CELERY_BROKER_URL = os.environ["CELERY_BROKER_URL"] = _own_broker
    os.environ["DURABLE_TEST_PROCESS"] = TEST_PROCESS
if CELERY_BROKER_URL.startswith("filesystem://"):
    # kombu's filesystem transport, with messages written atomically (see the module).
    CELERY_BROKER_TRANSPORT = "durable.filesystem_broker:Transport"
    _queue_dir = VAR_DIR / "broker"
    for _sub in ("queue", "processed", "control"):
        (_queue_dir / _sub).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_queue_dir / "queue"),
        "data_folder_out": str(_queue_dir / "queue"),
        "processed_folder": str(_queue_dir / "processed"),
        "control_folder": str(_queue_dir / "control"),
        "store_processed": False,
        # The filesystem transport polls; the default second is too slow for workflows.
        "polling_interval": 0.05,
    }
elif CELERY_BROKER_URL.startswith(("amqp://", "amqps://", "pyamqp://")):
    # Publisher confirms: a publish returns once RabbitMQ has taken the message, so a message
    # durable counts as sent is on the broker (see docs/production.md, RabbitMQ).
    CELERY_BROKER_TRANSPORT_OPTIONS = {"confirm_publish": True}
    if env_flag("CELERY_QUORUM_QUEUES", False):
        # Replicated queues for every queue Celery declares (durable's `durable`, `durable.NS`
        # and remote queues are declared on first use), behind topic exchanges so that Celery's
        # native delayed delivery carries durable's few countdown messages. A queue's type is
        # fixed when declared: a broker holding classic queues of these names refuses the switch.
        CELERY_TASK_DEFAULT_QUEUE_TYPE = "quorum"
        CELERY_TASK_CREATE_MISSING_QUEUE_TYPE = "quorum"
        CELERY_TASK_DEFAULT_EXCHANGE_TYPE = "topic"
        CELERY_TASK_CREATE_MISSING_QUEUE_EXCHANGE_TYPE = "topic"
else:
    # Longer than any step's timeout, or Redis redelivers a running step (see docs/production.md).
    CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 3600}
CELERY_RESULT_BACKEND = "django-db"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# Celery's Django fix-up closes the database connection before and after every task unless this
# is set: each durable task would pay a new PostgreSQL connection (see docs/production.md).
CELERY_DB_REUSE_MAX = 1000
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")


def _switch(value: str) -> bool:
    return value.lower() in ("1", "true", "yes", "on")


# Any DURABLE key can be set from the environment as DURABLE_<KEY> (tests and the chaos suite
# use this to shorten intervals for the worker subprocesses they start).
_DURABLE_FROM_ENV = {
    "DEFAULT_QUEUE": str,
    "LEASE": str,
    "RECONCILE_INTERVAL": str,
    "MAX_RECOVERY_ATTEMPTS": int,
    "MAX_PAYLOAD_BYTES": int,
    "TIMER_BATCH_SIZE": int,
    "HEARTBEAT_PERSIST_THROTTLE": str,
    "TIMER_SWEEP_INTERVAL": str,
    "TIMER_HINT_WITHIN": str,
    "ORPHAN_SWEEP_INTERVAL": str,
    "STEP_REDISPATCH_AFTER": str,
    "STEP_TIMEOUT_GRACE": str,
    "TURN_TIME_LIMIT": str,
    "INSTANCE_ID": str,
    "NAMESPACE": str,
    "ENTITY_SWEEP_INTERVAL": str,
    "ENTITY_OPS_KEPT": int,
    "PRESENCE_INTERVAL": str,
    "EAGER_STEPS": _switch,
    "PUBLISH_IN_THREAD": _switch,
    "ASYNC_STEPS_PER_PROCESS": int,
    "FREEZE_GC_AT_START": _switch,
    "ON_NONDETERMINISM": str,
    # The bearer token Prometheus sends to /metrics/ (durable.metrics_view).
    "METRICS_TOKEN": str,
    # The folder the web and worker processes of one host share their metrics through.
    "METRICS_DIR": str,
    # Comma-separated: codec paths in order, Fernet keys with the first one encrypting.
    "CODEC": lambda value: [item.strip() for item in value.split(",") if item.strip()],
    "CODEC_KEYS": lambda value: [item.strip() for item in value.split(",") if item.strip()],
}
DURABLE = {
    key: cast(os.environ[f"DURABLE_{key}"])
    for key, cast in _DURABLE_FROM_ENV.items()
    if os.environ.get(f"DURABLE_{key}")
}
if "listen" in DATABASES:
    DURABLE["LISTEN_DATABASE"] = "listen"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {
        "durable": {"handlers": ["console"], "level": os.environ.get("DURABLE_LOG_LEVEL", "WARNING")}
    },
}
