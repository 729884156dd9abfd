"""The one source of time in fairq, injectable so tests can move it.

Backends stamp every timestamp (send time, lease end, delay end) with ``clock.now()``,
wall-clock seconds since the epoch, so several processes sharing one SQLite file agree.
Waiting (long polls, blocked sends) uses the event loop's own timers; a
:class:`ManualClock` wakes those waiters when a test moves it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol, runtime_checkable

__all__ = ["Clock", "ManualClock", "SystemClock"]


@runtime_checkable
class Clock(Protocol):
    """Anything with ``now()`` returning seconds since the epoch."""

    def now(self) -> float: ...


class SystemClock:
    """The real wall clock (``time.time``)."""

    __slots__ = ()

    def now(self) -> float:
        return time.time()


class ManualClock:
    """A clock that moves only when told to; for tests and simulations."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self._now = float(start)
        self._listeners: list[Callable[[], None]] = []

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        """Move the clock forward by ``seconds`` and wake anything waiting on time."""
        if seconds < 0:
            raise ValueError("a ManualClock only moves forward")
        self._now += seconds
        for listener in list(self._listeners):
            listener()

    def on_advance(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` (no arguments) after every :meth:`advance`."""
        self._listeners.append(listener)
