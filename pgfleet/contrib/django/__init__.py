"""pgfleet as a backend of Django's tasks framework (the ``django`` extra).

::

    INSTALLED_APPS = [..., "pgfleet.contrib.django"]
    TASKS = {"default": {"BACKEND": "pgfleet.contrib.django.TaskBackend"}}

Tasks (``@task``) are enqueued as pgfleet jobs on Django's own database
connection, inside the current transaction; ``manage.py migrate`` applies pgfleet's
schema and ``manage.py pgfleet_worker`` runs them. Django 6's ``django.tasks`` and,
before it, the ``django-tasks`` backport are both served. See
docs/how-to/django.md.
"""

from pgfleet.contrib.django.backend import TaskBackend

__all__ = ["TaskBackend"]
