"""The Redis backend's idempotency keys and version gates: one hash per record and one
string per entity's version, each its own hash tag (so a namespace with millions of keys
spreads over every Cluster node), each operation one script on that one key. Also the
named counters another engine keeps here (``add_counts``: RabbitMQ's ``?store=``), one
hash per scope.

The record's ``e`` (end of lease or ttl, on the scripts' clock) decides whether it is
live; Redis's own key expiry, set a minute past it, only frees the memory.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...model.idempotency import IdempotencyRecord, Version
from .queues import _text
from .topics import RedisTopics

__all__ = ["RedisIdempotency"]


def _record(key: str, got: list[Any]) -> IdempotencyRecord | None:
    if not got:
        return None
    state, expires, fingerprint, raw = got
    return IdempotencyRecord(
        key,
        "completed" if _text(state) == "completed" else "running",
        float(expires),
        _text(fingerprint) if fingerprint else None,
        raw if raw else None,
    )


class RedisIdempotency(RedisTopics):
    """Idempotency records and version gates on Redis."""

    def _ikey(self, namespace: str, key: str) -> str:
        return f"{self.prefix}{{i:{namespace}:{key}}}"

    def _vkey(self, namespace: str, entity: str) -> str:
        return f"{self.prefix}{{v:{namespace}:{entity}}}"

    async def claim(
        self, namespace: str, key: str, token: str, lease: float, fingerprint: str | None
    ) -> IdempotencyRecord | None:
        got = await self.run_key(
            "claim", self._ikey(namespace, key), token, repr(lease), fingerprint or ""
        )
        return _record(key, got)

    async def complete_claim(
        self, namespace: str, key: str, token: str, result: bytes | None, ttl: float
    ) -> bool:
        has = "1" if result is not None else "0"
        got = await self.run_key(
            "complete_claim", self._ikey(namespace, key), token, repr(ttl), has, result or b""
        )
        return bool(got)

    async def release_claim(self, namespace: str, key: str, token: str) -> bool:
        return bool(await self.run_key("release_claim", self._ikey(namespace, key), token))

    async def extend_claim(self, namespace: str, key: str, token: str, lease: float) -> bool:
        got = await self.run_key("extend_claim", self._ikey(namespace, key), token, repr(lease))
        return bool(got)

    async def idempotency_record(self, namespace: str, key: str) -> IdempotencyRecord | None:
        got = await self.run_key("idempotency_record", self._ikey(namespace, key), "")
        return _record(key, got)

    async def forget_claim(self, namespace: str, key: str) -> bool:
        got = await self.run_key("idempotency_record", self._ikey(namespace, key), "forget")
        return bool(got)

    async def advance_version(self, namespace: str, entity: str, version: Version) -> bool:
        kind = "i" if isinstance(version, int) else "f"
        text = str(version) if kind == "i" else repr(float(version))
        got = await self.run_key("advance_version", self._vkey(namespace, entity), kind, text)
        return bool(got)

    async def current_version(self, namespace: str, entity: str) -> Version | None:
        raw = await self.command("GET", self._vkey(namespace, entity))
        if raw is None:
            return None
        kind, text = _text(raw).split(":", 1)
        return int(text) if kind == "i" else float(text)

    # -- counters kept for other engines -------------------------------------------------------
    def _ckey(self, scope: str) -> str:
        return f"{self.prefix}{{c:{scope}}}"

    async def add_counts(self, scope: str, counts: Mapping[str, int]) -> None:
        pairs = [x for name, n in counts.items() if n for x in (name, str(int(n)))]
        if pairs:
            await self.run_key("add_counts", self._ckey(scope), *pairs)

    async def read_counts(self, scope: str) -> dict[str, int]:
        got = await self.command("HGETALL", self._ckey(scope)) or {}
        items = got.items() if isinstance(got, dict) else zip(got[::2], got[1::2], strict=True)
        return {_text(k): int(v) for k, v in items}

    async def drop_counts(self, scope: str) -> None:
        await self.command("DEL", self._ckey(scope))
