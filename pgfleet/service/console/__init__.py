"""The operator console served by ``pgfleet api`` under /ui (see app.py)."""

from pgfleet.service.console.app import Console, ConsoleConfig

__all__ = ["Console", "ConsoleConfig"]
