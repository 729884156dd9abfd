"""The SQLite backend's attention reads: a domain's counters, its busiest keys, its
tenants over the last minute, and the cheap look a taker makes before it takes."""

from __future__ import annotations

from typing import Any

import orjson

from ...model.attention import (
    ATTENTION_COUNTERS,
    AttentionStats,
    KeyStats,
    SignalHint,
    TenantStats,
)
from ..attention_policy import tenant_rows
from .attention import prune_usage, sweep_domain
from .messages import VISIBLE, oldest_age, settle
from .txn import Txn

__all__ = ["hint", "key_stats", "stats", "tenant_stats"]


def stats(t: Txn, domain: str) -> AttentionStats:
    d = t.domain(domain)
    sweep_domain(t, d)
    conn = t.conn
    row = conn.execute(
        "SELECT " + ", ".join(ATTENTION_COUNTERS) + ", discarded, clear_sum, clear_count "
        "FROM fairq_att_domains WHERE id = ?",
        (d.id,),
    ).fetchone()
    pending, keys = conn.execute(
        "SELECT coalesce(SUM(pending), 0), COUNT(*) FROM fairq_att_keys WHERE domain_id = ?",
        (d.id,),
    ).fetchone()
    (slices,) = conn.execute(
        "SELECT COUNT(*) FROM fairq_att_slices WHERE domain_id = ?", (d.id,)
    ).fetchone()
    counters = dict(zip(ATTENTION_COUNTERS, row[: len(ATTENTION_COUNTERS)], strict=True))
    discarded, clear_sum, clear_count = row[len(ATTENTION_COUNTERS) :]
    return AttentionStats(
        signals_pending=pending,
        slices=slices,
        **counters,
        discarded=orjson.loads(discarded),
        clear_time_avg=clear_sum / clear_count if clear_count else 0.0,
        keys=keys,
        queue=f"attention.{domain}.work",
    )


def key_stats(t: Txn, domain: str, top: int) -> list[KeyStats]:
    d = t.domain(domain)
    sweep_domain(t, d)
    settle(t)  # in_flight and the oldest message count no acked row
    t.flush()
    rows = t.conn.execute(
        "SELECT k.key, k.tenant, k.plan, k.state, coalesce(" + VISIBLE + " + q.delayed, 0), "
        "coalesce(q.in_flight, 0), q.id, k.active, k.pending, k.processed "
        "FROM fairq_att_keys k LEFT JOIN fairq_queues q ON q.name = k.queue "
        "WHERE k.domain_id = ? ORDER BY 5 DESC, 6 DESC, k.key LIMIT ?",
        (d.id, top),
    ).fetchall()
    out = []
    for key, tenant, plan, state, backlog, in_flight, qid, active, pending, processed in rows:
        oldest = oldest_age(t, qid) if qid is not None and backlog + in_flight else 0.0
        out.append(
            KeyStats(
                key, tenant, plan, state, backlog, in_flight, oldest, active, pending, processed
            )
        )
    return out


def tenant_stats(t: Txn, domain: str, top: int) -> list[TenantStats]:
    d = t.domain(domain)
    sweep_domain(t, d)
    prune_usage(t, d)
    settle(t)  # the visible counts take in the receives not counted yet
    t.flush()
    conn = t.conn
    used = {
        tenant: (busy, slices, messages)
        for tenant, busy, slices, messages in conn.execute(
            "SELECT tenant, SUM(busy), SUM(slices), SUM(messages) FROM fairq_att_usage "
            "WHERE domain_id = ? GROUP BY tenant",
            (d.id,),
        )
    }
    keys: dict[str, list[tuple[int, int, int]]] = {}
    for tenant, plan, visible, active in conn.execute(
        "SELECT * FROM (SELECT k.tenant, k.plan, " + VISIBLE + " AS visible, k.active "
        "FROM fairq_att_keys k JOIN fairq_queues q ON q.name = k.queue "
        "WHERE k.domain_id = ? AND k.state = 'active') WHERE visible > 0",
        (d.id,),
    ):
        cap = (d.config.plans.get(plan) or d.config.plans[d.config.default_plan]).max_concurrency
        keys.setdefault(tenant, []).append((visible, active, cap))
    return tenant_rows(used, keys, top)


_HINT = (
    "SELECT EXISTS (SELECT 1 FROM fairq_att_tenants WHERE domain_id = d.id AND ready > 0), "
    "(SELECT MIN(due) FROM fairq_att_signals WHERE domain_id = d.id AND ready = 0), "
    "(SELECT MIN(lease_until) FROM fairq_att_slices WHERE domain_id = d.id) "
    "FROM fairq_att_domains d WHERE d.name = ?"
)


def hint(conn: Any, domain: str) -> SignalHint:
    """A read outside any transaction: is a signal ready, else when is one due (a delayed
    signal, or a slice lease whose end may free a key). A domain that is not there reads
    as ready, so the take that follows raises ``AttentionNotFound``."""
    row = conn.execute(_HINT, (domain,)).fetchone()
    if row is None:
        return SignalHint(True, None)
    ready, due, lease = row
    if ready:
        return SignalHint(True, None)
    found = [x for x in (due, lease) if x is not None]
    return SignalHint(False, min(found) if found else None)
