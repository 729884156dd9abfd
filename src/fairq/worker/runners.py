"""Handler runners: the tasks a queue consumer's messages run in.

A task per message costs more than a handler that does little (creating it, scheduling
its first step, one more pass of the event loop, its done callbacks: about as much as the
message's share of a ``receive(100)`` + ``ack_batch``). So a consumer hands its messages
to a few long-lived runner tasks instead. A runner takes the next message of the backlog
and runs it to the end; a handler that returns without waiting (a no-op, a cache hit)
costs one coroutine, and the runner goes on with the next message in the same step. Only
when a message waits for something does its runner ask for another runner — an idle one,
or a new one up to the consumer's concurrency — to carry on with the backlog, so slow
handlers still run side by side, as many as there are slots.

Each message still runs as if it had a task of its own: in a fresh copy of the
consumer's context (``contextvars`` set by one handler never leak into the next), and in
a task that runs nothing else until it ends, so ``asyncio.current_task()``,
``asyncio.timeout()`` and cancellation behave as usual.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import logging
import types
from collections.abc import Callable, Coroutine, Generator
from typing import Any, Generic, TypeVar

__all__ = ["DONE", "Driver", "Runners", "run_in"]

log = logging.getLogger("fairq.worker")
T = TypeVar("T")


#: what a runner's driver yields once an item has run to its end (a handler never yields it)
DONE = object()

#: a runner's driver: a generator, started by sending None, that runs each item sent in to
#: its end and then yields ``DONE`` (see :func:`_drive`)
Driver = Generator[Any, Any, None]


@types.coroutine
def _drive(
    handle: Callable[[Any, asyncio.Task[None]], Coroutine[Any, Any, None]], me: asyncio.Task[None]
) -> Generator[Any, Any, None]:
    """Run each item sent in to its end, then yield ``DONE``; every step runs in whatever
    context the runner steps it in (``ctx.run(driver.send, item)``).

    One long-lived generator instead of stepping each item's coroutine from the runner: a
    coroutine that ends when sent to raises StopIteration, which costs a message as much as
    its context copy and ``ctx.run`` together. An item that raises ends the driver."""
    item = yield DONE
    while True:
        yield from handle(item, me)
        item = yield DONE


@types.coroutine
def run_in(
    ctx: contextvars.Context, driver: Generator[Any, Any, None], yielded: Any
) -> Generator[Any, None, None]:
    """Await the rest of the item ``driver`` runs, whose first step (run in ``ctx``) yielded
    ``yielded`` (a future, to the task): each of its further steps runs in ``ctx`` too."""
    send, throw = driver.send, driver.throw
    while True:
        try:
            yield yielded
        except GeneratorExit:
            driver.close()
            raise
        except BaseException as e:  # a cancellation, thrown in by the task: pass it on
            yielded = ctx.run(throw, e)
        else:
            yielded = ctx.run(send, None)
        if yielded is DONE:
            return


class Runners(Generic[T]):
    """The backlog of one consumer and the runner tasks that work it off.

    ``handle(item, task)`` is the coroutine that runs one item to its end in runner
    ``task``; it must not raise (except when its task is cancelled). ``limit`` bounds the
    runners. ``drive(task)``, if given, makes runner ``task``'s driver instead of
    :func:`_drive` over ``handle`` (the worker's own, which runs the usual message without a
    coroutine of its own). ``waits(item, task)``, if given, is called when an item's first
    step yields, before anything else runs: from then on it runs beside other items (the
    worker keeps its lease from then on).
    """

    __slots__ = (
        "_closed",
        "_drive",
        "_handle",
        "_idle",
        "_stopping",
        "_waits",
        "backlog",
        "limit",
        "name",
        "tasks",
    )

    def __init__(
        self,
        name: str,
        limit: int,
        handle: Callable[[T, asyncio.Task[None]], Coroutine[Any, Any, None]],
        stopping: asyncio.Event,
        *,
        drive: Callable[[asyncio.Task[None]], Driver] | None = None,
        waits: Callable[[T, asyncio.Task[None]], None] | None = None,
    ) -> None:
        self.name = name
        self.limit = limit
        self.backlog: collections.deque[T] = collections.deque()
        self.tasks: set[asyncio.Task[None]] = set()
        self._idle: list[asyncio.Future[None]] = []
        self._handle = handle
        self._drive = drive
        self._waits = waits
        self._stopping = stopping
        self._closed = False

    def add(self, items: list[T]) -> None:
        """Queue items and make sure a runner comes for them."""
        self.backlog.extend(items)
        self.more()

    def more(self) -> None:
        """One more runner for the backlog, if there is a backlog: an idle runner, or a
        new one while there are fewer than ``limit``."""
        if not self.backlog or self._stopping.is_set():
            return
        idle = self._idle
        while idle:
            waiter = idle.pop()
            if not waiter.done():
                waiter.set_result(None)
                return
        if len(self.tasks) < self.limit:
            task = asyncio.create_task(self._run(), name=f"fairq-runner:{self.name}")
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    def take_backlog(self) -> list[T]:
        """Remove and return what no runner has started (at shutdown)."""
        items = list(self.backlog)
        self.backlog.clear()
        return items

    def close(self) -> None:
        """No more items will come (the consumer was retired): each runner ends once the
        backlog is worked off."""
        self._closed = True
        self.stop()

    def stop(self) -> None:
        """Let idle runners end (after ``stopping`` is set, or once closed)."""
        idle, self._idle = self._idle, []
        for waiter in idle:
            if not waiter.done():
                waiter.set_result(None)

    async def _run(self) -> None:
        me = asyncio.current_task()
        assert me is not None
        loop = asyncio.get_running_loop()
        backlog = self.backlog
        stopping = self._stopping
        more = self.more
        handle = self._handle
        drive = self._drive or (lambda me: _drive(handle, me))
        copy = contextvars.copy_context
        driver = drive(me)
        driver.send(None)
        step = driver.send
        while not stopping.is_set():
            if not backlog:
                if self._closed:
                    return
                waiter = loop.create_future()
                self._idle.append(waiter)
                await waiter
                continue
            item = backlog.popleft()
            ctx = copy()
            try:
                # its first step here: a handler that returns without waiting costs no more
                yielded = ctx.run(step, item)
                if yielded is not DONE:
                    if self._waits is not None:
                        self._waits(item, me)
                    more()  # it waits: another runner carries on with the backlog
                    await run_in(ctx, driver, yielded)
            except asyncio.CancelledError:
                if me.cancelling():
                    raise
                # the handler let a CancelledError of its own out; this runner goes on
                log.warning(
                    "a handler of %s raised CancelledError without being cancelled", self.name
                )
            except Exception:  # pragma: no cover - handle() settles every outcome itself
                log.exception("a message of %s could not be handled", self.name)
            else:
                continue
            driver = drive(me)  # what the item raised ended the last one
            driver.send(None)
            step = driver.send
