"""The development kit (tools/devkit/): database names are checked before they reach
DDL, and a guarded child ends when its parent is killed."""

from __future__ import annotations

import asyncio
import signal
import sys

import pytest

from tests.procs import alive, cmdline
from tools.devkit import guarded, quoted, until


@pytest.mark.parametrize("name", ["", "Upper", "1x", 'a"b', "a;drop", "x" * 64])
def test_database_names_are_checked_before_ddl(name: str) -> None:
    with pytest.raises(ValueError, match="database name"):
        quoted(name)


def test_a_plain_name_is_quoted() -> None:
    assert quoted("pgfleet_t1") == '"pgfleet_t1"'


PARENT = r"""
import asyncio, sys
from tools.devkit import guarded

async def main():
    child = await asyncio.create_subprocess_exec(*guarded(["sleep", "300"]))
    print(child.pid, flush=True)
    await child.wait()

asyncio.run(main())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.asyncio(loop_factories=["asyncio"])
async def test_a_guarded_child_ends_when_its_parent_is_killed() -> None:
    parent = await asyncio.create_subprocess_exec(
        sys.executable, "-c", PARENT, stdout=asyncio.subprocess.PIPE
    )
    assert parent.stdout is not None
    child_pid = int(await asyncio.wait_for(parent.stdout.readline(), 60))

    async def execed() -> bool:  # past the guard: the pid now runs the real command
        return cmdline(child_pid)[:1] == ["sleep"]

    await until(execed, 60, "the guarded child to exec")
    parent.send_signal(signal.SIGKILL)  # no chance to stop its child itself
    await parent.wait()

    async def gone() -> bool:
        return not alive(child_pid)

    await until(gone, 60, "the orphaned child to end")
    assert guarded(["x"])[-1] == "x"
