"""The shop's tasks: found by `manage.py pgfleet_worker` in each app's tasks module."""

from django.db import transaction
from django.db.models import F

from orders.models import Order

try:
    from django.tasks import task  # Django 6
except ImportError:  # Django 5.2 with the django-tasks backport
    from django_tasks import task


@task()
def send_receipt(order_id: int) -> int:
    """Send the receipt of an order (here: count it). Idempotent per attempt: the
    count and the send would commit together in a real shop."""
    with transaction.atomic():
        Order.objects.filter(pk=order_id).update(receipts_sent=F("receipts_sent") + 1)
    return order_id


@task(queue_name="emails", priority=10)
def fail_loudly(reason: str) -> None:
    """A task that always fails: its error is read back through Django's API."""
    raise ValueError(reason)
