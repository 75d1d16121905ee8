"""Django's tasks framework on pgfleet, in this process: the example shop
(examples/django) on a database of this module, its tasks run by a worker built
from them. A task enqueued in ``transaction.atomic()`` commits or rolls back with
the block, with and without on-commit; results and errors read back through
Django's own API.

Django is configured once per process, so this module owns it: the tests are sync
(Django's ORM refuses to run under a running event loop) and run the worker with
``asyncio.run``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import asyncpg
import pytest

from pgfleet import PayloadTooLarge, SchemaNotReady
from pgfleet.testing import drain
from tests import pgharness

T = TypeVar("T")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "django"


class Boom(Exception):
    pass


@pytest.fixture(scope="module")
def shop(pg_server: pgharness.Server) -> Iterator[str]:
    """The example shop set up on a database of its own; yields its DSN."""
    name = asyncio.run(pgharness.create_database(pg_server))
    dsn = pg_server.dsn_for(name)
    os.environ["DATABASE_URL"] = dsn
    os.environ["SHOP_TASK_ATTEMPTS"] = "1"
    os.environ["DJANGO_SETTINGS_MODULE"] = "shop.settings"
    sys.path.insert(0, str(EXAMPLE))
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)  # pgfleet's schema is there already: a no-op
    try:
        yield dsn
    finally:
        from django.db import connections

        connections.close_all()
        asyncio.run(pgharness.drop_database(pg_server, name))


def _run_worker(dsn: str, backend: str = "default") -> Any:
    """Run the shop's tasks until none is runnable; the worker's stats."""
    from pgfleet.contrib.django.compat import task_backends
    from pgfleet.contrib.django.worker import build_registry

    chosen = task_backends[backend]
    registry = build_registry(chosen, sorted(chosen.queues))

    async def run() -> Any:
        pool = await asyncpg.create_pool(dsn, min_size=1, max_size=4)
        try:
            return await drain(pool, registry, poll_interval=0.1)
        finally:
            await pool.close()

    return asyncio.run(run())


def _order() -> Any:
    from orders.models import Order

    return Order.objects.create(email="a@example.com", total_cents=100)


def _rolled_back(body: Callable[[], T]) -> T:
    """What ``body`` returned inside an atomic block that then rolled back."""
    from django.db import transaction

    out: list[T] = []
    with contextlib.suppress(Boom), transaction.atomic():
        out.append(body())
        raise Boom
    assert out
    return out[0]


def _missing(result_id: str) -> bool:
    from orders.tasks import send_receipt

    from pgfleet.contrib.django.compat import TaskResultDoesNotExist

    try:
        send_receipt.get_result(result_id)
    except TaskResultDoesNotExist:
        return True
    return False


def test_a_task_enqueued_in_a_rolled_back_block_does_not_exist_and_never_runs(shop: str) -> None:
    from django.db import transaction
    from orders.models import Order
    from orders.tasks import send_receipt

    def inside() -> Any:
        result = send_receipt.enqueue(_order().pk)
        assert send_receipt.get_result(result.id).status == "READY"  # visible inside
        return result

    rolled = _rolled_back(inside)
    assert _missing(rolled.id)
    with transaction.atomic():
        order = _order()
        committed = send_receipt.enqueue(order.pk)
    stats = _run_worker(shop)
    assert stats.succeeded == 1
    result = send_receipt.get_result(committed.id)
    assert (result.status, result.attempts, result.args) == ("SUCCESSFUL", 1, [order.pk])
    assert result.enqueued_at <= result.started_at <= result.finished_at
    assert Order.objects.get(pk=order.pk).receipts_sent == 1
    assert _missing(rolled.id)


def test_enqueue_on_commit_writes_the_job_only_when_the_block_commits(shop: str) -> None:
    from django.db import transaction
    from django.test import override_settings
    from orders.models import Order
    from orders.tasks import send_receipt

    tasks = {
        "default": {"BACKEND": "pgfleet.contrib.django.TaskBackend", "QUEUES": ["default"]},
        "oncommit": {
            "BACKEND": "pgfleet.contrib.django.TaskBackend",
            "QUEUES": ["default"],
            "OPTIONS": {"ENQUEUE_ON_COMMIT": True, "MAX_ATTEMPTS": 1},
        },
    }
    with override_settings(TASKS=tasks):
        on_commit = send_receipt.using(backend="oncommit")

        def inside() -> Any:
            result = on_commit.enqueue(_order().pk)
            assert _missing(result.id)  # not written before the commit
            return result

        rolled = _rolled_back(inside)
        with transaction.atomic():
            order = _order()
            committed = on_commit.enqueue(order.pk)
            assert _missing(committed.id)
        assert not _missing(committed.id)
        # Django's own recipe for the same: transaction.on_commit around enqueue.
        seen: list[Any] = []
        _rolled_back(lambda: transaction.on_commit(lambda: seen.append(send_receipt.enqueue(0))))
        with transaction.atomic():
            later = _order()
            transaction.on_commit(lambda: seen.append(send_receipt.enqueue(later.pk)))
        assert len(seen) == 1
        stats = _run_worker(shop, "oncommit")
    assert stats.succeeded == 2
    assert _missing(rolled.id)
    assert Order.objects.get(pk=order.pk).receipts_sent == 1
    assert Order.objects.get(pk=later.pk).receipts_sent == 1
    assert send_receipt.get_result(seen[0].id).status == "SUCCESSFUL"


def test_a_failed_task_reads_back_as_failed_with_its_exception(shop: str) -> None:
    from orders.tasks import fail_loudly

    result = fail_loudly.enqueue("out of paper")
    assert result.task.queue_name == "emails"
    stats = _run_worker(shop)
    assert stats.failed == 1
    result.refresh()
    assert result.status == "FAILED"
    (error,) = result.errors
    assert error.exception_class is ValueError
    assert "out of paper" in error.traceback
    with pytest.raises(ValueError, match="Task failed"):
        _ = result.return_value


def test_bad_input_raises_pgfleets_errors_and_leaves_the_transaction_usable(shop: str) -> None:
    from django.db import connection, transaction
    from django.test import override_settings
    from orders.tasks import send_receipt

    tasks = {
        "default": {
            "BACKEND": "pgfleet.contrib.django.TaskBackend",
            "QUEUES": ["default"],
            "OPTIONS": {"MAX_PAYLOAD_BYTES": 64},
        }
    }
    with override_settings(TASKS=tasks):
        with pytest.raises(PayloadTooLarge):
            send_receipt.enqueue("x" * 100)
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("ALTER SCHEMA pgfleet RENAME TO pgfleet_away")
            try:
                with pytest.raises(SchemaNotReady):
                    send_receipt.enqueue(1)
                assert connection.needs_rollback  # Django knows the block failed
            finally:
                transaction.set_rollback(True)
        assert send_receipt.enqueue(1).status == "READY"  # renamed back by the rollback
