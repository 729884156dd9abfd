"""PostgreSQL attention: keys and what is read about them — set_resource (plan, state,
tenant), stats, key_stats, tenant_stats (worker-time shares over the last minute, at cap),
the reconciler, and the cheap look a taker makes before it takes (:func:`hint`).

Each is one transaction, or one read-only statement (:func:`hint`); the slice cycle is in
:mod:`.attention`, the shared pieces in :mod:`.attention_rows`.
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING

from ...errors import InvalidOption
from ...model.attention import (
    ATTENTION_COUNTERS,
    AttentionStats,
    KeyStats,
    SignalHint,
    TenantStats,
)
from ..attention_policy import resignal_allowed, tenant_rows, usage_since
from .attention import begin
from .attention_rows import (
    Domain,
    Key,
    Txn,
    count,
    key_row,
    load_key,
    plan_of,
    run,
    signal,
    tenant_ready,
    view,
)
from .connection import Cursor

if TYPE_CHECKING:
    from . import PostgresBackend


async def set_resource(
    b: PostgresBackend,
    domain: str,
    key: str,
    plan: str | None,
    state: str | None,
    tenant: str | None,
) -> None:
    async def go(t: Txn) -> None:
        d = await begin(t, domain)
        if plan is not None and plan not in d.config.plans:
            raise InvalidOption(
                f"no plan {plan!r} in {domain!r} (plans: {', '.join(d.config.plans)})"
            )
        k = await key_row(t, d, key)
        if plan is not None:
            k.plan = plan
        if tenant is not None and tenant != k.tenant:
            await _move_tenant(t, d, k, tenant)
        if state is not None:
            k.state = state
            if state == "active":
                k.parked = False
                v = await view(t, d, k)
                if k.pending == 0 and resignal_allowed(plan_of(d, k), k.active, 0):
                    if v.visible:
                        await signal(t, d, k, t.now)
                    elif v.waiting_due is not None:
                        await signal(t, d, k, v.waiting_due)
        await k.save(t, d)

    await run(b, go)


async def _move_tenant(t: Txn, d: Domain, k: Key, tenant: str) -> None:
    await t.cur.execute(
        f"UPDATE {t.s}.att_signals SET tenant = %s WHERE domain_id = %s AND key = %s "
        "RETURNING id, ready",
        (tenant, d.id, k.key),
    )
    ready_ids = sorted(int(r[0]) for r in await t.cur.fetchall() if r[1])
    if ready_ids:
        # the ready ones join the new tenant's tail, in their order (new ids: the ready
        # signals' order), as the memory backend and Redis move them
        await t.cur.execute(
            f"UPDATE {t.s}.att_signals g SET id = n.new FROM (SELECT o.id, "
            "nextval(pg_get_serial_sequence(%s, 'id')) AS new "
            "FROM unnest(%s::bigint[]) WITH ORDINALITY AS o(id, i)) n "
            "WHERE g.id = n.id RETURNING g.id",
            (f"{t.s}.att_signals", ready_ids),
        )
        moved = sorted(int(r[0]) for r in await t.cur.fetchall())
        await t.cur.execute(
            f"UPDATE {t.s}.att_tenants SET ready = ready - %s WHERE domain_id = %s AND tenant = %s",
            (len(ready_ids), d.id, k.tenant),
        )
        await tenant_ready(t, d, tenant, moved[0], len(moved))
    k.tenant = tenant


async def stats(b: PostgresBackend, domain: str) -> AttentionStats:
    async def go(t: Txn) -> AttentionStats:
        d = await begin(t, domain)
        await t.cur.execute(
            "SELECT " + ", ".join(ATTENTION_COUNTERS) + ", discarded, clear_sum, clear_count "
            f"FROM {t.s}.att_domains WHERE id = %s",
            (d.id,),
        )
        row = await t.cur.fetchone()
        assert row is not None
        await t.cur.execute(
            f"SELECT coalesce(sum(pending), 0), count(*) FROM {t.s}.att_keys WHERE domain_id = %s",
            (d.id,),
        )
        pk = await t.cur.fetchone()
        assert pk is not None
        await t.cur.execute(f"SELECT count(*) FROM {t.s}.att_slices WHERE domain_id = %s", (d.id,))
        sl = await t.cur.fetchone()
        assert sl is not None
        counters = {
            c: int(v)
            for c, v in zip(ATTENTION_COUNTERS, row[: len(ATTENTION_COUNTERS)], strict=True)
        }
        discarded, clear_sum, clear_count = row[len(ATTENTION_COUNTERS) :]
        return AttentionStats(
            signals_pending=int(pk[0]),
            slices=int(sl[0]),
            **counters,
            discarded={k: int(v) for k, v in discarded.items()},
            clear_time_avg=clear_sum / clear_count if clear_count else 0.0,
            keys=int(pk[1]),
            queue=f"attention.{domain}.work",
        )

    result: AttentionStats = await run(b, go)
    return result


async def key_stats(b: PostgresBackend, domain: str, top: int) -> list[KeyStats]:
    async def go(t: Txn) -> list[KeyStats]:
        d = await begin(t, domain)
        await t.cur.execute(
            "SELECT k.key, k.tenant, k.plan, k.state, k.queue, k.active, k.pending, k.processed "
            # what running slices' acks counted so far (their end adds it to the key's row)
            f"+ coalesce((SELECT sum(l.counted) FROM {t.s}.att_slices l "
            "WHERE l.domain_id = k.domain_id AND l.key = k.key), 0), "
            f"coalesce((SELECT sum(c.depth) FROM {t.s}.counts c JOIN {t.s}.queues q "
            "ON q.id = c.queue_id WHERE q.name = k.queue), 0) AS depth "
            f"FROM {t.s}.att_keys k WHERE k.domain_id = %s ORDER BY depth DESC, k.key LIMIT %s",
            (d.id, top),
        )
        out = []
        for key, tenant, plan, state, queue, active, pending, processed, depth in list(
            await t.cur.fetchall()
        ):
            backlog = in_flight = 0
            oldest = 0.0
            if depth:
                await t.cur.execute(b.q.stats, (queue, t.now))
                srow = await t.cur.fetchone()
                assert srow is not None
                backlog, in_flight, oldest = int(srow[0] + srow[1]), int(srow[2]), float(srow[3])
            out.append(
                KeyStats(
                    key,
                    tenant,
                    plan,
                    state,
                    backlog,
                    in_flight,
                    oldest,
                    active,
                    pending,
                    int(processed),
                )
            )
        out.sort(key=lambda s: (-s.backlog, -s.in_flight, s.key))
        return out

    result: list[KeyStats] = await run(b, go)
    return result


async def tenant_stats(b: PostgresBackend, domain: str, top: int) -> list[TenantStats]:
    """The usage buckets of the last minute, summed per tenant, and each tenant's active
    keys with backlog (visible messages; one query for all of them), for ``at_cap``. Only
    keys with a pending signal or a running slice are counted — every key with backlog
    has one (rule 1), but for a lost signal the reconciler has yet to mend — so the query
    skips the idle keys of a domain of a million."""

    async def go(t: Txn) -> list[TenantStats]:
        d = await begin(t, domain)
        await _prune_usage(t, d)
        await t.cur.execute(
            f"SELECT tenant, sum(busy), sum(slices), sum(messages) FROM {t.s}.att_usage "
            "WHERE domain_id = %s GROUP BY tenant",
            (d.id,),
        )
        used = {r[0]: (float(r[1]), int(r[2]), int(r[3])) for r in await t.cur.fetchall()}
        await t.cur.execute(
            f"SELECT k.tenant, k.plan, k.active, v.n FROM {t.s}.att_keys k "
            f"JOIN {t.s}.queues q ON q.name = k.queue "
            f"CROSS JOIN LATERAL (SELECT {t.s}.att_visible(q.id, q.max_priority, %s) AS n) v "
            "WHERE k.domain_id = %s AND k.state = 'active' AND (k.pending > 0 OR k.active > 0) "
            "AND v.n > 0",
            (t.now, d.id),
        )
        keys: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
        plans = d.config.plans
        for tenant, plan, active, visible in await t.cur.fetchall():
            cap = (plans.get(plan) or plans[d.config.default_plan]).max_concurrency
            keys[tenant].append((int(visible), int(active), cap))
        return tenant_rows(used, keys, top)

    result: list[TenantStats] = await run(b, go)
    return result


async def _prune_usage(t: Txn, d: Domain) -> None:
    await t.cur.execute(
        f"DELETE FROM {t.s}.att_usage WHERE domain_id = %s AND bucket < %s",
        (d.id, usage_since(t.now)),
    )


async def reconcile(b: PostgresBackend, domain: str) -> int:
    """One query finds the keys to signal: no per-key round trips to find them."""

    async def go(t: Txn) -> int:
        d = await begin(t, domain)
        await t.cur.execute(
            f"SELECT k.key FROM {t.s}.att_keys k JOIN {t.s}.queues q ON q.name = k.queue "
            "WHERE k.domain_id = %s AND k.state = 'active' AND k.pending = 0 AND k.active = 0 "
            f"AND (SELECT coalesce(sum(c.depth), 0) FROM {t.s}.counts c "
            "WHERE c.queue_id = q.id) > 0 ORDER BY k.key",
            (d.id,),
        )
        lost = [r[0] for r in await t.cur.fetchall()]
        n = 0
        for key in lost:
            k = await load_key(t, d, key)
            if k is None or k.pending or k.active:
                continue
            v = await view(t, d, k)
            due = t.now if v.visible else v.waiting_due
            if due is None:
                continue
            await signal(t, d, k, due)
            await k.save(t, d)
            n += 1
        await count(t, d, "reconciled", n)
        await _prune_usage(t, d)
        return n

    return int(await run(b, go))


async def hint(b: PostgresBackend, domain: str) -> SignalHint:
    """One read-only statement (three index probes, no lock, no write): is a signal ready,
    else when is one due (a delayed signal, or a slice lease whose end may free a key). A
    domain that is not there reads as ready, so the take that follows raises
    ``AttentionNotFound``."""
    s = b.s

    async def go(cur: Cursor) -> SignalHint:
        await cur.execute(
            f"SELECT EXISTS (SELECT 1 FROM {s}.att_tenants x WHERE x.domain_id = d.id "
            f"AND x.ready > 0), (SELECT min(g.due) FROM {s}.att_signals g "
            "WHERE g.domain_id = d.id AND NOT g.ready), "
            f"(SELECT min(l.lease_until) FROM {s}.att_slices l WHERE l.domain_id = d.id) "
            f"FROM {s}.att_domains d WHERE d.name = %s",
            (domain,),
        )
        row = await cur.fetchone()
        if row is None or row[0]:
            return SignalHint(True, None)
        found = [float(x) for x in row[1:] if x is not None]
        return SignalHint(False, min(found) if found else None)

    result: SignalHint = await b.pool.run(go, wakes=False)
    return result
