"""Settings of the example shop: one PostgreSQL database (DATABASE_URL), pgfleet
as the tasks backend. Nothing else is needed to run its tasks."""

import os
from urllib.parse import unquote, urlsplit

_url = urlsplit(os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/shop"))

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-only-not-secret")
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]
USE_TZ = True
ROOT_URLCONF = "shop.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --8<-- [start:apps]
INSTALLED_APPS = [
    "django_tasks",  # the tasks framework's backport (Django 5.2); drop it on Django 6
    "pgfleet.contrib.django",
    "orders",
]
# --8<-- [end:apps]

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(_url.path.lstrip("/")),
        "USER": unquote(_url.username or ""),
        "PASSWORD": unquote(_url.password or ""),
        "HOST": _url.hostname or "",
        "PORT": str(_url.port or ""),
    }
}

# --8<-- [start:tasks]
TASKS = {
    "default": {
        "BACKEND": "pgfleet.contrib.django.TaskBackend",
        "QUEUES": ["default", "emails"],  # optional: the queues a worker serves
        "OPTIONS": {"MAX_ATTEMPTS": int(os.environ.get("SHOP_TASK_ATTEMPTS", "3"))},  # optional
    }
}
# --8<-- [end:tasks]
