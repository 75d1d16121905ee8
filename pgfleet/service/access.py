"""The access checks the jobs API and the console share: who the client is, which
credential a request carries, whether its role allows the endpoint, how fast a
client may keep failing, and the audit log that names who did what.

Audit lines go to the logger ``pgfleet.audit``, each naming the credential (or
``anonymous`` when authentication is off) and the client's address.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from pgfleet.service.credentials import (
    ANONYMOUS,
    Access,
    Credential,
    Credentials,
)
from pgfleet.service.guard import AllowedHosts, FailureBackoff, Peer, TrustedProxies
from pgfleet.service.revocations import Revocations

audit_log = logging.getLogger("pgfleet.audit")


class AccessDenied(Exception):
    """A request refused before it reached its handler."""

    def __init__(self, status: int, message: str, headers: Mapping[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = dict(headers or {})


@dataclass(frozen=True, slots=True)
class AccessConfig:
    credentials: Credentials = field(default_factory=lambda: Credentials(()))
    proxies: TrustedProxies = field(default_factory=TrustedProxies)
    #: Host names requests may carry; None: any (credentials guard the API).
    allowed_hosts: AllowedHosts | None = None
    #: Mark the console's cookies Secure whatever the request's scheme.
    secure_cookies: bool = False
    #: Console sessions: absolute and idle lifetimes, in seconds.
    session_lifetime: float = 12 * 3600
    session_idle: float = 30 * 60

    @property
    def auth(self) -> bool:
        return bool(self.credentials)


class Gate:
    """Authentication and authorization for one ``pgfleet api`` process."""

    def __init__(
        self,
        config: AccessConfig,
        revocations: Revocations | None = None,
        backoff: FailureBackoff | None = None,
    ) -> None:
        self.config = config
        self.credentials = config.credentials
        self.revocations = revocations
        self.backoff = backoff or FailureBackoff()

    @property
    def auth(self) -> bool:
        return self.config.auth

    def peer(
        self, remote: str | None, scheme: str, host: str | None, headers: Mapping[str, str]
    ) -> Peer:
        return self.config.proxies.peer(remote, scheme, host, headers)

    def check_host(self, peer: Peer) -> None:
        allowed = self.config.allowed_hosts
        if allowed is not None and not allowed.allows(peer.host):
            raise AccessDenied(
                421,
                f"host {peer.host!r} is not one this API answers for: add it to "
                "--allowed-hosts (PGFLEET_API_ALLOWED_HOSTS)",
            )

    def throttle(self, peer: Peer) -> None:
        """Refuse a client still paused after repeated failures (429)."""
        wait = self.backoff.retry_after(peer.address)
        if wait:
            raise AccessDenied(
                429,
                f"too many failed authentications from this client: retry in {wait}s",
                {"Retry-After": str(wait)},
            )

    async def identify(self, secret: str, peer: Peer, what: str) -> Credential | None:
        """The credential of ``secret`` unless revoked; failures are counted per
        client and logged. Call :meth:`throttle` first."""
        credential = self.credentials.authenticate(secret) if secret else None
        revocations = self.revocations
        if credential is not None and revocations and await revocations.revoked(credential.name):
            audit_log.warning(
                "refused revoked credential %s from %s (%s)", credential.name, peer.address, what
            )
            credential = None
        if credential is None:
            pause = self.backoff.failed(peer.address)
            failures = self.backoff.failures(peer.address)
            audit_log.warning(
                "failed %s from %s (%d in a row%s)",
                what,
                peer.address,
                failures,
                f"; paused {pause}s" if pause else "",
            )
            return None
        self.backoff.succeeded(peer.address)
        return credential

    async def bearer(self, authorization: str | None, peer: Peer, access: Access) -> Credential:
        """The credential of an ``Authorization: Bearer`` header allowed ``access``."""
        if access is Access.PUBLIC:
            return ANONYMOUS
        if not self.auth:
            return ANONYMOUS
        self.throttle(peer)
        scheme, _, token = (authorization or "").partition(" ")
        secret = token.strip() if scheme.lower() == "bearer" else ""
        credential = await self.identify(secret, peer, "bearer authentication")
        if credential is None:
            raise AccessDenied(
                401,
                "missing or invalid bearer token: send Authorization: Bearer <token>",
                {"WWW-Authenticate": 'Bearer realm="pgfleet"'},
            )
        self.authorize(credential, access, peer, "")
        return credential

    def authorize(self, credential: Credential, access: Access, peer: Peer, what: str) -> None:
        if not credential.role.allows(access):
            audit_log.warning(
                "refused %s (%s) from %s: its role may not %s%s",
                credential.name,
                credential.role.value,
                peer.address,
                access.value.replace("_", " "),
                f" ({what})" if what else "",
            )
            raise AccessDenied(
                403,
                f"credential {credential.name!r} has the {credential.role.value} role, "
                f"which may not {access.value.replace('_', ' ')}",
            )


def audit(who: Credential, peer: Peer, action: str, *args: object) -> None:
    """One audit line: ``<name> (<role>) from <address>: <action>``."""
    audit_log.info("%s (%s) from %s: " + action, who.name, who.role.value, peer.address, *args)
