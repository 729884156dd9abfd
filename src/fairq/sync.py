"""``fairq.connect_sync()``: the same API with blocking calls, for code without asyncio.

    with fairq.connect_sync("sqlite:///fairq.db") as broker:
        q = broker.declare_queue("ticket-pdf")
        q.send(b"hello")
        for msg in q.receive(wait=5):
            msg.ack()

There are no hand-copied twins of the async classes: :class:`Blocking` wraps any fairq
object and runs its coroutine methods on a private event loop in a daemon thread,
wrapping the handles they return in turn.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import Future
from types import TracebackType
from typing import Any, TypeVar

from .broker import connect

__all__ = ["Blocking", "SyncBroker", "connect_sync"]

T = TypeVar("T")
_ASYNC_TYPES: dict[type, bool] = {}


class _LoopThread:
    """A private event loop running in a daemon thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="fairq-sync", daemon=True
        )
        self._thread.start()

    def run(self, coro: Any) -> Any:
        fut: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result()
        except KeyboardInterrupt:
            fut.cancel()
            raise

    def stop(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=5)
        if not self.loop.is_running():
            self.loop.close()


def _has_async_methods(cls: type) -> bool:
    known = _ASYNC_TYPES.get(cls)
    if known is None:
        known = cls.__module__.startswith("fairq") and any(
            inspect.iscoroutinefunction(getattr(cls, n, None))
            or inspect.isasyncgenfunction(getattr(cls, n, None))
            for n in dir(cls)
            if not n.startswith("__")
        )
        _ASYNC_TYPES[cls] = known
    return known


class Blocking:
    """A blocking view of a fairq object: every coroutine method becomes a plain call."""

    __slots__ = ("_runner", "_target")

    def __init__(self, target: Any, runner: _LoopThread) -> None:
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_runner", runner)

    def __repr__(self) -> str:
        return f"Blocking({self._target!r})"

    def __dir__(self) -> list[str]:
        return dir(self._target)

    def _wrap(self, value: Any) -> Any:
        if isinstance(value, list):
            return [self._wrap(v) for v in value]
        kind = type(value)
        if _has_async_methods(kind) or hasattr(kind, "__aenter__") or hasattr(kind, "__anext__"):
            return Blocking(value, self._runner)
        return value

    # an async context manager (``store.once(...)``, a listener) is a plain one here, and an
    # async iterator (``topic.listen()``) a plain iterator
    def __enter__(self) -> Any:
        if not hasattr(type(self._target), "__aenter__"):
            raise TypeError(f"{type(self._target).__name__} is not a context manager")
        return self._wrap(self._runner.run(self._target.__aenter__()))

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        result: bool | None = self._runner.run(self._target.__aexit__(exc_type, exc, tb))
        return result

    def __iter__(self) -> Iterator[Any]:
        if not hasattr(type(self._target), "__anext__"):
            raise TypeError(f"{type(self._target).__name__} is not iterable")
        return self

    def __next__(self) -> Any:
        try:
            return self._wrap(self._runner.run(self._target.__anext__()))
        except StopAsyncIteration:
            raise StopIteration from None

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        runner = self._runner
        if inspect.iscoroutinefunction(attr):

            def call(*args: Any, **kwargs: Any) -> Any:
                return self._wrap(runner.run(attr(*args, **kwargs)))

            call.__doc__ = attr.__doc__
            return call
        if inspect.isasyncgenfunction(attr):

            def iterate(*args: Any, **kwargs: Any) -> Iterator[Any]:
                agen: AsyncIterator[Any] = attr(*args, **kwargs)
                try:
                    while True:
                        try:
                            yield self._wrap(runner.run(agen.__anext__()))
                        except StopAsyncIteration:
                            return
                finally:
                    runner.run(agen.aclose())  # type: ignore[attr-defined]

            return iterate
        if callable(attr) and not isinstance(attr, type):
            fn: Callable[..., Any] = attr

            def plain(*args: Any, **kwargs: Any) -> Any:
                return self._wrap(fn(*args, **kwargs))

            plain.__doc__ = fn.__doc__
            return plain
        return self._wrap(attr)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._target, name, value)


class SyncBroker(Blocking):
    """A blocking broker; a context manager that closes the broker and its loop thread."""

    __slots__ = ()

    def __enter__(self) -> SyncBroker:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the broker and stop the private event loop."""
        runner: _LoopThread = self._runner
        if runner.loop.is_closed():
            return
        try:
            runner.run(self._target.close())
        finally:
            runner.stop()


def connect_sync(url: str | None = None, **options: Any) -> SyncBroker:
    """Like :func:`fairq.connect`, but every call blocks; use it as a context manager."""
    runner = _LoopThread()
    try:
        broker = runner.run(connect(url, **options))
    except BaseException:
        runner.stop()
        raise
    return SyncBroker(broker, runner)
