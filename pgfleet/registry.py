"""Job handlers by name, with the payload type each one expects."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from pgfleet.backoff import RetryPolicy
from pgfleet.errors import InvalidName, InvalidOptions
from pgfleet.jobs import Job, validate_name
from pgfleet.limits import LimitSpec
from pgfleet.payloads import Decoder, decoder_for

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True, slots=True)
class Handler:
    """A registered handler: how to call it and how to decode its payload."""

    name: str
    fn: Callable[..., Any]
    is_async: bool
    takes_payload: bool
    decode: Decoder
    timeout: float | None
    infallible: bool
    #: Flow-control limits declared in code: written to the database by each
    #: worker at start when no operator value exists (an operator's value wins).
    limits: LimitSpec | None = None
    #: The handler's own retry policy (None: the worker's backoff, the job's
    #: max_attempts).
    retry: RetryPolicy | None = None

    def call(self, job: Job, payload: Any) -> Any:
        if self.takes_payload:
            return self.fn(job, payload)
        return self.fn(job)


class Registry:
    """Maps job names to handlers.

    Handlers take ``(job)`` or ``(job, payload)``; the payload's annotation
    (dataclass, TypedDict, pydantic model, msgspec Struct, or any JSON type) decides
    how it is decoded. Coroutine functions run on the event loop; plain functions
    run in a thread pool.
    """

    def __init__(self) -> None:
        self._handlers: dict[str, Handler] = {}
        self.startup_hooks: list[Callable[[Any], Any]] = []
        self.shutdown_hooks: list[Callable[[Any], Any]] = []

    def on_startup(self, fn: F) -> F:
        """Register ``async def fn(pool)`` to run when a worker starts, before it
        claims anything (open clients, warm caches)."""
        self.startup_hooks.append(fn)
        return fn

    def on_shutdown(self, fn: F) -> F:
        """Register ``async def fn(pool)`` to run after a worker has drained."""
        self.shutdown_hooks.append(fn)
        return fn

    def job(
        self,
        name: str,
        *,
        timeout: float | None = None,
        infallible: bool = False,
        concurrency: int | None = None,
        rate: int | None = None,
        per: float = 1.0,
        per_key: bool = False,
        retry: RetryPolicy | None = None,
    ) -> Callable[[F], F]:
        """Decorator form of :meth:`register`."""

        def decorate(fn: F) -> F:
            self.register(
                name,
                fn,
                timeout=timeout,
                infallible=infallible,
                concurrency=concurrency,
                rate=rate,
                per=per,
                per_key=per_key,
                retry=retry,
            )
            return fn

        return decorate

    def register(
        self,
        name: str,
        fn: Callable[..., Any],
        *,
        timeout: float | None = None,
        infallible: bool = False,
        concurrency: int | None = None,
        rate: int | None = None,
        per: float = 1.0,
        per_key: bool = False,
        retry: RetryPolicy | None = None,
    ) -> Handler:
        """Register ``fn`` for job ``name``.

        ``timeout`` (seconds) overrides the worker's default handler timeout.
        ``infallible`` handlers absorb their own failures: an exception is logged
        and the job is still recorded as succeeded (for log-and-continue
        maintenance jobs whose next run comes from a schedule).
        ``concurrency``, ``rate``, ``per`` and ``per_key`` declare the name's
        default flow-control limits (see :meth:`pgfleet.Queue.set_limits`): every
        worker writes them before its first claim unless an operator has set the
        name's limits, which win.

        ``retry``: the handler's :class:`RetryPolicy` (which errors are retried, how
        many attempts, which backoff), over the worker's defaults.
        """
        validate_name(name)
        limits = None
        if concurrency is not None or rate is not None:
            limits = LimitSpec.check(
                concurrency=concurrency, rate=rate, per=per, per_key=per_key, where=name
            )
        if name in self._handlers:
            raise InvalidName(f"a handler for job name {name!r} is already registered")
        if not callable(fn):
            raise InvalidOptions(f"handler for {name!r} must be callable, got {type(fn).__name__}")
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0
        ):
            raise InvalidOptions(f"timeout for {name!r} must be a positive number of seconds")
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise InvalidOptions(f"retry for {name!r} must be a pgfleet.RetryPolicy")
        takes_payload, annotation = _inspect(name, fn)
        handler = Handler(
            name=name,
            fn=fn,
            is_async=inspect.iscoroutinefunction(fn)
            or inspect.iscoroutinefunction(getattr(fn, "__call__", None)),  # noqa: B004
            takes_payload=takes_payload,
            decode=decoder_for(annotation),
            timeout=None if timeout is None else float(timeout),
            infallible=infallible,
            limits=limits,
            retry=retry,
        )
        self._handlers[name] = handler
        return handler

    def names(self) -> frozenset[str]:
        return frozenset(self._handlers)

    def get(self, name: str) -> Handler | None:
        return self._handlers.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._handlers

    def __iter__(self) -> Iterator[Handler]:
        return iter(self._handlers.values())

    def __len__(self) -> int:
        return len(self._handlers)


def _inspect(name: str, fn: Callable[..., Any]) -> tuple[bool, Any]:
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return True, Any
    params = [
        p
        for p in signature.parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    if len(params) not in (1, 2):
        raise InvalidOptions(
            f"handler for {name!r} must take (job) or (job, payload), got {signature}"
        )
    if len(params) == 1:
        return False, Any
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception as exc:
        raise InvalidOptions(
            f"cannot resolve the annotations of the {name!r} handler: {exc}"
        ) from None
    return True, hints.get(params[1].name, Any)
