"""``pgfleet api`` flags of the operator console (/ui). Standard library only: the
parser is built for every ``pgfleet`` command."""

from __future__ import annotations

import argparse
from typing import Any

from pgfleet.service.process import env_default

_OFF = ("0", "false", "no", "off")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--no-ui",
        dest="ui",
        action="store_false",
        default=str(env_default("API_UI", "1")).strip().lower() not in _OFF,
        help="do not serve the operator console under /ui [PGFLEET_API_UI=0] "
        "(default: served; it signs in with the API token and refuses every page "
        "while the API has none)",
    )
    parser.add_argument(
        "--ui-hide-payloads",
        action="store_true",
        default=str(env_default("UI_HIDE_PAYLOADS", "")).strip().lower() not in ("", *_OFF),
        help="never show job payloads in the console [PGFLEET_UI_HIDE_PAYLOADS]",
    )


def build(args: argparse.Namespace, token: str | None, metrics_holder: Any) -> Any:
    """The Console for these flags, or None when it is off."""
    if not args.ui:
        return None
    from pgfleet.service.console.app import Console, ConsoleConfig  # lazy: optional extra (aiohttp)

    config = ConsoleConfig(token=token, payloads=not args.ui_hide_payloads)
    return Console(config, metrics_holder=metrics_holder)
