"""What the Redis backend's attention reads add up: the replies of ``attention_stats``,
``attention_key_stats`` and ``attention_tenant_stats``, one per shard of a domain, summed
(counters, pending signals, slices, keys), merged (the busiest keys of every shard) and
shared out (tenants' usage and backlog, by ``attention_policy.tenant_rows``)."""

from __future__ import annotations

from typing import Any

from ...message import id_time
from ...model.attention import ATTENTION_COUNTERS, AttentionStats, KeyStats, TenantStats
from ..attention_policy import tenant_rows
from .queues import _text
from .rooms import RedisRooms

__all__ = ["AttentionReads"]


class AttentionReads(RedisRooms):
    """The sums over a domain's shards."""

    RECONCILE_CHUNK = 2000  # keys the reconciler visits per script call and set
    # key and tenant stats read the keys with backlog a chunk per script call, and at most
    # STATS_SCAN of them per shard: a dashboard refresh never walks a million keys
    STATS_CHUNK = 1000
    STATS_SCAN = 20_000

    def sum_stats(self, domain: str, replies: list[Any]) -> AttentionStats:
        raw: dict[str, float] = {}
        pending = slices = keys = 0
        for flat, p, s, k in replies:
            for name, value in zip(flat[::2], flat[1::2], strict=True):
                n = _text(name)
                if n in ("vclock", "estimate", "sigseq", "turn_counter"):
                    continue  # each shard's own scheduler state, not counters
                try:
                    raw[n] = raw.get(n, 0.0) + float(_text(value))
                except ValueError:  # not a number: nothing to add up
                    continue
            pending, slices, keys = pending + int(p), slices + int(s), keys + int(k)
        counters = {c: int(raw.get(c, 0)) for c in ATTENTION_COUNTERS}
        discarded = {
            k.split(":", 1)[1]: int(v) for k, v in raw.items() if k.startswith("discarded:")
        }
        clear_count = int(raw.get("clear_count", 0))
        clear_sum = raw.get("clear_sum", 0.0)
        return AttentionStats(
            signals_pending=pending,
            slices=slices,
            **counters,
            discarded=discarded,
            clear_time_avg=clear_sum / clear_count if clear_count else 0.0,
            keys=keys,
            queue=f"attention.{domain}.work",
        )

    def top_keys(self, replies: list[Any], top: int) -> list[KeyStats]:
        now = self.clock.now()
        out = []
        for rows in replies:
            for r in rows:
                key, tenant, plan, state = (_text(x) for x in r[:4])
                backlog, in_flight = int(r[4]), int(r[5])
                oldest = _text(r[6])
                age = max(0.0, now - id_time(int(oldest, 16))) if oldest else 0.0
                out.append(
                    KeyStats(
                        key,
                        tenant,
                        plan,
                        state,
                        backlog,
                        in_flight,
                        age,
                        int(r[7]),
                        int(r[8]),
                        int(r[9]),
                    )
                )
        out.sort(key=lambda k: (-k.backlog, -k.in_flight, k.key))
        return out[:top]

    def top_tenants(self, replies: list[Any], top: int) -> list[TenantStats]:
        used: dict[str, list[float]] = {}
        keys: dict[str, list[tuple[int, int, int]]] = {}
        for used_rows, key_rows in replies:
            for tenant, busy, slices, messages in used_rows:
                u = used.setdefault(_text(tenant), [0.0, 0, 0])
                u[0] += float(busy)
                u[1] += int(slices)
                u[2] += int(messages)
            for tenant, visible, active, cap in key_rows:
                keys.setdefault(_text(tenant), []).append((int(visible), int(active), int(cap)))
        return tenant_rows({n: (u[0], int(u[1]), int(u[2])) for n, u in used.items()}, keys, top)
