"""A TCP proxy between the workers and PostgreSQL whose faults the tests switch on.

It runs in the test's event loop and listens on 127.0.0.1. Faults:

- ``reset_all()``: every open connection is closed with a TCP RST (SO_LINGER 0), on
  both sides; ``mode = "reset"`` also resets each new connection as it arrives.
- ``partition()`` / ``heal()``: nothing is read from either side of any connection,
  new ones included, until healed; then the held traffic is delivered.
- ``hang()``: every open connection, and every new one until ``heal()``, stops
  forwarding for good: it stays open, answers nothing and is never closed (a hung
  server, a peer gone behind a NAT). ``heal()`` lets *new* connections through;
  the hung ones stay hung until the client gives up on them and closes them
  (``open_links()`` counts those it has not closed yet).
- ``refuse()`` / ``heal()``: the listening socket is closed (connection refused);
  healing listens again on the same port.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from dataclasses import dataclass, field


@dataclass(eq=False)
class Link:
    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter | None = None
    hung: bool = False
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


def _rst(writer: asyncio.StreamWriter | None) -> None:
    """Close with a TCP RST instead of a FIN."""
    if writer is None:
        return
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class ChaosProxy:
    def __init__(self, upstream_port: int, upstream_host: str = "127.0.0.1") -> None:
        self.upstream = (upstream_host, upstream_port)
        self.port = 0
        self.mode = "pass"
        self.links: set[Link] = set()
        self.accepted = 0
        self.accepted_while_healthy = 0
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._never: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._server: asyncio.Server | None = None

    async def start(self) -> int:
        self._server = await asyncio.start_server(
            self._accept, "127.0.0.1", self.port, reuse_address=True
        )
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for link in list(self.links):
            self._drop(link, rst=True)
        self._flowing.set()

    # --- faults ---------------------------------------------------------------

    def reset_all(self) -> int:
        """RST every open connection; returns how many there were."""
        links = list(self.links)
        for link in links:
            self._drop(link, rst=True)
        return len(links)

    def partition(self) -> None:
        self.mode = "partition"
        self._flowing.clear()

    def hang(self) -> int:
        """Hang every open connection for good, and new ones until healed."""
        self.mode = "hang"
        for link in self.links:
            link.hung = True
        return len(self.links)

    async def refuse(self) -> None:
        self.mode = "refuse"
        if self._server is not None:
            self._server.close()
            self._server = None

    async def heal(self) -> None:
        if self.mode == "refuse":
            self.mode = "pass"
            await self.start()
        self.mode = "pass"
        self._flowing.set()

    def open_links(self) -> tuple[int, int]:
        """(connections forwarding, connections hung)."""
        hung = sum(1 for link in self.links if link.hung)
        return len(self.links) - hung, hung

    # --- plumbing -------------------------------------------------------------

    def _drop(self, link: Link, rst: bool) -> None:
        self.links.discard(link)
        for task in link.tasks:
            task.cancel()
        for writer in (link.client, link.upstream):
            if writer is None:
                continue
            if rst:
                _rst(writer)
            else:
                writer.close()  # flushes what was written, then FIN

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        link = Link(client=writer, hung=self.mode == "hang")
        if self.mode == "reset":
            _rst(writer)
            return
        if self.mode == "pass":
            self.accepted_while_healthy += 1
        self.links.add(link)
        if link.hung:
            # Never connected upstream, never answered; only its closing is noticed.
            link.tasks = [asyncio.create_task(self._pump(link, reader, None))]
            return
        try:
            await self._flowing.wait()
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except asyncio.CancelledError:
            return
        except OSError:
            # The upstream server is down: the client sees its connection reset,
            # as it would if it had connected to the server directly.
            self._drop(link, rst=True)
            return
        link.upstream = up_writer
        if link not in self.links:  # reset or closed meanwhile
            _rst(up_writer)
            return
        link.tasks = [
            asyncio.create_task(self._pump(link, reader, up_writer)),
            asyncio.create_task(self._pump(link, up_reader, writer, from_server=True)),
        ]

    async def _pump(
        self,
        link: Link,
        src: asyncio.StreamReader,
        dst: asyncio.StreamWriter | None,
        from_server: bool = False,
    ) -> None:
        """Copy src to dst while the link flows. Once hung, what the server sends is
        never delivered, and what the client sends is read and dropped (a hung peer's
        kernel still acknowledges it), so that the client closing it is noticed."""
        try:
            while True:
                if not link.hung:
                    await self._flowing.wait()
                elif from_server:
                    await self._never
                data = await src.read(65536)
                if not data:
                    break
                if not link.hung:
                    await self._flowing.wait()  # a partition holds what was read
                if link.hung:
                    if from_server:
                        await self._never
                    continue
                assert dst is not None
                dst.write(data)
                await dst.drain()
        except asyncio.CancelledError:
            return
        except OSError:
            if link in self.links:
                self._drop(link, rst=True)
            return
        if link in self.links:
            self._drop(link, rst=False)
