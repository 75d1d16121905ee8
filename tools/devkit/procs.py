"""Child processes for development tools: free ports, die-with-parent, stopping.

Die-with-parent: :func:`guarded` (pgfleet's own: the supervisor uses it too) wraps a
command so that the child asks the kernel
for SIGTERM when its parent dies (``prctl(PR_SET_PDEATHSIG)``, Linux), then
``exec``\\ s the real command in the same process (same pid; the request survives
``exec``). The request is made by a tiny Python program *in the child*, not by a
``preexec_fn``: ``preexec_fn`` runs Python between ``fork`` and ``exec`` in a copy
of a parent that may have threads (asyncio's executor, the embedded server's
waiter), where a lock held by another thread at fork time stays locked forever;
CPython documents it as unsafe with threads. The wrapper also works with
``start_new_session``/``process_group`` (the death signal follows the parent, not
the group), and checks the parent is still the one that started it (a parent that
died before the request would otherwise go unnoticed).

Caveat: the kernel sends the signal when the parent *thread* that forked the child
ends. Start guarded children from a long-lived thread (the event loop's), not from
a short-lived worker thread. Elsewhere than Linux, :func:`guarded` returns the
command unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import socket
from pathlib import Path

from pgfleet.service.process import guarded as guarded


def describe_exit(code: int) -> str:
    """'exit code 3' or 'signal SIGKILL', from a returncode."""
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"signal {signal.Signals(-code).name}"
    return f"exit code {code}"


async def stop(
    process: asyncio.subprocess.Process,
    timeout: float,
    *,
    sig: int = signal.SIGTERM,
    again_after: float | None = None,
) -> int:
    """Send ``sig`` and wait ``timeout`` seconds; send it once more and wait
    ``again_after`` seconds when given (pgfleet processes stop at once on a second
    signal); then SIGKILL. Returns the exit code."""
    steps: list[tuple[int, float]] = [(sig, timeout)]
    if again_after is not None:
        steps.append((sig, again_after))
    for step_sig, wait in steps:
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(step_sig)
        with contextlib.suppress(TimeoutError):
            return await asyncio.wait_for(process.wait(), wait)
    with contextlib.suppress(ProcessLookupError):
        process.kill()
    return await process.wait()


def free_port() -> int:
    """A port free right now (the kernel's pick, in the ephemeral range)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_ports(n: int) -> int:
    """The first of ``n`` consecutive free ports, below the ephemeral range: a port
    from that range can become the source port of any outgoing connection (to
    PostgreSQL, say) between this check and the server binding it."""
    low = _ephemeral_low()
    for _ in range(200):
        base = random.randrange(10000, max(low - n, 10001))
        ok = True
        for p in range(base, base + n):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError("no run of free ports")
