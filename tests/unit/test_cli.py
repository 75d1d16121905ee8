"""Every command's --help speaks only of its own flags, and names the variable
behind each (a flag's help that points at another command's flag sends a user
looking for something that is not there)."""

from __future__ import annotations

import argparse
import re

import pytest

from pgfleet.cli import build_parser

_FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def _commands() -> dict[str, argparse.ArgumentParser]:
    """Every parser a user can ask --help of: `pgfleet X` and `pgfleet jobs Y`."""
    found: dict[str, argparse.ArgumentParser] = {}

    def walk(prefix: str, parser: argparse.ArgumentParser) -> None:
        found[prefix] = parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(f"{prefix} {name}", sub)

    walk("pgfleet", build_parser())
    return found


COMMANDS = _commands()


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_help_mentions_only_flags_the_command_has(command: str) -> None:
    parser = COMMANDS[command]
    own = {flag for action in parser._actions for flag in action.option_strings}
    for action in parser._actions:
        text = action.help or ""
        for flag in _FLAG.findall(text):
            assert flag in own, f"`{command} --help`: {action.option_strings} mentions {flag}"


def test_the_api_says_what_app_turns_on() -> None:
    (app,) = [a for a in COMMANDS["pgfleet api"]._actions if "--app" in a.option_strings]
    assert app.help is not None
    assert "422" in app.help and "--strict" in app.help and "--no-payload-check" in app.help


def test_the_catch_finds_a_foreign_flag() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pgbouncer", help="LISTEN only on --listen-dsn")
    own = {f for a in parser._actions for f in a.option_strings}
    assert [f for f in _FLAG.findall("LISTEN only on --listen-dsn") if f not in own] == [
        "--listen-dsn"
    ]


def test_version_names_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    from pgfleet import __version__

    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"pgfleet {__version__}"
