"""Redaction of what the jobs API and the console show: payload fields and the
same fields inside error texts.

``--redact-fields`` (``PGFLEET_REDACT_FIELDS``) names payload keys whose values are
replaced by ``"[redacted]"`` wherever they appear (nested objects and lists
included, case-insensitive), and whose ``key=value`` / ``"key": "value"`` pairs are
masked in errors. ``--redact-hook module:attribute`` adds an application's own
rule: an object with ``payload(name, payload) -> payload`` and/or
``error(name, text) -> text`` methods, or a function ``(name, payload) -> payload``.
Both run on what is shown, never on what is stored or run.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

MASK = "[redacted]"
#: Keys masked unless --redact-fields says otherwise.
DEFAULT_FIELDS = (
    "password",
    "passwd",
    "secret",
    "token",
    "access_token",
    "refresh_token",
    "api_key",
    "apikey",
    "authorization",
    "private_key",
    "card_number",
    "cvv",
    "ssn",
)


def parse_fields(text: str | None) -> tuple[str, ...]:
    """``--redact-fields``: comma-separated keys; unset gives the defaults, ``none``
    (or an empty value) none at all."""
    if text is None:
        return DEFAULT_FIELDS
    if text.strip().lower() in ("", "none"):
        return ()
    return tuple(sorted({f.strip() for f in text.split(",") if f.strip()}))


class Redactor:
    def __init__(self, fields: Iterable[str] = DEFAULT_FIELDS, hook: Any = None) -> None:
        self.fields = frozenset(f.lower() for f in fields)
        keys = "|".join(re.escape(f) for f in sorted(self.fields, key=len, reverse=True))
        # key, then = or : (quoted or not), then a quoted string or a bare value.
        self._in_text = (
            re.compile(
                rf"""(?i)(["']?\b(?:{keys})\b["']?\s*[:=]\s*)("[^"]*"|'[^']*'|[^\s,;&}}\]]+)"""
            )
            if keys
            else None
        )
        self._payload_hook: Callable[[str, Any], Any] | None = None
        self._error_hook: Callable[[str, str], str] | None = None
        if hook is not None:
            payload = getattr(hook, "payload", None)
            error = getattr(hook, "error", None)
            if payload is None and error is None:
                if not callable(hook):
                    raise TypeError(
                        "--redact-hook must be a function (name, payload) -> payload or an "
                        "object with payload() and/or error() methods"
                    )
                payload = hook
            self._payload_hook = payload
            self._error_hook = error

    def payload(self, name: str, payload: Any) -> Any:
        shown = self._mask(payload) if self.fields else payload
        if self._payload_hook is not None:
            shown = self._payload_hook(name, shown)
        return shown

    def error(self, name: str, text: str | None) -> str | None:
        if text is None:
            return None
        shown = text
        if self._in_text is not None:
            shown = self._in_text.sub(lambda m: m.group(1) + MASK, shown)
        if self._error_hook is not None:
            shown = str(self._error_hook(name, shown))
        return shown

    def _mask(self, value: Any) -> Any:
        if isinstance(value, dict):
            return {
                k: MASK if isinstance(k, str) and k.lower() in self.fields else self._mask(v)
                for k, v in value.items()
            }
        if isinstance(value, list):
            return [self._mask(v) for v in value]
        return value


#: Shows everything as it is.
NOTHING = Redactor(())
