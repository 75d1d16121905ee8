"""The Django project of tools/bench/django_tasks.py: one no-op task, served by
pgfleet's tasks backend ("default") and by django-tasks-db's ("db")."""
