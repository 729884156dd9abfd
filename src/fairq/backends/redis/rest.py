"""Capabilities not built on Redis yet: they raise fairq.Unsupported."""

from __future__ import annotations

from collections.abc import Mapping

from ...errors import Unsupported
from ...message import Received
from ...model.attention import AttentionConfig, AttentionStats, KeyStats, Slice
from ...model.idempotency import IdempotencyRecord, Version
from ...model.queues import Envelope, QueueConfig
from ...model.rooms import Place, RoomRecord, RoomStats, TickResult
from ...model.topics import PublishResult, Subscription, TopicConfig, TopicStats
from .core import RedisCore


class RedisRest(RedisCore):
    async def declare_topic(self, name: str, config: TopicConfig) -> None:
        raise Unsupported("declare_topic is not built on Redis yet")

    async def topic_config(self, name: str) -> TopicConfig:
        raise Unsupported("topic_config is not built on Redis yet")

    async def delete_topic(self, name: str) -> bool:
        raise Unsupported("delete_topic is not built on Redis yet")

    async def list_topics(self, prefix: str = "") -> list[str]:
        raise Unsupported("list_topics is not built on Redis yet")

    async def subscribe(self, subscription: Subscription, config: QueueConfig) -> None:
        raise Unsupported("subscribe is not built on Redis yet")

    async def unsubscribe(self, topic: str, name: str) -> bool:
        raise Unsupported("unsubscribe is not built on Redis yet")

    async def subscriptions(self, topic: str) -> list[Subscription]:
        raise Unsupported("subscriptions is not built on Redis yet")

    async def publish(self, topic: str, envelopes: list[Envelope]) -> list[PublishResult]:
        raise Unsupported("publish is not built on Redis yet")

    async def topic_stats(self, topic: str) -> TopicStats:
        raise Unsupported("topic_stats is not built on Redis yet")

    async def declare_attention(self, domain: str, config: AttentionConfig) -> None:
        raise Unsupported("declare_attention is not built on Redis yet")

    async def attention_config(self, domain: str) -> AttentionConfig:
        raise Unsupported("attention_config is not built on Redis yet")

    async def list_attention(self, prefix: str = "") -> list[str]:
        raise Unsupported("list_attention is not built on Redis yet")

    async def delete_attention(self, domain: str) -> bool:
        raise Unsupported("delete_attention is not built on Redis yet")

    async def attention_publish(
        self, domain: str, key: str, envelopes: list[Envelope]
    ) -> list[str]:
        raise Unsupported("attention_publish is not built on Redis yet")

    async def attention_take(self, domain: str) -> Slice | None:
        raise Unsupported("attention_take is not built on Redis yet")

    async def attention_receive(
        self, domain: str, token: str, n: int, visibility_timeout: float | None
    ) -> tuple[list[Received], float | None]:
        raise Unsupported("attention_receive is not built on Redis yet")

    async def attention_extend(self, domain: str, token: str) -> bool:
        raise Unsupported("attention_extend is not built on Redis yet")

    async def attention_end(
        self, domain: str, token: str, processed: int, retry_at: float | None
    ) -> None:
        raise Unsupported("attention_end is not built on Redis yet")

    async def attention_set_resource(
        self, domain: str, key: str, plan: str | None, state: str | None, tenant: str | None
    ) -> None:
        raise Unsupported("attention_set_resource is not built on Redis yet")

    async def attention_stats(self, domain: str) -> AttentionStats:
        raise Unsupported("attention_stats is not built on Redis yet")

    async def attention_key_stats(self, domain: str, top: int) -> list[KeyStats]:
        raise Unsupported("attention_key_stats is not built on Redis yet")

    async def attention_reconcile(self, domain: str) -> int:
        raise Unsupported("attention_reconcile is not built on Redis yet")

    async def claim(
        self, namespace: str, key: str, token: str, lease: float, fingerprint: str | None
    ) -> IdempotencyRecord | None:
        raise Unsupported("claim is not built on Redis yet")

    async def complete_claim(
        self, namespace: str, key: str, token: str, result: bytes | None, ttl: float
    ) -> bool:
        raise Unsupported("complete_claim is not built on Redis yet")

    async def release_claim(self, namespace: str, key: str, token: str) -> bool:
        raise Unsupported("release_claim is not built on Redis yet")

    async def extend_claim(self, namespace: str, key: str, token: str, lease: float) -> bool:
        raise Unsupported("extend_claim is not built on Redis yet")

    async def idempotency_record(self, namespace: str, key: str) -> IdempotencyRecord | None:
        raise Unsupported("idempotency_record is not built on Redis yet")

    async def forget_claim(self, namespace: str, key: str) -> bool:
        raise Unsupported("forget_claim is not built on Redis yet")

    async def advance_version(self, namespace: str, entity: str, version: Version) -> bool:
        raise Unsupported("advance_version is not built on Redis yet")

    async def current_version(self, namespace: str, entity: str) -> Version | None:
        raise Unsupported("current_version is not built on Redis yet")

    async def declare_room(
        self,
        room: str,
        options: Mapping[str, object],
        secret_kid: str | None,
        seed: bytes,
        seed_kid: str,
    ) -> RoomRecord:
        raise Unsupported("declare_room is not built on Redis yet")

    async def room_record(self, room: str) -> RoomRecord:
        raise Unsupported("room_record is not built on Redis yet")

    async def list_rooms(self, prefix: str = "") -> list[str]:
        raise Unsupported("list_rooms is not built on Redis yet")

    async def delete_room(self, room: str) -> bool:
        raise Unsupported("delete_room is not built on Redis yet")

    async def room_join(self, room: str, fans: list[str]) -> list[Place]:
        raise Unsupported("room_join is not built on Redis yet")

    async def room_status(self, room: str, seq: int) -> Place:
        raise Unsupported("room_status is not built on Redis yet")

    async def room_tick(self, room: str, holder: str, lease: float) -> TickResult:
        raise Unsupported("room_tick is not built on Redis yet")

    async def room_release_admitter(self, room: str, holder: str) -> bool:
        raise Unsupported("room_release_admitter is not built on Redis yet")

    async def room_admit(self, room: str, n: int) -> int:
        raise Unsupported("room_admit is not built on Redis yet")

    async def room_set_rate(self, room: str, rate: float) -> None:
        raise Unsupported("room_set_rate is not built on Redis yet")

    async def room_consume(self, room: str, seq: int) -> str:
        raise Unsupported("room_consume is not built on Redis yet")

    async def room_sold_out(self, room: str) -> int:
        raise Unsupported("room_sold_out is not built on Redis yet")

    async def room_close(self, room: str) -> None:
        raise Unsupported("room_close is not built on Redis yet")

    async def room_stats(self, room: str) -> RoomStats:
        raise Unsupported("room_stats is not built on Redis yet")
