"""``pgfleet api`` flags of the operator console (/ui). Standard library only: the
parser is built for every ``pgfleet`` command."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from pgfleet.service.process import env_default, env_flag

_OFF = ("0", "false", "no", "off")

# (flag, env suffix, default seconds, low, high, help)
_LIFETIMES: tuple[tuple[str, str, float, float, float, str], ...] = (
    (
        "--ui-session-lifetime",
        "UI_SESSION_LIFETIME",
        12 * 3600.0,
        60.0,
        30 * 86400.0,
        "seconds a console session lasts at most, however active",
    ),
    (
        "--ui-session-idle",
        "UI_SESSION_IDLE",
        30 * 60.0,
        60.0,
        30 * 86400.0,
        "seconds without a request after which a console session ends",
    ),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--no-ui",
        dest="ui",
        action="store_false",
        default=str(env_default("API_UI", "1")).strip().lower() not in _OFF,
        help="do not serve the operator console under /ui [PGFLEET_API_UI=0] "
        "(default: served; it signs in with a viewer or operator credential and refuses "
        "every page while the API has none)",
    )
    parser.add_argument(
        "--ui-hide-payloads",
        action="store_true",
        default=str(env_default("UI_HIDE_PAYLOADS", "")).strip().lower() not in ("", *_OFF),
        help="never show job payloads in the console, not even to operators "
        "[PGFLEET_UI_HIDE_PAYLOADS]",
    )
    parser.add_argument(
        "--ui-secure-cookies",
        action="store_true",
        default=env_flag("UI_SECURE_COOKIES"),
        help="always mark the console's cookies Secure (behind a TLS proxy that is not "
        "in --trusted-proxies) [PGFLEET_UI_SECURE_COOKIES] (default: Secure when the "
        "request came over https, directly or through a trusted proxy)",
    )
    for flag, env, default, _low, _high, text in _LIFETIMES:
        parser.add_argument(
            flag,
            default=env_default(env, default),
            help=f"{text} [PGFLEET_{env}] (default {default:g})",
        )


def check(args: argparse.Namespace, fail: Callable[[str], Exception]) -> None:
    """Convert the lifetimes to numbers, or exit naming the flag."""
    for flag, _env, _default, low, high, _text in _LIFETIMES:
        name = flag[2:].replace("-", "_")
        value = getattr(args, name)
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise fail(f"{flag} must be a number of seconds, got {value!r}") from None
        if not low <= number <= high:
            raise fail(f"{flag} must be from {low:g} to {high:g} seconds, got {number:g}")
        setattr(args, name, number)
    if args.ui_session_idle > args.ui_session_lifetime:
        raise fail("--ui-session-idle must not be longer than --ui-session-lifetime")


def build(args: argparse.Namespace, gate: Any, redactor: Any, metrics_holder: Any) -> Any:
    """The Console for these flags, or None when it is off."""
    if not args.ui:
        return None
    from pgfleet.service.console.app import Console, ConsoleConfig  # lazy: optional extra (aiohttp)

    config = ConsoleConfig(payloads=not args.ui_hide_payloads, redactor=redactor)
    return Console(config, gate, metrics_holder=metrics_holder)
