"""``amqp://user:pass@host:port/vhost?store=<url>``: fairq on RabbitMQ.

Queues, topics and delays live in RabbitMQ (``topology.py`` says how they map; ``queues.py``
how leases ride on unacked deliveries); what RabbitMQ cannot hold — queue and topic options,
counters, deduplication records, idempotency claims, version gates and waiting rooms — lives
in the *store*, an ordinary fairq backend named by ``?store=`` (``sqlite:///...``,
``redis://...``, ``postgresql://...``; ``memory://`` for a single process). The idempotency and
waiting-room methods are the store's, delegated whole.

``AmqpBackend.missing`` is the capability table: every rule of SPEC.md this backend does not
honour exactly, and what it does instead (mirrored in docs/backends.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from ...clock import Clock
from ...errors import ConnectionError
from ...model.idempotency import IdempotencyRecord, Version
from ...model.rooms import Place, RoomRecord, RoomStats, TickResult
from ..open import open_backend
from .attention import AmqpAttention
from .link import parse_url

__all__ = ["AmqpBackend"]


class AmqpBackend(AmqpAttention):
    """See the module docstring."""

    missing: ClassVar[Mapping[str, str]] = {
        "fifo": "FIFO groups (fifo=True) raise Unsupported: a RabbitMQ queue has no "
        "per-group leases",
        "overflow.block": "overflow='block' raises Unsupported; 'reject' is x-overflow "
        "reject-publish, 'drop_oldest' is drop-head",
        "overflow.drop_oldest.priority": "overflow='drop_oldest' with max_priority > 0 raises "
        "Unsupported: drop-head drops a priority queue's highest-priority message, not its "
        "oldest",
        "bounded.in_flight": "x-max-length counts ready messages only: leased and prefetched "
        "(unacked) messages take no room, and drop-head never waits for visible ones",
        "bounded.atomic": "a bounded queue refuses messages one by one: a batch that fills it "
        "midway is stored in part (QueueFull says how many); a batch larger than max_length "
        "is refused whole",
        "clock.delays": "delays (send, nack, publish) end by RabbitMQ's clock (TTL delay "
        "queues); fairq.ManualClock does not move them",
        "clock.retention": "retention is x-message-ttl: RabbitMQ's clock expires messages "
        "(and restarts a message's retention when it comes back from a delay)",
        "stats.broker_dead_letters": "what RabbitMQ dead-letters by itself (retention's "
        "x-message-ttl, drop_oldest's drop-head) is not counted in the source queue's expired "
        "or dead_lettered (fairq sees it only when the dead-letter queue is read)",
        "stats.delayed": "delayed messages wait in the shared delay queues: stats count them "
        "as neither delayed nor visible until they arrive",
        "stats.process": "in_flight and oldest_age count this process's leases and "
        "prefetched deliveries only (RabbitMQ does not say who holds what); a process that "
        "does not consume the queue (a dashboard) reports the management API's unacked "
        "count, sampled every 5 s, and an oldest_age of 0 (no freshness_slo breach); "
        "visible leaves out what other processes' consumers have prefetched",
        "leases.process": "a lease belongs to the process that received it: it ends when that "
        "process's connection closes (the message returns at once), and only that process "
        "can settle it; a frozen process (SIGSTOP, a paused VM) keeps its leases until "
        "RabbitMQ drops it for missed heartbeats (10 s: about 30 s), whatever their "
        "visibility timeout",
        "order.released": "what a process's consumer held and gave back (its process asked "
        "for nothing for a while, or for fewer than it was pushed) goes back as copies at "
        "the back of the queue, behind messages sent later",
        "order.ties": "a message that becomes visible again (nack, lease end) at the same "
        "instant as a later send goes behind it: RabbitMQ queues by arrival (only a frozen "
        "fairq.ManualClock makes such ties)",
        "priority.prefetch": "priorities order what is still in RabbitMQ: what a consumer "
        "has already prefetched is handed out before higher priorities sent after it",
        "attempts.prefetch": "a consumer process that dies counts an attempt for every message "
        "it had prefetched (x-delivery-count), leased or not; a fairq.Worker prefetches only "
        "what it can run (its concurrency)",
        "batches.atomic": "send_batch waits for every confirm, but a producer killed (or a "
        "connection dropped) mid-batch leaves the batch's first messages stored",
        "peek": "peek raises Unsupported: reading without taking moves a message on RabbitMQ",
        "purge.others": "purge removes ready messages and this process's leases; other "
        "processes' leases and delayed messages stay",
        "queues.change_arguments": "re-declaring a queue with another retention, max_length "
        "or overflow raises Unsupported (RabbitMQ queue arguments are fixed)",
        "listen.processes": "Topic.listen hears the publishes of this process only",
        "store.counts": "RabbitMQ keeps no named counters for another engine: it cannot be "
        "another amqp:// URL's ?store=",
    }

    def __init__(self, url: str, clock: Clock) -> None:
        parsed = parse_url(url)
        if parsed.store is None:
            raise ConnectionError(
                f"cannot open {parsed.masked!r}: RabbitMQ needs a store for what it cannot "
                "hold: add ?store=sqlite:///fairq.db (one machine), ?store=redis://... or "
                "?store=postgresql://..."
            )
        if parsed.store.split(":", 1)[0].lower() in ("amqp", "amqps"):
            raise ConnectionError(
                f"cannot open {parsed.masked!r}: the store cannot be another amqp:// URL "
                "(RabbitMQ keeps no named counters, leases or records for another engine): "
                "use ?store=sqlite:///..., redis://... or postgresql://..."
            )
        store = open_backend(parsed.store, clock)
        super().__init__(parsed, clock, store)

    async def open(self) -> None:
        await self.store.open()
        try:
            await super().open()
        except BaseException:
            await self.store.close()
            await self.link.close()
            raise

    # -- idempotency and waiting rooms: the store's ----------------------------------------
    async def claim(
        self, namespace: str, key: str, token: str, lease: float, fingerprint: str | None
    ) -> IdempotencyRecord | None:
        return await self.store.claim(namespace, key, token, lease, fingerprint)

    async def complete_claim(
        self, namespace: str, key: str, token: str, result: bytes | None, ttl: float
    ) -> bool:
        return await self.store.complete_claim(namespace, key, token, result, ttl)

    async def release_claim(self, namespace: str, key: str, token: str) -> bool:
        return await self.store.release_claim(namespace, key, token)

    async def extend_claim(self, namespace: str, key: str, token: str, lease: float) -> bool:
        return await self.store.extend_claim(namespace, key, token, lease)

    async def idempotency_record(self, namespace: str, key: str) -> IdempotencyRecord | None:
        return await self.store.idempotency_record(namespace, key)

    async def forget_claim(self, namespace: str, key: str) -> bool:
        return await self.store.forget_claim(namespace, key)

    async def advance_version(self, namespace: str, entity: str, version: Version) -> bool:
        return await self.store.advance_version(namespace, entity, version)

    async def current_version(self, namespace: str, entity: str) -> Version | None:
        return await self.store.current_version(namespace, entity)

    async def declare_room(
        self,
        room: str,
        options: Mapping[str, object],
        secret_kid: str | None,
        seed: bytes,
        seed_kid: str,
    ) -> RoomRecord:
        return await self.store.declare_room(room, options, secret_kid, seed, seed_kid)

    async def room_record(self, room: str) -> RoomRecord:
        return await self.store.room_record(room)

    async def list_rooms(self, prefix: str = "") -> list[str]:
        return await self.store.list_rooms(prefix)

    async def delete_room(self, room: str) -> bool:
        return await self.store.delete_room(room)

    async def room_join(self, room: str, fans: list[str]) -> list[Place]:
        return await self.store.room_join(room, fans)

    async def room_status(self, room: str, seq: int) -> Place:
        return await self.store.room_status(room, seq)

    async def room_tick(self, room: str, holder: str, lease: float) -> TickResult:
        return await self.store.room_tick(room, holder, lease)

    async def room_release_admitter(self, room: str, holder: str) -> bool:
        return await self.store.room_release_admitter(room, holder)

    async def room_admit(self, room: str, n: int) -> int:
        return await self.store.room_admit(room, n)

    async def room_set_rate(self, room: str, rate: float) -> None:
        return await self.store.room_set_rate(room, rate)

    async def room_consume(self, room: str, seq: int) -> str:
        return await self.store.room_consume(room, seq)

    async def room_sold_out(self, room: str) -> int:
        return await self.store.room_sold_out(room)

    async def room_close(self, room: str) -> None:
        return await self.store.room_close(room)

    async def room_stats(self, room: str) -> RoomStats:
        return await self.store.room_stats(room)
