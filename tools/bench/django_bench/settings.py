"""Settings of the benchmark's Django project: one PostgreSQL database
(BENCH_DATABASE_URL), both backends of Django's tasks framework on it."""

import os
from urllib.parse import unquote, urlsplit

_url = urlsplit(os.environ.get("BENCH_DATABASE_URL", "postgresql://postgres@127.0.0.1/bench"))

SECRET_KEY = "benchmark-only-not-secret"
DEBUG = False  # DEBUG keeps every query in memory
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = [
    "django_tasks",
    "django_tasks_db",
    "pgfleet.contrib.django",
    "tools.bench.django_bench",
]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(_url.path.lstrip("/")),
        "USER": unquote(_url.username or ""),
        "PASSWORD": unquote(_url.password or ""),
        "HOST": _url.hostname or "",
        "PORT": str(_url.port or ""),
        # Persistent connections (Django's default, 0, reconnects for every request,
        # and db_worker calls each task one): BENCH_CONN_MAX_AGE=0 measures that.
        "CONN_MAX_AGE": int(os.environ.get("BENCH_CONN_MAX_AGE", "600")),
        "CONN_HEALTH_CHECKS": True,
    }
}
TASKS = {
    "default": {"BACKEND": "pgfleet.contrib.django.TaskBackend"},
    "db": {"BACKEND": "django_tasks_db.DatabaseBackend"},
}
