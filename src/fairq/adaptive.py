"""Adaptive admission: a waiting room's rate that follows the health of what it protects.

The seed's admission rate is a capacity number — the inventory's measured throughput
times a safety factor — that may adapt: admit fewer fans when the inventory's p99 latency
or error rate climbs, more when it recovers (a feedback loop). :class:`HealthMeter`
measures a downstream service where it is called; :class:`AdaptiveRate` turns its
readings into rate changes, additive increase and multiplicative decrease, and
``WaitingRoom.run_admitter(adaptive=...)`` applies them::

    meter = fairq.HealthMeter(window=10)            # meter.observe(latency, ok) per call
    adaptive = fairq.AdaptiveRate(meter.read, max_p99=0.5, max_error_rate=0.02)
    await room.run_admitter(adaptive=adaptive)
"""

from __future__ import annotations

import inspect
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

from .errors import InvalidOption
from .message import check_number

__all__ = ["AdaptiveRate", "Health", "HealthMeter", "HealthSignal"]


@dataclass(frozen=True, slots=True)
class Health:
    """A reading of the inventory's health: ``p99`` latency in seconds and ``error_rate``
    (0..1) over a recent window; either may be None (unknown)."""

    p99: float | None = None
    error_rate: float | None = None


class HealthMeter:
    """Rolling health of a downstream service, measured where it is called.

    Call :meth:`observe` with each call's latency and outcome; :meth:`read` gives the p99
    and error rate of the last ``window`` seconds. Hand ``meter.read`` to
    :class:`AdaptiveRate` as its signal.
    """

    def __init__(self, window: float = 10.0, clock: Callable[[], float] | None = None) -> None:
        self.window = check_number("window", window, strict=True)
        self._now = clock or time.monotonic
        self._samples: list[tuple[float, float, bool]] = []

    def observe(self, latency: float, ok: bool = True) -> None:
        """Record one call: its latency (seconds) and whether it succeeded."""
        now = self._now()
        self._samples.append((now, latency, ok))
        if len(self._samples) > 4096 and self._samples[0][0] < now - self.window:
            self._trim(now)

    def _trim(self, now: float) -> None:
        cut = now - self.window
        self._samples = [s for s in self._samples if s[0] >= cut]

    def read(self) -> Health:
        """p99 latency and error rate over the window (None when nothing was observed)."""
        self._trim(self._now())
        if not self._samples:
            return Health()
        latencies = sorted(s[1] for s in self._samples)
        p99 = latencies[min(len(latencies) - 1, math.ceil(0.99 * len(latencies)) - 1)]
        errors = sum(1 for s in self._samples if not s[2])
        return Health(p99, errors / len(self._samples))


HealthSignal = Callable[[], "Health | Awaitable[Health]"]


class AdaptiveRate:
    """Adapts a room's admit rate to the inventory's health: additive increase,
    multiplicative decrease (the congestion control of TCP), once per ``interval``.

    The health is *degraded* when its p99 is above ``max_p99`` or its error rate above
    ``max_error_rate``: the rate is multiplied by ``decrease`` (not below ``min_rate``).
    It is *healthy* when both are below ``recover`` times their limit: the rate grows by
    ``step`` (default a twentieth of ``max_rate``) up to ``max_rate`` (default: the rate
    the admitter started with). In between, the rate holds. An unknown reading holds too.
    """

    def __init__(
        self,
        signal: HealthSignal,
        *,
        max_p99: float | None = None,
        max_error_rate: float | None = None,
        min_rate: float = 1.0,
        max_rate: float | None = None,
        decrease: float = 0.7,
        step: float | None = None,
        recover: float = 0.8,
        interval: float = 1.0,
    ) -> None:
        if max_p99 is None and max_error_rate is None:
            raise InvalidOption("AdaptiveRate needs max_p99, max_error_rate or both")
        self.signal = signal
        self.max_p99 = None if max_p99 is None else check_number("max_p99", max_p99, strict=True)
        self.max_error_rate = (
            None
            if max_error_rate is None
            else check_number("max_error_rate", max_error_rate, strict=True)
        )
        self.min_rate = check_number("min_rate", min_rate)
        self.max_rate = (
            None if max_rate is None else check_number("max_rate", max_rate, strict=True)
        )
        if not 0 < decrease < 1:
            raise InvalidOption(f"decrease must be between 0 and 1, got {decrease!r}")
        self.decrease = decrease
        self.step = None if step is None else check_number("step", step, strict=True)
        if not 0 < recover <= 1:
            raise InvalidOption(f"recover must be in (0, 1], got {recover!r}")
        self.recover = recover
        self.interval = check_number("interval", interval, strict=True)

    def judge(self, health: Health) -> Literal["degraded", "healthy", "hold"]:
        """What a reading says: degraded, healthy, or in between (hold)."""
        checks = [
            (health.p99, self.max_p99),
            (health.error_rate, self.max_error_rate),
        ]
        known = [(v, limit) for v, limit in checks if limit is not None and v is not None]
        if not known:
            return "hold"
        if any(v > limit for v, limit in known):
            return "degraded"
        if all(v <= limit * self.recover for v, limit in known):
            return "healthy"
        return "hold"

    def next_rate(self, rate: float, health: Health, ceiling: float) -> float:
        """The rate after one reading, given the current ``rate`` and the ``ceiling``."""
        top = self.max_rate if self.max_rate is not None else ceiling
        verdict = self.judge(health)
        if verdict == "degraded":
            return max(self.min_rate, rate * self.decrease)
        if verdict == "healthy":
            step = self.step if self.step is not None else max(1.0, top / 20)
            return min(top, rate + step)
        return rate

    async def read(self) -> Health:
        """Read the signal (a plain or async callable)."""
        value = self.signal()
        if inspect.isawaitable(value):
            value = await value
        if not isinstance(value, Health):
            raise InvalidOption(f"the health signal must return fairq.Health, got {value!r}")
        return value
