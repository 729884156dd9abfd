"""The worker runtime's parts: retry delays, counters, and the records of consumers,
received and running messages, slices and queued acks that the runtime modules share."""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..attention import Attention, Slice
from ..errors import InvalidOption
from ..idempotency import IdempotencyStore, IdempotentBy
from ..message import Received
from ..queue import Queue
from .metrics import QueueRun
from .runners import Runners

__all__ = ["Backoff", "Handler", "WorkerStats", "queue_of"]


def queue_of(msg: Received) -> Queue:
    """The queue handle a received message settles its lease through."""
    q = msg._handle()
    assert isinstance(q, Queue), q
    return q


Handler = Callable[[Received], Any]


@dataclass(frozen=True, slots=True)
class Backoff:
    """Retry delays: ``base * 2**(attempt-1)`` seconds, at most ``cap``, with the top
    ``jitter`` fraction randomised so failed messages do not come back in lockstep."""

    base: float = 1.0
    cap: float = 300.0
    jitter: float = 0.5

    def __post_init__(self) -> None:
        numbers = (self.base, self.cap, self.jitter)
        if (
            not all(isinstance(x, int | float) and math.isfinite(x) for x in numbers)
            or self.base < 0
            or self.cap < 0
            or not 0 <= self.jitter <= 1
        ):
            raise InvalidOption(
                "Backoff needs finite numbers: base >= 0, cap >= 0 and 0 <= jitter <= 1, got "
                f"base={self.base!r}, cap={self.cap!r}, jitter={self.jitter!r}"
            )

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to wait before delivery ``attempt + 1``."""
        exp = min(max(attempt, 1) - 1, 64)
        d = min(self.cap, self.base * (2.0**exp))
        return d * (1.0 - self.jitter * (rng or random).random())


@dataclass(slots=True)
class WorkerStats:
    """What a worker has done since it started."""

    received: int = 0
    acked: int = 0
    failed: int = 0
    rejected: int = 0
    released: int = 0
    lease_lost: int = 0
    duplicates: int = 0  # messages acked unhandled: their idempotency key was taken
    ack_failed: int = 0  # acks of handled messages the engine did not take (run again)
    per_queue: dict[str, int] = field(default_factory=dict)
    #: by queue or attention domain: received, how handler runs ended, and their times
    queues: dict[str, QueueRun] = field(default_factory=dict)


@dataclass(slots=True)
class _Consumer:
    name: str
    handler: Handler
    concurrency: int
    retry: Backoff
    visibility_timeout: float | None
    is_async: bool
    queue: Queue | None = None
    lease: float = 30.0
    max_attempts: int | None = None  # the queue's, read at start (for the failure log)
    busy: int = 0
    idempotency: IdempotentBy | None = None
    claims: IdempotencyStore | None = None
    attention: Attention | None = None  # set for an attention domain's consumer
    slice_lease: float = 30.0
    reconcile_interval: float = 30.0
    handle_time: float | None = None  # mean seconds per handler call (attention slices)
    run: QueueRun = field(default_factory=QueueRun)  # what its handlers did (worker.stats.queues)
    runners: Runners[_Queued] | None = None  # the tasks its received messages run in
    retired: bool = False  # stop receiving (a push subscription that is gone or changed)
    window: int = 0  # what it told the backend it may run at once (consumer_window)
    parked: bool = False  # waiting for a free slot (Runtime._take_slots)


@dataclass(slots=True, eq=False)
class _SliceRun:
    consumer: _Consumer
    slice: Slice
    lease_until: float
    lost: bool = False  # its token was found gone: said once, its last acks counted apart


@dataclass(frozen=True, slots=True)
class _PushSettings:
    topics: list[str] | None
    concurrency: int
    timeout: float
    retry: Backoff
    rescan: float


@dataclass(slots=True, eq=False)
class _Acks:
    """The acks of one queue's handled messages waiting for the next ``ack_batch``."""

    queue: Queue
    entries: list[Received]


#: a message received for a consumer's runners, with the loop time its lease ends
_Queued = tuple[Received, float]


@dataclass(slots=True, eq=False)
class _Running:
    """A message whose lease the keeper extends: a slice's from its receive on; a runner's
    once its handler waits, or once the keeper finds it due in the backlog."""

    consumer: _Consumer
    msg: Received
    lease_until: float
    task: asyncio.Task[None] | None = None
    settled: bool = False  # an ack, nack or dead letter is on its way: extend it no more
    lost: bool = False  # its lease was found gone while it ran: said once, extended no more
