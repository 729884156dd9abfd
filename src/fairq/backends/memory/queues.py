"""The memory backend's queues: messages, leases, delivery order, dead letters.

Nothing survives the process. Each backend method runs without awaiting in between, so
each is one atomic step, as on the durable engines. Heaps hold the delivery order
(priority, availability time, id) and the schedule of delays and leases; stale heap
entries are skipped by a version stamp instead of being removed.
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from ...clock import Clock
from ...errors import (
    BATCH_LARGER,
    BackendError,
    LeaseLost,
    QueueFull,
    QueueNotFound,
)
from ...message import (
    Received,
    format_id,
    id_time,
    make_receipt,
    new_lease,
    next_id_base,
    parse_receipt,
)
from ...model.queues import QUEUE_COUNTERS, Envelope, QueueConfig, QueueStats
from .. import heaps
from ..base import Backend
from ..rules import (
    DedupPlan,
    check_priorities,
    dead_letter_attributes,
    plan_dedup,
    redrive_attributes,
)

__all__ = ["MemoryQueues"]

READY, WAITING, BLOCKED = 0, 1, 2  # BLOCKED: behind its FIFO group's head


@dataclass(slots=True, eq=False)
class _Msg:
    id: int
    queue: _Queue
    state: int
    priority: int
    avail_at: float
    attempt: int
    lease: int
    group: str | None
    body: bytes
    attrs: dict[str, str]
    version: int = 0


@dataclass(slots=True, eq=False)
class _Queue:
    name: str
    config: QueueConfig
    msgs: OrderedDict[int, _Msg] = field(default_factory=OrderedDict)
    ready: list[tuple[int, float, int, int, _Msg]] = field(default_factory=list)
    ready_limit: int = heaps.COMPACT_MIN  # (heaps.push: dropped or dead-lettered while ready)
    visible: int = 0
    delayed: int = 0
    in_flight: int = 0
    counters: dict[str, int] = field(default_factory=lambda: dict.fromkeys(QUEUE_COUNTERS, 0))
    heads: dict[str, int] = field(default_factory=dict)  # FIFO group -> head message id
    behind: dict[str, deque[int]] = field(default_factory=dict)  # FIFO group -> blocked ids
    dedup: dict[str, tuple[int, float]] = field(default_factory=dict)
    deleted: bool = False


def _received(m: _Msg, receipt: str, queue: str) -> Received:
    return Received(
        format_id(m.id),
        m.body,
        dict(m.attrs),
        m.attempt,
        id_time(m.id),
        m.priority,
        m.group,
        receipt,
        queue,
    )


def _category(m: _Msg) -> str:
    if m.state == WAITING:
        return "in_flight" if m.lease else "delayed"
    return "visible"


def _still_waiting(entry: tuple[float, int, int, _Msg]) -> bool:
    """Whether an entry of the waiting heap still stands for its message's due time."""
    m = entry[3]
    return m.version == entry[2] and m.state == WAITING


def _still_ready(entry: tuple[int, float, int, int, _Msg]) -> bool:
    """Whether an entry of a queue's ready heap still stands for its message."""
    m = entry[4]
    return m.version == entry[3] and m.state == READY


class MemoryQueues(Backend):
    """Queues in this process's memory; the base of the other memory capabilities."""

    def __init__(self, clock: Clock) -> None:
        super().__init__(clock)
        self._queues: dict[str, _Queue] = {}
        # (avail_at, id, version, message) of each delayed or leased message, earliest first;
        # an entry goes stale when its message moves on (acked, nacked, extended), and stale
        # ones are dropped at the top or whenever the heap doubles (heaps.push)
        self._waiting: list[tuple[float, int, int, _Msg]] = []
        self._waiting_limit = heaps.COMPACT_MIN
        self._last_id = 0
        self._closed = False

    async def close(self) -> None:
        self._closed = True
        self.wakeups.close()

    # -- helpers ---------------------------------------------------------------------------
    def _open(self) -> None:
        if self._closed:
            raise BackendError("the memory backend is closed")

    def _q(self, name: str) -> _Queue:
        self._open()
        q = self._queues.get(name)
        if q is None:
            raise QueueNotFound(name)
        return q

    def _new_id(self, now: float) -> int:
        self._last_id = next_id_base(self._last_id, now)
        return self._last_id

    def _move(self, m: _Msg, state: int, avail_at: float, lease: int = 0) -> None:
        """Put ``m`` in a new state, keeping the per-queue counts and the heaps right."""
        q = m.queue
        before = _category(m)
        m.state, m.avail_at, m.lease = state, avail_at, lease
        m.version += 1
        after = _category(m)
        if before != after:
            setattr(q, before, getattr(q, before) - 1)
            setattr(q, after, getattr(q, after) + 1)
        if state == READY:
            ready = (-m.priority, avail_at, m.id, m.version, m)
            q.ready_limit = heaps.push(q.ready, ready, q.ready_limit, _still_ready)
        elif state == WAITING:
            due = (avail_at, m.id, m.version, m)
            limit = self._waiting_limit
            self._waiting_limit = heaps.push(self._waiting, due, limit, _still_waiting)

    def _insert(
        self,
        q: _Queue,
        now: float,
        body: bytes,
        attrs: dict[str, str],
        delay: float,
        priority: int,
        group: str | None,
    ) -> _Msg:
        mid = self._new_id(now)
        if q.config.fifo:
            group = group or "default"
        m = _Msg(mid, q, BLOCKED, priority, now + delay, 0, 0, group, body, attrs)
        q.msgs[mid] = m
        q.visible += 1  # BLOCKED counts as visible until _move says otherwise
        q.counters["sent"] += 1
        if q.config.fifo:
            assert group is not None
            if group in q.heads:
                q.behind.setdefault(group, deque()).append(mid)
                return m
            q.heads[group] = mid
        if delay > 0:
            self._move(m, WAITING, now + delay)
        else:
            self._move(m, READY, now)
        return m

    def _remove(self, m: _Msg, now: float) -> None:
        q = m.queue
        del q.msgs[m.id]
        setattr(q, _category(m), getattr(q, _category(m)) - 1)
        m.version += 1
        was_blocked = m.state == BLOCKED
        m.state = -1
        if was_blocked and m.group is not None:
            behind = q.behind[m.group]
            behind.remove(m.id)
            if not behind:
                del q.behind[m.group]
        elif q.config.fifo and m.group is not None and q.heads.get(m.group) == m.id:
            waiting = q.behind.get(m.group)
            if waiting:
                nxt = q.msgs[waiting.popleft()]
                if not waiting:
                    del q.behind[m.group]
                q.heads[m.group] = nxt.id
                if nxt.avail_at > now:
                    self._move(nxt, WAITING, nxt.avail_at)
                else:
                    self._move(nxt, READY, nxt.avail_at)
            else:
                del q.heads[m.group]

    def _dead_letter(self, m: _Msg, reason: str, now: float, detail: str | None = None) -> None:
        q = m.queue
        self._remove(m, now)
        if reason == "expired":
            q.counters["expired"] += 1
        target = q.config.dead_letter
        if target is None:
            q.counters["discarded"] += 1
            return
        q.counters["dead_lettered"] += 1
        dlq = self._queues.get(target)
        if dlq is None:
            dlq = self._queues[target] = _Queue(target, QueueConfig.for_dead_letters())
        attrs = dead_letter_attributes(m.attrs, reason, q.name, format_id(m.id), m.attempt, detail)
        self._insert(
            dlq, now, m.body, attrs, 0.0, min(m.priority, dlq.config.max_priority), m.group
        )
        self.wakeups.notify([target])  # a long poll on the dead-letter queue

    def _expired(self, m: _Msg, now: float) -> bool:
        return id_time(m.id) < now - m.queue.config.retention

    def _expire_old(self, q: _Queue, now: float) -> None:
        """Dead-letter (reason ``expired``) messages older than the queue's retention that
        are not in flight; in-flight ones are checked when their lease ends."""
        old = list(itertools.takewhile(lambda m: self._expired(m, now), q.msgs.values()))
        for m in old:
            if not (m.state == WAITING and m.lease):
                self._dead_letter(m, "expired", now)

    def _sweep(self, now: float) -> None:
        """Bring due delays and leases to their next state (visible or dead-lettered)."""
        heap = self._waiting
        while heap and heap[0][0] <= now:
            _, _, version, m = heapq.heappop(heap)
            if m.version != version or m.state != WAITING:
                continue
            cfg = m.queue.config
            if m.lease and cfg.max_attempts is not None and m.attempt >= cfg.max_attempts:
                self._dead_letter(m, "max_attempts", now)
            elif self._expired(m, now):
                self._dead_letter(m, "expired", now)
            else:
                self._move(m, READY, m.avail_at)

    def _lease_of(self, q: _Queue, receipt: str, now: float) -> _Msg | None:
        mid, lease = parse_receipt(receipt)
        m = q.msgs.get(mid)
        if m is None or m.state != WAITING or m.lease != lease or m.avail_at <= now:
            return None
        return m

    # -- queues ----------------------------------------------------------------------------
    async def declare_queue(self, name: str, config: QueueConfig) -> None:
        self._open()
        q = self._queues.get(name)
        if q is not None:
            q.config.check_change(name, config)
            q.config = config
        else:
            self._queues[name] = _Queue(name, config)
        if config.dead_letter is not None and config.dead_letter not in self._queues:
            dl = config.dead_letter
            self._queues[dl] = _Queue(dl, QueueConfig.for_dead_letters())
        self.wakeups.notify([name])  # blocked senders re-check a new max_length

    async def queue_config(self, name: str) -> QueueConfig:
        return self._q(name).config

    async def delete_queue(self, name: str) -> bool:
        self._open()
        q = self._queues.pop(name, None)
        if q is None:
            return False
        self._queue_deleted(name)
        q.deleted = True
        for m in q.msgs.values():
            m.version += 1
            m.state = -1
        self.wakeups.notify([name])
        return True

    def _queue_deleted(self, name: str) -> None:
        """Hook for the capabilities built on queues (a subscription loses its queue)."""

    async def list_queues(self, prefix: str = "") -> list[str]:
        self._open()
        return sorted(n for n in self._queues if n.startswith(prefix))

    # -- messages --------------------------------------------------------------------------
    def _plan_send(
        self, q: _Queue, envelopes: list[Envelope], now: float
    ) -> tuple[DedupPlan, list[_Msg]]:
        """Check a send without changing anything: the new envelopes and what to drop."""
        cfg = q.config
        check_priorities(q.name, envelopes, cfg.max_priority)

        def sent_before(dedup_id: str) -> int | None:
            hit = q.dedup.get(dedup_id)
            return hit[0] if hit is not None and hit[1] > now else None

        plan = plan_dedup(envelopes, sent_before)  # duplicates take no room
        victims: list[_Msg] = []
        fresh = plan.fresh
        if cfg.max_length is not None and fresh:
            if len(fresh) > cfg.max_length:
                raise QueueFull(q.name, cfg.max_length, BATCH_LARGER)
            need = len(q.msgs) + len(fresh) - cfg.max_length
            if need > 0:
                if cfg.overflow != "drop_oldest":
                    raise QueueFull(q.name, cfg.max_length, "", cfg.overflow)
                victims = [m for m in q.msgs.values() if m.state != WAITING][:need]
                if len(victims) < need:
                    raise QueueFull(
                        q.name, cfg.max_length, "no visible message can be dropped", "drop_oldest"
                    )
        return plan, victims

    def _apply_send(self, q: _Queue, plan: DedupPlan, victims: list[_Msg], now: float) -> list[str]:
        for m in victims:
            self._dead_letter(m, "overflow", now)
        made = [
            self._insert(q, now, e.body, e.attributes, e.delay, e.priority, e.group).id
            for e in plan.fresh
        ]
        if plan.first and q.config.dedup_window > 0:
            expires = now + q.config.dedup_window
            for dedup_id, index in plan.first.items():
                q.dedup[dedup_id] = (made[index], expires)
            if len(q.dedup) > 4096:
                q.dedup = {k: v for k, v in q.dedup.items() if v[1] > now}
        self.wakeups.notify([q.name])
        return plan.answer(made)

    async def send(self, queue: str, envelopes: list[Envelope]) -> list[str]:
        now = self.clock.now()
        self._sweep(now)
        q = self._q(queue)
        plan, victims = self._plan_send(q, envelopes, now)
        return self._apply_send(q, plan, victims, now)

    async def receive(
        self, queue: str, max_messages: int, visibility_timeout: float | None
    ) -> list[Received]:
        now = self.clock.now()
        self._sweep(now)
        q = self._q(queue)
        vt = q.config.visibility_timeout if visibility_timeout is None else visibility_timeout
        out: list[Received] = []
        heap = q.ready
        while heap and len(out) < max_messages:
            _, _, _, version, m = heapq.heappop(heap)
            if m.version != version or m.state != READY:
                continue
            if self._expired(m, now):
                self._dead_letter(m, "expired", now)
                continue
            lease = new_lease()
            m.attempt += 1
            if m.attempt > 1:
                q.counters["redelivered"] += 1
            self._move(m, WAITING, now + vt, lease)
            out.append(_received(m, make_receipt(m.id, lease), queue))
        return out

    def _settle(
        self, queue: str, receipts: list[str]
    ) -> tuple[_Queue, list[_Msg], list[str], float]:
        """The queue, the messages whose current lease the receipts name, the lost receipts."""
        now = self.clock.now()
        self._sweep(now)
        q = self._q(queue)
        msgs: dict[int, _Msg] = {}
        lost: list[str] = []
        for r in receipts:
            m = self._lease_of(q, r, now)
            if m is None:
                lost.append(r)
            else:
                msgs[m.id] = m
        return q, list(msgs.values()), lost, now

    def _settle_one(self, queue: str, receipt: str) -> tuple[_Queue, _Msg, float]:
        q, msgs, lost, now = self._settle(queue, [receipt])
        if lost:
            raise LeaseLost(lost)
        return q, msgs[0], now

    async def ack(self, queue: str, receipts: list[str]) -> list[str]:
        q, msgs, lost, now = self._settle(queue, receipts)
        for m in msgs:
            self._remove(m, now)
        q.counters["acked"] += len(msgs)
        self.wakeups.notify([queue])
        return lost

    async def nack(self, queue: str, receipt: str, delay: float, error: str | None = None) -> None:
        q, m, now = self._settle_one(queue, receipt)
        q.counters["nacked"] += 1
        if q.config.max_attempts is not None and m.attempt >= q.config.max_attempts:
            self._dead_letter(m, "max_attempts", now, error)
        elif delay > 0:
            self._move(m, WAITING, now + delay)
        else:
            self._move(m, READY, now)
        self.wakeups.notify([queue])

    async def extend(self, queue: str, receipts: list[str], seconds: float) -> list[str]:
        _, msgs, lost, now = self._settle(queue, receipts)
        for m in msgs:
            self._move(m, WAITING, now + seconds, m.lease)
        return lost

    async def release(self, queue: str, receipts: list[str]) -> list[str]:
        _, msgs, lost, now = self._settle(queue, receipts)
        for m in msgs:
            m.attempt -= 1
            self._move(m, READY, now)
        self.wakeups.notify([queue])
        return lost

    async def dead_letter(self, queue: str, receipt: str, reason: str) -> None:
        _, m, now = self._settle_one(queue, receipt)
        self._dead_letter(m, "rejected", now, reason)
        self.wakeups.notify([queue])

    async def stats(self, queue: str) -> QueueStats:
        now = self.clock.now()
        self._sweep(now)
        q = self._q(queue)
        self._expire_old(q, now)
        oldest = 0.0
        if q.msgs:
            oldest = max(0.0, now - id_time(next(iter(q.msgs))))
        slo = q.config.freshness_slo
        return QueueStats(
            visible=q.visible,
            delayed=q.delayed,
            in_flight=q.in_flight,
            oldest_age=oldest,
            freshness_slo=slo,
            breaching=slo is not None and oldest > slo,
            **q.counters,
        )

    async def purge(self, queue: str) -> int:
        now = self.clock.now()
        self._sweep(now)
        q = self._q(queue)
        n = len(q.msgs)
        for m in q.msgs.values():
            m.version += 1
            m.state = -1
        q.msgs.clear()
        q.ready.clear()
        q.heads.clear()
        q.behind.clear()
        q.visible = q.delayed = q.in_flight = 0
        self.wakeups.notify([queue])
        return n

    async def peek(self, queue: str, limit: int) -> list[Received]:
        now = self.clock.now()
        self._sweep(now)
        q = self._q(queue)
        out: list[Received] = []
        for m in q.msgs.values():
            if len(out) >= limit:
                break
            out.append(_received(m, "", queue))
        return out

    async def redrive(self, queue: str, to: str | None, limit: int | None) -> int:
        now = self.clock.now()
        self._sweep(now)
        q = self._q(queue)
        if to is not None:
            self._q(to)
        moved = 0
        for m in list(q.msgs.values()):
            if limit is not None and moved >= limit:
                break
            if m.state == WAITING:
                continue  # leased or delayed in the dead-letter queue: leave it
            target_name = to or m.attrs.get("fairq.source")
            target = self._queues.get(target_name) if target_name else None
            if target is None or target is q:
                continue
            self._remove(m, now)
            prio = min(m.priority, target.config.max_priority)
            self._insert(target, now, m.body, redrive_attributes(m.attrs), 0.0, prio, m.group)
            self.wakeups.notify([target.name])
            moved += 1
        self.wakeups.notify([queue])
        return moved

    # -- wake-ups --------------------------------------------------------------------------
    async def next_due(self) -> float | None:
        heap = self._waiting
        while heap:
            avail_at, _, version, m = heap[0]
            if m.version == version and m.state == WAITING:
                return avail_at
            heapq.heappop(heap)
        return None
