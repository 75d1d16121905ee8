"""What ``pgfleet api`` checks before it looks at credentials: who the client is
(behind trusted proxies only), which Host names it answers, and how fast one client
may keep failing to authenticate.

Standard library only.
"""

from __future__ import annotations

import ipaddress
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

#: Host names a server bound to loopback answers without configuration.
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")


# ---------------------------------------------------------------- trusted proxies


def parse_networks(text: str | None, what: str) -> tuple[Network, ...]:
    """``10.0.0.0/8, 192.168.1.7, ::1`` as networks; raises ValueError naming ``what``."""
    found: list[Network] = []
    for part in (text or "").replace(" ", ",").split(","):
        if not part:
            continue
        try:
            found.append(ipaddress.ip_network(part, strict=False))
        except ValueError:
            raise ValueError(
                f"{what}: {part!r} is not an IP address or network (e.g. 10.0.0.0/8)"
            ) from None
    return tuple(found)


@dataclass(frozen=True, slots=True)
class Peer:
    """The client as the API sees it."""

    #: The client's address: the peer's, or what a trusted proxy forwarded.
    address: str
    #: "https" when the client reached a trusted TLS proxy (or the API serves TLS).
    scheme: str
    #: The host the client asked for (a trusted proxy's X-Forwarded-Host, else Host).
    host: str | None

    @property
    def secure(self) -> bool:
        return self.scheme == "https"


class TrustedProxies:
    """Forwarded headers (``X-Forwarded-For``, ``-Proto``, ``-Host``) are believed only
    from these addresses: anyone else could write them."""

    def __init__(self, networks: Iterable[Network] = ()) -> None:
        self.networks = tuple(networks)

    def trusts(self, address: str | None) -> bool:
        if not address or not self.networks:
            return False
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        return any(ip in net for net in self.networks)

    def peer(
        self, remote: str | None, scheme: str, host: str | None, headers: Mapping[str, str]
    ) -> Peer:
        """Who sent a request that arrived from ``remote``."""
        address = remote or "unknown"
        if not self.trusts(remote):
            return Peer(address, scheme, host)
        # The client is the right-most address a trusted hop did not add: every proxy
        # appends the address it saw, and only our own proxies are believed.
        hops = [h.strip() for h in headers.get("X-Forwarded-For", "").split(",") if h.strip()]
        while hops and self.trusts(hops[-1]):
            address = hops.pop()
        if hops:
            address = hops[-1]
        proto = _last(headers.get("X-Forwarded-Proto"))
        if proto in ("http", "https"):
            scheme = proto
        forwarded_host = _last(headers.get("X-Forwarded-Host"))
        return Peer(address, scheme, forwarded_host or host)


def _last(value: str | None) -> str | None:
    if not value:
        return None
    return value.split(",")[-1].strip().lower() or None


# ---------------------------------------------------------------- allowed hosts


class AllowedHosts:
    """The Host names requests may carry. A browser tricked by DNS rebinding sends
    the attacker's name as Host: refusing names not on the list stops it reaching
    an API without credentials."""

    def __init__(self, names: Iterable[str]) -> None:
        cleaned = {n.strip().lower().strip("[]") for n in names if n.strip()}
        self.any = "*" in cleaned
        self.names = frozenset(cleaned - {"*"})

    @classmethod
    def parse(cls, text: str | None, bind_host: str) -> AllowedHosts:
        """``--allowed-hosts``; by default the loopback names and the address the
        API is bound to (unless that is a wildcard)."""
        if text and text.strip():
            return cls(text.replace(" ", ",").split(","))
        names = list(LOOPBACK_HOSTS)
        if bind_host not in ("0.0.0.0", "::", ""):
            names.append(bind_host)
        return cls(names)

    def allows(self, host_header: str | None) -> bool:
        if self.any:
            return True
        if not host_header:
            return False
        return host_name(host_header) in self.names


def host_name(host_header: str) -> str:
    """``example.com:8000`` → ``example.com``; ``[::1]:8000`` → ``::1``."""
    host = host_header.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host[1:]
    if host.count(":") == 1:
        host = host.split(":", 1)[0]
    return host.rstrip(".")


# ---------------------------------------------------------------- failure backoff


@dataclass(slots=True)
class _Record:
    failures: int
    #: Monotonic time before which this client's attempts are refused unanswered.
    blocked_until: float
    last: float


class FailureBackoff:
    """Per client, the failed authentications (bad bearer tokens, wrong logins) and a
    growing pause after them: the first ``free`` failures cost nothing, each one
    after doubles the pause (``base`` seconds first, at most ``cap``). During a
    pause every attempt of that client, right or wrong, is refused with 429 and
    ``Retry-After`` without being checked, so guessing runs at the pace of the
    pauses however many requests run in parallel. A success clears the record; a
    client quiet for ``forget`` seconds starts afresh. At most ``max_clients``
    records are kept (the oldest go first), so the table cannot grow without bound.
    """

    def __init__(
        self,
        *,
        free: int = 5,
        base: float = 1.0,
        cap: float = 300.0,
        forget: float = 900.0,
        max_clients: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.free = free
        self.base = base
        self.cap = cap
        self.forget = forget
        self.max_clients = max_clients
        self._clock = clock
        self._records: OrderedDict[str, _Record] = OrderedDict()

    def retry_after(self, client: str) -> int:
        """Seconds this client must wait before it may try again; 0: it may now."""
        record = self._records.get(client)
        if record is None:
            return 0
        now = self._clock()
        if now - record.last > self.forget:
            del self._records[client]
            return 0
        return max(0, math.ceil(record.blocked_until - now))

    def failed(self, client: str) -> int:
        """Count a failure; the pause it starts, in seconds (0: none yet)."""
        now = self._clock()
        record = self._records.pop(client, None)
        if record is None or now - record.last > self.forget:
            record = _Record(0, 0.0, now)
        record.failures += 1
        record.last = now
        pause = 0.0
        if record.failures > self.free:
            pause = min(self.cap, self.base * 2 ** (record.failures - self.free - 1))
            record.blocked_until = now + pause
        self._records[client] = record
        while len(self._records) > self.max_clients:
            self._records.popitem(last=False)
        return math.ceil(pause)

    def succeeded(self, client: str) -> None:
        self._records.pop(client, None)

    def failures(self, client: str) -> int:
        record = self._records.get(client)
        return 0 if record is None else record.failures
