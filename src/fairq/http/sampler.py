"""The server's stats sampler: every few seconds it reads every queue's stats into a ring
buffer (the last 15 minutes by default), so the dashboard can chart depth and rates and
size workers without anyone keeping a Prometheus.

From two samples ``Δt`` apart it measures, per queue, the arrival rate λ (``Δsent/Δt``),
the ack rate (``Δacked/Δt``), the rate at which messages finish (acked, dead-lettered or
discarded) and the rate at which handlings end (acks, nacks and rejections: a failed
attempt held a worker too; a nack on a message's last attempt is also its dead letter, so
with ``max_attempts`` m about one nack in m is not counted twice). The mean handling time
is ``W = in_flight / handlings ended per second`` (Little's law on the in-flight part, with
in_flight averaged over the window), and the workers a queue needs is ``λ × a × W`` with
``a`` the attempts a message takes (handlings ended ÷ messages finished), which is
``λ × in_flight ÷ messages finished per second`` — what must be busy at once for the queue
not to grow. Rates are measured over the last ``window`` seconds (30 by default).

Time comes from the broker's clock, so tests move it instead of sleeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
from collections import deque
from dataclasses import dataclass

from ..broker import Broker
from ..errors import FairqError, QueueNotFound, Unsupported
from ..queue import QueueStats
from ..waitingroom import RoomStats
from . import models as m

__all__ = ["Sample", "Sampler"]

log = logging.getLogger("fairq.http.sampler")


@dataclass(frozen=True, slots=True)
class Sample:
    """One queue at one instant."""

    t: float
    visible: int
    in_flight: int
    delayed: int
    oldest_age: float
    sent: int
    acked: int
    dlq_depth: int
    nacked: int = 0
    dead_lettered: int = 0
    discarded: int = 0


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Every sampled queue's stats at one instant."""

    t: float
    stats: dict[str, QueueStats]
    total: int


def _template_pattern(template: str, domain: str) -> re.Pattern[str]:
    """The queue names an attention work-queue template makes for ``domain``."""
    parts = re.split(r"(\{domain\}|\{key\}|\{shard\})", template)
    fields = {"{domain}": re.escape(domain), "{key}": ".+", "{shard}": r"\d+"}
    return re.compile("".join(fields.get(p, re.escape(p)) for p in parts))


class Sampler:
    """Samples queue stats every ``interval`` seconds and keeps ``keep`` seconds of them.

    At most ``max_queues`` queues are sampled: beyond that a sample would cost more than
    it tells. The application's own queues come first, each followed by its dead-letter
    queue (``.dlq``), then attention work queues (one per key: a big domain would fill the
    cap alone), by name (:meth:`order`).
    """

    def __init__(
        self,
        broker: Broker,
        interval: float = 2.0,
        keep: float = 900.0,
        window: float = 30.0,
        max_queues: int = 1000,
        top_keys: int = 10,
    ) -> None:
        self.broker = broker
        self.interval = interval
        self.keep = keep
        self.window = window
        self.max_queues = max_queues
        self.top_keys = top_keys
        self._rings: dict[str, deque[Sample]] = {}
        self._dead_letters: dict[str, str | None] = {}
        self._max_attempts: dict[str, int | None] = {}
        self._latest: Snapshot | None = None
        self._lock = asyncio.Lock()
        self._overview: m.Overview | None = None
        self._overview_lock = asyncio.Lock()
        self.samples = 0

    @property
    def _ring_size(self) -> int:
        return max(2, math.ceil(self.keep / self.interval) + 1)

    # -- sampling --------------------------------------------------------------------------
    async def run(self) -> None:
        """Sample forever (until cancelled); a failed sample is logged and skipped."""
        while True:
            with contextlib.suppress(FairqError):
                await self.fresh(record=True)
            await asyncio.sleep(self.interval)

    async def fresh(self, max_age: float = 0.0, record: bool = False) -> Snapshot:
        """The latest snapshot, taken now unless one is younger than ``max_age`` seconds;
        ``record`` also appends it to the history (the periodic samples do)."""
        async with self._lock:
            latest = self._latest
            if not record and latest is not None and self.broker.clock.now() - latest.t < max_age:
                return latest
            try:
                return await self._sample(record)
            except FairqError as exc:
                log.warning("sampling queue stats failed: %s", exc)
                raise

    async def order(self, names: list[str]) -> list[str]:
        """``names`` in the order the cap takes them: the application's queues, each with
        its dead-letter queue, then the work queues of attention domains (and theirs)."""
        patterns = []
        for domain in await self.broker.list_attention():
            with contextlib.suppress(FairqError):
                template = (await self.broker.attention(domain).config()).work_queue
                patterns.append(_template_pattern(template, domain))

        def rank(name: str) -> tuple[int, str, bool]:
            base = name.removesuffix(".dlq")  # a queue, then its dead-letter queue
            return any(p.fullmatch(base) for p in patterns), base, name != base

        return sorted(names, key=rank)

    async def _sample(self, record: bool) -> Snapshot:
        broker = self.broker
        names = await broker.list_queues()
        sampled = names if len(names) <= self.max_queues else await self.order(names)
        sampled = sampled[: self.max_queues]
        stats: dict[str, QueueStats] = {}
        for name in sampled:
            try:
                stats[name] = await broker.queue(name).stats()
                if name not in self._dead_letters:
                    config = await broker.queue(name).config()
                    self._dead_letters[name] = config.dead_letter
                    self._max_attempts[name] = config.max_attempts
            except QueueNotFound:
                continue
            except FairqError as exc:  # one queue the engine cannot read must not hide the rest
                log.warning("cannot read the stats of queue %s: %s", name, exc)
                continue
        now = broker.clock.now()
        if record:
            for gone in set(self._rings) - set(stats):
                del self._rings[gone]
        for gone in set(self._dead_letters) - set(stats):
            del self._dead_letters[gone]
            self._max_attempts.pop(gone, None)
        size = self._ring_size
        for name, s in stats.items():
            dlq = self._dead_letters.get(name)
            dlq_stats = stats.get(dlq) if dlq else None
            dlq_depth = dlq_stats.depth if dlq_stats is not None else 0
            sample = Sample(
                now,
                s.visible,
                s.in_flight,
                s.delayed,
                s.oldest_age,
                s.sent,
                s.acked,
                dlq_depth,
                s.nacked,
                s.dead_lettered,
                s.discarded,
            )
            if record:
                ring = self._rings.get(name)
                if ring is None:
                    ring = self._rings[name] = deque(maxlen=size)
                ring.append(sample)
        self.samples += 1
        self._latest = Snapshot(now, stats, len(names))
        return self._latest

    def forget_config(self, name: str) -> None:
        """Read ``name``'s dead-letter queue again at the next sample (after a declare)."""
        self._dead_letters.pop(name, None)

    # -- measuring -------------------------------------------------------------------------
    def rates(self, name: str) -> tuple[float | None, float | None, float | None, float | None]:
        """(arrival rate, ack rate, mean handling time, workers needed) of ``name`` over the
        window; None where there are not two samples yet (or nothing was acked)."""
        ring = self._rings.get(name)
        if not ring or len(ring) < 2:
            return None, None, None, None
        last = ring[-1]
        first = last
        in_flight = 0
        n = 0
        for s in reversed(ring):
            if last.t - s.t > self.window:
                break
            first = s
            in_flight += s.in_flight
            n += 1
        span = last.t - first.t
        if span <= 0:
            return None, None, None, None
        send_rate = max(0, last.sent - first.sent) / span
        acked = max(0, last.acked - first.acked)
        ack_rate = acked / span
        failed = max(0, last.dead_lettered - first.dead_lettered) + max(
            0, last.discarded - first.discarded
        )
        nacked = max(0, last.nacked - first.nacked)
        max_attempts = self._max_attempts.get(name)
        final_nacks = min(nacked / max_attempts, failed) if max_attempts else 0.0
        ended = acked + nacked + failed - final_nacks
        if ended <= 0:
            return send_rate, ack_rate, None, None
        busy = in_flight / n
        handling = busy / (ended / span)
        finished = acked + failed
        workers = send_rate * busy / (finished / span) if finished else send_rate * handling
        return send_rate, ack_rate, handling, workers

    def history(self, name: str) -> m.History:
        """The ring buffer of ``name`` as columns, with per-step rates."""
        ring = list(self._rings.get(name, ()))
        send_rate: list[float] = []
        ack_rate: list[float] = []
        prev: Sample | None = None
        for s in ring:
            if prev is None or s.t <= prev.t:
                send_rate.append(0.0)
                ack_rate.append(0.0)
            else:
                dt = s.t - prev.t
                send_rate.append(max(0, s.sent - prev.sent) / dt)
                ack_rate.append(max(0, s.acked - prev.acked) / dt)
            prev = s
        return m.History(
            queue=name,
            interval=self.interval,
            t=[s.t for s in ring],
            visible=[s.visible for s in ring],
            in_flight=[s.in_flight for s in ring],
            delayed=[s.delayed for s in ring],
            oldest_age=[s.oldest_age for s in ring],
            dlq_depth=[s.dlq_depth for s in ring],
            send_rate=send_rate,
            ack_rate=ack_rate,
        )

    # -- the dashboard's view --------------------------------------------------------------
    async def overview(self, max_age: float = 1.0) -> m.Overview:
        """Queues (from a snapshot at most ``max_age`` old) with rates, topics and attention
        domains; answers from several dashboards within ``max_age`` share one build."""
        async with self._overview_lock:
            now = self.broker.clock.now()
            cached = self._overview
            if cached is not None and now - cached.time < max_age:
                return cached
            self._overview = await self._build(max_age)
            return self._overview

    async def _build(self, max_age: float) -> m.Overview:
        from .api_attention import attention_info
        from .api_topics import topic_info

        snap = await self.fresh(max_age)
        dlqs = {d for d in self._dead_letters.values() if d}
        rows = []
        for name, s in snap.stats.items():
            dlq = self._dead_letters.get(name)
            dlq_stats = snap.stats.get(dlq) if dlq else None
            send_rate, ack_rate, handling, workers = self.rates(name)
            rows.append(
                m.QueueRow(
                    name=name,
                    stats=s,
                    dead_letter=dlq,
                    dlq_depth=dlq_stats.depth if dlq_stats is not None else None,
                    is_dlq=name in dlqs,
                    send_rate=send_rate,
                    ack_rate=ack_rate,
                    handling_time=handling,
                    workers_needed=workers,
                )
            )
        broker = self.broker
        topics = []
        for name in await broker.list_topics():
            with contextlib.suppress(LookupError):
                topics.append(await topic_info(broker, name))
        domains = []
        for name in await broker.list_attention():
            with contextlib.suppress(LookupError):
                info = await attention_info(broker, name)
                a = broker.attention(name)
                keys = await a.key_stats(top=self.top_keys)
                try:
                    tenants = await a.tenant_stats(top=self.top_keys)
                except Unsupported:  # an engine without per-tenant usage yet
                    tenants = []
                domains.append(m.DomainRow(name=name, stats=info.stats, keys=keys, tenants=tenants))
        rooms = await room_stats(broker)
        return m.Overview(
            time=snap.t,
            backend=broker.url,
            auth=False,
            window=self.window,
            sampled_queues=len(snap.stats),
            total_queues=snap.total,
            queues=rows,
            topics=topics,
            attention=domains,
            rooms=rooms,
        )


async def room_stats(broker: Broker) -> list[RoomStats]:
    """Every waiting room's numbers."""
    out = []
    try:
        names = await broker.list_rooms()
    except FairqError:
        return []
    for name in names:
        try:
            out.append(await broker.backend.room_stats(name))
        except FairqError as exc:  # deleted meanwhile
            log.debug("cannot read waiting room %s: %s", name, exc)
    return out
