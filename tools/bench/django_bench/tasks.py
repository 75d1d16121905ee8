"""The benchmark's task: nothing to do, or (given the enqueue's wall time) write
its pickup latency to BENCH_LATENCY_FILE."""

import os
import time

try:
    from django.tasks import task  # Django 6
except ImportError:  # Django 5.2 with the django-tasks backport
    from django_tasks import task


@task()  # type: ignore[untyped-decorator]  # Django ships no annotations
def noop(sent_at: float | None = None) -> None:
    if sent_at is not None:
        latency = time.time() - sent_at
        # One short O_APPEND write per task: whole lines, from any thread or process.
        with open(os.environ["BENCH_LATENCY_FILE"], "a") as out:
            out.write(f"{latency:.6f}\n")
