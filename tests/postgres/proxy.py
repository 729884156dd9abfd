"""A TCP proxy in front of a test's own PostgreSQL cluster, to play a network partition:
``blackhole()`` keeps every socket open but stops carrying bytes (and accepts new
connections without ever answering them), as a cable pulled or a firewall dropping
packets does; ``cut()`` resets every connection; ``heal()`` carries bytes again.

It runs its own event loop in a thread, so a test whose loop is busy (or stuck) cannot
slow the proxy down.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Coroutine
from typing import Any

__all__ = ["Proxy"]


class Proxy:
    """``127.0.0.1:<port>`` → ``127.0.0.1:<target>``; see the module docstring."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._holes = False
        self._healed = asyncio.Event()
        self._pairs: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = False
        self.port = 0

    # -- control (from any thread) ---------------------------------------------------------
    def start(self) -> None:
        self._thread.start()
        self._call(self._start())

    def blackhole(self) -> None:
        """Stop carrying bytes, both ways, on every connection, old and new."""
        self._call(self._set(True))

    def heal(self) -> None:
        """Carry bytes again (what was held back is delivered)."""
        self._call(self._set(False))

    def cut(self) -> None:
        """Reset every connection now (new ones are carried as usual)."""
        self._call(self._cut())

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._call(self._close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def _call(self, coro: Coroutine[Any, Any, None]) -> None:
        asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    # -- the loop's side -------------------------------------------------------------------
    async def _start(self) -> None:
        self._healed.set()
        self._server = await asyncio.start_server(self._client, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _set(self, holes: bool) -> None:
        self._holes = holes
        if holes:
            self._healed.clear()
        else:
            self._healed.set()

    async def _cut(self) -> None:
        for a, b in list(self._pairs):
            for w in (a, b):
                sock = w.get_extra_info("socket")
                if sock is not None:  # RST, not FIN: an abrupt end
                    with contextlib.suppress(OSError):
                        sock.setsockopt(
                            socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
                        )
                w.transport.abort()
        self._pairs.clear()

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
        self._closing = True
        self._healed.set()  # what waits for the network to heal ends now
        await self._cut()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5)

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        await self._healed.wait()  # a blackholed proxy accepts but never answers
        if self._closing:
            writer.transport.abort()
            return
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.transport.abort()
            return
        pair = (writer, up_w)
        self._pairs.add(pair)
        try:
            await asyncio.gather(self._pipe(reader, up_w), self._pipe(up_r, writer))
        finally:
            self._pairs.discard(pair)
            for w in pair:
                w.transport.abort()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                await self._healed.wait()  # held back while blackholed
                writer.write(data)
                await writer.drain()
        writer.transport.abort()
