"""Console sessions: rows in ``pgfleet.console_sessions`` that every replica reads.

Signing in with a credential's secret creates a session: the cookie carries 32
random bytes, the database keeps their SHA-256, the credential's name and the
session's CSRF token (a synchronizer token, sent back in every form). Every
console request looks the session up (and marks it seen), so a logout, a
revocation of its credential, its idle timeout or its absolute end take effect
on the next request, on every replica. A session also ends when its credential
is no longer configured or its secret changed.

The login form carries its own CSRF token, equal to a short-lived pre-login cookie
(double submit: another site can neither read that cookie nor send it, as it is
``SameSite=Strict``). Every comparison is constant-time.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

from pgfleet.db.deadlines import AppPool
from pgfleet.db.store import Store
from pgfleet.service.credentials import Credential, Credentials

SESSION_COOKIE = "pgfleet_console"
LOGIN_COOKIE = "pgfleet_console_login"
CSRF_FIELD = "csrf"
LOGIN_CSRF_FIELD = "login_csrf"
COOKIE_PATH = "/ui"
LOGIN_LIFETIME = 600


@dataclass(frozen=True, slots=True)
class Session:
    """A signed-in console request."""

    #: SHA-256 of the cookie's secret: the session's key in the database.
    id: bytes
    credential: Credential
    csrf: str
    #: The outcome of the last action, shown once.
    notice: str | None
    #: Seconds left of its absolute lifetime.
    remaining: float

    def csrf_ok(self, given: str | None) -> bool:
        return bool(given) and hmac.compare_digest(str(given).encode(), self.csrf.encode())


def _key(cookie: str) -> bytes:
    return hashlib.sha256(cookie.encode("utf-8", "surrogateescape")).digest()


class Sessions:
    """Opens, finds and ends console sessions for one set of credentials."""

    def __init__(
        self, pool: AppPool, credentials: Credentials, *, lifetime: float, idle: float
    ) -> None:
        self._store = Store(pool)
        self.credentials = credentials
        self.lifetime = lifetime
        self.idle = idle

    async def open(self, credential: Credential) -> str:
        """A new session of ``credential``; the cookie value."""
        cookie = secrets.token_urlsafe(32)
        await self._store.session_create(
            id=_key(cookie),
            credential=credential.name,
            credential_digest=credential.digest,
            csrf=secrets.token_urlsafe(24),
            lifetime=self.lifetime,
            idle=max(1, round(self.idle)),
        )
        return cookie

    async def find(self, cookie: str | None) -> Session | None:
        """The live session of a cookie, marked seen; None when there is none (never
        was, logged out, expired, idle too long, credential revoked or changed)."""
        if not cookie or len(cookie) > 200:
            return None
        key = _key(cookie)
        state = await self._store.session_touch(id=key)
        if state is None:
            return None
        credential = self.credentials.named(state.credential)
        if credential is None or not hmac.compare_digest(
            credential.digest, state.credential_digest
        ):
            return None
        return Session(key, credential, state.csrf, state.notice, state.remaining)

    async def close(self, session: Session) -> None:
        await self._store.session_delete(id=session.id)

    async def notice(self, session: Session, text: str) -> None:
        """Show ``text`` on the session's next page (once)."""
        await self._store.session_notice_set(id=session.id, notice=text)


def login_nonce() -> str:
    return secrets.token_urlsafe(18)


def login_csrf_ok(cookie: str | None, given: str | None) -> bool:
    return (
        bool(cookie)
        and bool(given)
        and hmac.compare_digest(str(cookie).encode(), str(given).encode())
    )
