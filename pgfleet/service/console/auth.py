"""Console sessions and CSRF tokens, derived from the API token.

A session is a signed cookie: ``<expiry>.<nonce>.<mac>``, the MAC keyed by a key
derived from the API token. Nothing is stored server-side, so every ``pgfleet api``
replica sharing the token accepts it, and changing the token ends every session.
The CSRF token of a session is another MAC of its nonce (a synchronizer token
that needs no storage); the login form has its own, bound to a short-lived
pre-login cookie. Every comparison is constant-time.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time

SESSION_COOKIE = "pgfleet_console"
LOGIN_COOKIE = "pgfleet_console_login"
CSRF_FIELD = "csrf"
LOGIN_CSRF_FIELD = "login_csrf"
COOKIE_PATH = "/ui"
LOGIN_LIFETIME = 600


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


class Sessions:
    """Issues and checks session cookies and CSRF tokens for one API token."""

    def __init__(self, token: str, lifetime: float) -> None:
        self._key = hmac.new(token.encode("utf-8"), b"pgfleet console v1", hashlib.sha256).digest()
        self._token_digest = hashlib.sha256(token.encode("utf-8")).digest()
        self.lifetime = lifetime

    def _mac(self, purpose: str, value: str) -> str:
        return _b64(hmac.new(self._key, f"{purpose}:{value}".encode(), hashlib.sha256).digest())

    def token_matches(self, given: str) -> bool:
        digest = hashlib.sha256(given.strip().encode("utf-8", "surrogateescape")).digest()
        return hmac.compare_digest(digest, self._token_digest)

    # ------------------------------------------------------------ sessions

    def issue(self, now: float | None = None) -> str:
        expires = int((time.time() if now is None else now) + self.lifetime)
        body = f"{expires}.{secrets.token_urlsafe(18)}"
        return f"{body}.{self._mac('session', body)}"

    def session_id(self, cookie: str | None, now: float | None = None) -> str | None:
        """The nonce of a valid, unexpired session cookie, else None."""
        if not cookie or cookie.count(".") != 2:
            return None
        expires, nonce, mac = cookie.split(".")
        body = f"{expires}.{nonce}"
        if not hmac.compare_digest(mac.encode(), self._mac("session", body).encode()):
            return None
        try:
            if int(expires) < (time.time() if now is None else now):
                return None
        except ValueError:
            return None
        return nonce

    def csrf(self, session_id: str) -> str:
        return self._mac("csrf", session_id)

    def csrf_ok(self, session_id: str, given: str | None) -> bool:
        return bool(given) and hmac.compare_digest(
            str(given).encode(), self.csrf(session_id).encode()
        )

    # ------------------------------------------------------------ login form

    @staticmethod
    def login_nonce() -> str:
        return secrets.token_urlsafe(18)

    def login_csrf(self, nonce: str) -> str:
        return self._mac("login", nonce)

    def login_csrf_ok(self, nonce: str | None, given: str | None) -> bool:
        return (
            bool(nonce)
            and bool(given)
            and hmac.compare_digest(str(given).encode(), self.login_csrf(str(nonce)).encode())
        )
