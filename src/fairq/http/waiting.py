"""A cap on the requests that wait: topic streams (SSE), long polls and blocked sends.

A waiting request costs the server almost nothing per second but holds a connection, a
task and a waiter for up to 20 s (a stream: for as long as the client likes), and they
all share one event loop: an outside review had 200 concurrent 2 s long polls take up to
4 s. Past ``max_waiting`` (default 100 per server, ``--max-waiting``) a request that would
wait is answered at once with ``503 server_busy`` and ``Retry-After: 1``; requests that do
not wait (``wait`` 0, ``timeout`` 0, everything else) are never counted nor refused.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from ..backends.base import STOP_WAITING, WaitInterrupted

__all__ = [
    "MAX_WAITING",
    "ClientGone",
    "Holding",
    "ShuttingDown",
    "WaitSlots",
    "disconnected",
    "may_wait",
    "waits",
]

T = TypeVar("T")


class ShuttingDown(Exception):
    """The server began to stop while the request waited (``WaitSlots.run``)."""


class ClientGone(Exception):
    """The client closed its connection while its request waited (``WaitSlots.run``)."""


async def disconnected(receive: Receive) -> None:
    """Return when the client has gone (``http.disconnect``); call it after the request's
    body was read, so the only message left to come is that one."""
    while (await receive())["type"] != "http.disconnect":
        pass


#: the default most requests waiting at once in one server
MAX_WAITING = 100
#: seconds a waiting request's work may run on once the server stops (an engine call on
#: its way), before it is cancelled
STOP_GRACE = 1.0
# request body fields whose positive value makes a request wait (seconds)
_WAIT_FIELDS = ("wait", "timeout")


def may_wait(stream: bool, body: type | None) -> bool:
    """True for operations that can wait: streams, and bodies with ``wait``/``timeout``."""
    if stream:
        return True
    fields = getattr(body, "__struct_fields__", ())
    return any(f in fields for f in _WAIT_FIELDS)


def waits(stream: bool, body: Any) -> bool:
    """True if this request waits: a stream, or a positive ``wait``/``timeout``."""
    if stream:
        return True
    return any(isinstance(v := getattr(body, f, 0), int | float) and v > 0 for f in _WAIT_FIELDS)


class WaitSlots:
    """A count of the requests waiting now, at most ``limit`` (one event loop: no lock)."""

    def __init__(self, limit: int = MAX_WAITING) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"max_waiting must be an integer >= 1, got {limit!r}")
        self.limit = limit
        self.used = 0
        self.closing = asyncio.Event()  # set when the server begins to stop (``close``)

    def close(self) -> None:
        """The server begins to stop: the requests that wait end now (``run``), instead of
        being cut off after the shutdown's grace period with an error the client cannot read.
        """
        self.closing.set()

    async def run(
        self,
        work: Awaitable[T],
        gone: asyncio.Event | None = None,
        left: Awaitable[None] | None = None,
    ) -> T:
        """Await a waiting request's ``work``; if the server begins to stop first, end it
        where it waits and raise :class:`ShuttingDown`. The work sees the stop in its waits
        (:data:`~fairq.backends.base.STOP_WAITING`): a long poll or blocked send that is
        waiting ends at once having received or stored nothing, while one whose engine call
        is already on its way gets that call's answer, which stands (a send that stored
        says so). Work still running ``STOP_GRACE`` seconds into the stop is cancelled.

        ``left`` (:func:`disconnected`) returns when the client closes its connection: the
        work is ended the same way, ``gone`` is set first (a receive whose engine call
        leased messages meanwhile gives them back, ``api.receive``), and
        :class:`ClientGone` is raised if the work was ended where it waited."""
        stopping = asyncio.Event()  # ends the work's waits: the server stops, the client left
        stop = STOP_WAITING.set(stopping)
        try:
            task = asyncio.ensure_future(work)
        finally:
            STOP_WAITING.reset(stop)
        watch: list[asyncio.Future[Any]] = [asyncio.ensure_future(self.closing.wait())]
        if left is not None:
            watch.append(asyncio.ensure_future(left))
        try:
            try:
                await asyncio.wait({task, *watch}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in watch:
                    w.cancel()
            if not task.done():
                if gone is not None and len(watch) > 1 and watch[1].done():
                    gone.set()
                stopping.set()
                await asyncio.wait({task}, timeout=STOP_GRACE)
        except asyncio.CancelledError:  # the request itself is cancelled: so is its work
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            raise
        if not task.done():
            task.cancel()
        ended = ClientGone if gone is not None and gone.is_set() else ShuttingDown
        try:
            return await task
        except WaitInterrupted:
            raise ended from None
        except asyncio.CancelledError:
            if asyncio.current_task().cancelling():  # type: ignore[union-attr]
                raise
            raise ended from None

    def take(self) -> bool:
        """Take a slot; False when all ``limit`` are taken."""
        if self.used >= self.limit:
            return False
        self.used += 1
        return True

    def give(self) -> None:
        """Give a slot back."""
        self.used -= 1


class Holding(Response):
    """``response`` sent as it is, and ``release`` called once it is over — sent whole,
    failed, or its client gone (a stream's slot is held for the stream's life)."""

    def __init__(self, response: Response, release: Callable[[], None]) -> None:
        # not Response.__init__: this object only wraps the one the handler made
        self.response = response
        self.release = release
        self.status_code = response.status_code
        self.raw_headers = response.raw_headers
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self.response(scope, receive, send)
        finally:
            self.release()
