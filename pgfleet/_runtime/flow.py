"""Flow control at worker start: the limits declared in code reach the database.

The claim itself enforces limits and pauses in SQL (``pgfleet.claim_flow``, read
every round); all a worker does is write its registry's defaults before its first
claim, without overwriting an operator's value."""

from __future__ import annotations

import logging

from pgfleet.db.store import Store
from pgfleet.db.types import Executor
from pgfleet.registry import Registry

log = logging.getLogger("pgfleet")


async def write_code_limits(db: Executor, registry: Registry) -> int:
    """Write each handler's declared limits unless an operator set the name's;
    return how many rows this call wrote."""
    store = Store(db)
    wrote = 0
    for handler in registry:
        spec = handler.limits
        if spec is None:
            continue
        stored, written = await store.limits_set_default(name=handler.name, spec=spec)
        if written:
            wrote += 1
            log.info("limits of %s from code: %s", handler.name, spec)
        elif stored.source == "operator" and (
            stored.concurrency,
            stored.rate,
            stored.per,
            stored.per_key,
        ) != (spec.concurrency, spec.rate, spec.per, spec.per_key):
            log.info(
                "limits of %s: the operator's value (concurrency=%s, rate=%s per %ss, "
                "per_key=%s) wins over the code's %s",
                handler.name,
                stored.concurrency,
                stored.rate,
                stored.per,
                stored.per_key,
                spec,
            )
    return wrote
