"""The memory backend's idempotency keys and version gates.

A dict per capability, keyed by (namespace, key) and (namespace, entity). Each method runs
without awaiting, so each is one atomic step, as on the durable engines; expired records
count as absent and are swept out now and then.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...clock import Clock
from ...model.idempotency import IdempotencyRecord, Version, same_holder
from .queues import MemoryQueues

__all__ = ["MemoryIdempotency"]

_SWEEP_EVERY = 60.0  # seconds between sweeps of expired records
RUNNING, COMPLETED = "running", "completed"


@dataclass(slots=True, eq=False)
class _Record:
    token: str
    state: str
    expires_at: float
    fingerprint: str | None
    result: bytes | None


class MemoryIdempotency(MemoryQueues):
    """Idempotency keys and versions in this process's memory."""

    def __init__(self, clock: Clock) -> None:
        super().__init__(clock)
        self._claims: dict[tuple[str, str], _Record] = {}
        self._versions: dict[tuple[str, str], Version] = {}
        self._claims_swept = -_SWEEP_EVERY

    def _live(self, namespace: str, key: str, now: float) -> _Record | None:
        self._open()
        if now - self._claims_swept >= _SWEEP_EVERY:
            self._claims_swept = now
            self._claims = {k: r for k, r in self._claims.items() if r.expires_at > now}
        rec = self._claims.get((namespace, key))
        if rec is None or rec.expires_at <= now:
            return None
        return rec

    @staticmethod
    def _public(key: str, rec: _Record) -> IdempotencyRecord:
        return IdempotencyRecord(
            key,
            "completed" if rec.state == COMPLETED else "running",
            rec.expires_at,
            rec.fingerprint,
            rec.result,
        )

    # -- idempotency -----------------------------------------------------------------------
    async def claim(
        self, namespace: str, key: str, token: str, lease: float, fingerprint: str | None
    ) -> IdempotencyRecord | None:
        now = self.clock.now()
        rec = self._live(namespace, key, now)
        if rec is not None and not (rec.state == RUNNING and same_holder(rec.token, token)):
            return self._public(key, rec)
        self._claims[namespace, key] = _Record(token, RUNNING, now + lease, fingerprint, None)
        return None

    async def complete_claim(
        self, namespace: str, key: str, token: str, result: bytes | None, ttl: float
    ) -> bool:
        now = self.clock.now()
        self._open()
        rec = self._claims.get((namespace, key))
        if rec is not None and rec.token != token:
            return False
        fingerprint = rec.fingerprint if rec is not None else None
        self._claims[namespace, key] = _Record(token, COMPLETED, now + ttl, fingerprint, result)
        return True

    async def release_claim(self, namespace: str, key: str, token: str) -> bool:
        self._open()
        rec = self._claims.get((namespace, key))
        if rec is None or rec.token != token or rec.state != RUNNING:
            return False
        del self._claims[namespace, key]
        return True

    async def extend_claim(self, namespace: str, key: str, token: str, lease: float) -> bool:
        now = self.clock.now()
        self._open()
        rec = self._claims.get((namespace, key))
        if rec is None:
            self._claims[namespace, key] = _Record(token, RUNNING, now + lease, None, None)
            return True
        if rec.token != token or rec.state != RUNNING:
            return False
        rec.expires_at = now + lease
        return True

    async def idempotency_record(self, namespace: str, key: str) -> IdempotencyRecord | None:
        rec = self._live(namespace, key, self.clock.now())
        return None if rec is None else self._public(key, rec)

    async def forget_claim(self, namespace: str, key: str) -> bool:
        rec = self._live(namespace, key, self.clock.now())
        self._claims.pop((namespace, key), None)
        return rec is not None

    async def advance_version(self, namespace: str, entity: str, version: Version) -> bool:
        self._open()
        stored = self._versions.get((namespace, entity))
        if stored is not None and version <= stored:
            return False
        self._versions[namespace, entity] = version
        return True

    async def current_version(self, namespace: str, entity: str) -> Version | None:
        self._open()
        return self._versions.get((namespace, entity))
