"""The PostgreSQL backend's attention operations, each one transaction.

Keys, tenants, signals and slices are tables (``migrations/0005_attention.sql``); every
decision is :mod:`fairq.backends.attention_policy`'s, the same as on every backend.
Locks: a publish locks its key's row; taking a signal, ending a slice, the reconciler and
set_resource lock the domain's row first (one scheduler decision at a time per domain),
then the key's row before its tenant's, the same order as a publish, so the two cannot
deadlock on each other. Which tenant goes next is decided in one place, :func:`_next_turn`
(least recently served tenant with a due signal, FIFO within it), so the scheduler can be
swapped without touching the rest.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from ...errors import AttentionNotFound, InvalidOption, LeaseLost
from ...message import Received
from ...model.attention import (
    ATTENTION_COUNTERS,
    AttentionConfig,
    AttentionStats,
    KeyStats,
    Plan,
    Slice,
)
from ...model.queues import Envelope, queue_config_from_options
from ..attention_policy import (
    KeyView,
    check_change,
    next_permit,
    on_signal,
    on_slice_end,
    refill,
    resignal_allowed,
)
from . import queues
from .connection import Cursor

if TYPE_CHECKING:
    from . import PostgresBackend

_MAX_SIGNALS_PER_TAKE = 256
_KEY_COLS = (
    "key, queue, tenant, plan, state, parked, pending, active, tokens, tokens_at, backlog_since"
)


@dataclass(slots=True)
class _Txn:
    cur: Cursor
    b: PostgresBackend
    now: float
    notify: set[str] = field(default_factory=set)

    @property
    def s(self) -> str:
        return self.b.s


@dataclass(slots=True)
class _Domain:
    id: int
    name: str
    config: AttentionConfig


class _Key:
    __slots__ = (
        "active",
        "backlog_since",
        "key",
        "parked",
        "pending",
        "plan",
        "queue",
        "state",
        "tenant",
        "tokens",
        "tokens_at",
    )

    def __init__(self, row: tuple[Any, ...]) -> None:
        (
            self.key,
            self.queue,
            self.tenant,
            self.plan,
            self.state,
            self.parked,
            self.pending,
            self.active,
            tokens,
            self.tokens_at,
            self.backlog_since,
        ) = row
        self.tokens = math.inf if tokens is None else float(tokens)

    async def save(self, t: _Txn, d: _Domain, processed: int = 0) -> None:
        await t.cur.execute(
            f"UPDATE {t.s}.att_keys SET tenant = %s, plan = %s, state = %s, parked = %s, "
            "pending = %s, active = %s, tokens = %s, tokens_at = %s, backlog_since = %s, "
            "processed = processed + %s WHERE domain_id = %s AND key = %s",
            (
                self.tenant,
                self.plan,
                self.state,
                bool(self.parked),
                self.pending,
                self.active,
                None if self.tokens == math.inf else self.tokens,
                self.tokens_at,
                self.backlog_since,
                processed,
                d.id,
                self.key,
            ),
        )


async def _domain(t: _Txn, name: str, lock: bool = False) -> _Domain:
    await t.cur.execute(
        f"SELECT id, config FROM {t.s}.att_domains WHERE name = %s"
        + (" FOR UPDATE" if lock else ""),
        (name,),
    )
    row = await t.cur.fetchone()
    if row is None:
        raise AttentionNotFound(name)
    return _Domain(row[0], name, AttentionConfig.from_dict(row[1]))


async def _load_key(t: _Txn, d: _Domain, key: str) -> _Key | None:
    await t.cur.execute(
        f"SELECT {_KEY_COLS} FROM {t.s}.att_keys WHERE domain_id = %s AND key = %s FOR UPDATE",
        (d.id, key),
    )
    row = await t.cur.fetchone()
    return None if row is None else _Key(row)


async def _key(t: _Txn, d: _Domain, key: str) -> _Key:
    k = await _load_key(t, d, key)
    if k is None:
        await t.cur.execute(
            f"INSERT INTO {t.s}.att_keys (domain_id, key, queue, tenant, plan, tokens_at) "
            "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
            (d.id, key, d.config.queue_for(d.name, key), key, d.config.default_plan, t.now),
        )
        k = await _load_key(t, d, key)
        assert k is not None
    return k


def _plan(d: _Domain, k: _Key) -> Plan:
    return d.config.plans.get(k.plan) or d.config.plans[d.config.default_plan]


async def _count(t: _Txn, d: _Domain, counter: str, n: int = 1) -> None:
    if n:
        await t.cur.execute(
            f"UPDATE {t.s}.att_domains SET {counter} = {counter} + %s WHERE id = %s", (n, d.id)
        )


async def _view(t: _Txn, d: _Domain, k: _Key) -> KeyView:
    plan = _plan(d, k)
    await t.cur.execute(
        f"SELECT * FROM {t.s}.att_view(%s, %s, %s)", (k.queue, t.now, plan.max_messages + 1)
    )
    row = await t.cur.fetchone()
    assert row is not None
    visible = int(row[0] or 0)
    waiting_due = None if visible or row[1] is None else float(row[1])
    tokens = refill(k.tokens, k.tokens_at, t.now, plan)
    return KeyView(k.state, k.active, k.pending, visible, waiting_due, tokens)


async def _signal(t: _Txn, d: _Domain, k: _Key, due: float) -> None:
    """A signal for ``k`` at the tail of its tenant, or delayed until ``due``."""
    ready = due <= t.now
    await t.cur.execute(
        f"INSERT INTO {t.s}.att_signals (domain_id, tenant, key, due, ready) "
        "VALUES (%s, %s, %s, %s, %s) RETURNING id",
        (d.id, k.tenant, k.key, due, ready),
    )
    row = await t.cur.fetchone()
    assert row is not None
    k.pending += 1
    if ready:
        await _tenant_ready(t, d, k.tenant, int(row[0]), 1)
    t.notify.add(d.name)


async def _tenant_ready(t: _Txn, d: _Domain, tenant: str, signal_id: int, n: int) -> None:
    await t.cur.execute(
        f"INSERT INTO {t.s}.att_tenants AS x (domain_id, tenant, ready, since) "
        "VALUES (%s, %s, %s, %s) ON CONFLICT (domain_id, tenant) DO UPDATE SET "
        "ready = x.ready + excluded.ready, "
        "since = CASE WHEN x.ready = 0 THEN excluded.since ELSE x.since END",
        (d.id, tenant, n, signal_id),
    )


async def _note_backlog(t: _Txn, d: _Domain, k: _Key, has_backlog: bool) -> None:
    if has_backlog and k.backlog_since is None:
        k.backlog_since = t.now
    elif not has_backlog and k.backlog_since is not None:
        await t.cur.execute(
            f"UPDATE {t.s}.att_domains SET clear_sum = clear_sum + %s, "
            "clear_count = clear_count + 1 WHERE id = %s",
            (t.now - k.backlog_since, d.id),
        )
        k.backlog_since = None


async def _sweep(t: _Txn, d: _Domain) -> None:
    """Delayed signals that came due join their tenant; expired slices free their token."""
    await t.cur.execute(
        f"UPDATE {t.s}.att_signals SET ready = true WHERE id IN (SELECT id FROM "
        f"{t.s}.att_signals WHERE domain_id = %s AND NOT ready AND due <= %s ORDER BY due "
        "FOR UPDATE) RETURNING id, tenant",
        (d.id, t.now),
    )
    for sid, tenant in sorted(await t.cur.fetchall()):
        await _tenant_ready(t, d, tenant, sid, 1)
    await t.cur.execute(
        f"SELECT token FROM {t.s}.att_slices WHERE domain_id = %s AND lease_until <= %s",
        (d.id, t.now),
    )
    for (token,) in await t.cur.fetchall():
        await _end_slice(t, d, token, 0, None)


async def _end_slice(
    t: _Txn, d: _Domain, token: str, processed: int, retry_at: float | None
) -> bool:
    await t.cur.execute(f"SELECT key FROM {t.s}.att_slices WHERE token = %s", (token,))
    row = await t.cur.fetchone()
    await _count(t, d, "processed", processed)
    if row is None:
        return False
    k = await _load_key(t, d, row[0])  # the key's lock first, as a publish takes it
    await t.cur.execute(f"DELETE FROM {t.s}.att_slices WHERE token = %s", (token,))
    if k is None or t.cur.rowcount == 0:
        return k is not None
    k.active -= 1
    view = await _view(t, d, k)
    when, counter = on_slice_end(view, _plan(d, k), t.now, retry_at)
    if when is not None and counter is not None:
        await _count(t, d, counter)
        await _signal(t, d, k, when)
    await _note_backlog(t, d, k, bool(view.visible or view.waiting_due is not None))
    await k.save(t, d, processed)
    return True


async def _run(b: PostgresBackend, fn: Any, connection: object | None = None) -> Any:
    now = b.now()
    notify: set[str] = set()

    async def go(cur: Cursor) -> Any:
        t = _Txn(cur, b, now)
        result = await fn(t)
        for domain in t.notify:
            await cur.execute(f"SELECT {b.s}.wake(%s)", ("a:" + domain,))
        notify.update(t.notify)
        return result

    result = await b.pool.run(go, transaction=True, connection=connection)
    if connection is None and notify:
        b.wakeups.notify([f"attention:{d}" for d in notify])
    return result


# -- domains -------------------------------------------------------------------------------
async def declare_attention(b: PostgresBackend, name: str, config: AttentionConfig) -> None:
    data = orjson.dumps(config.to_dict()).decode()

    async def go(t: _Txn) -> None:
        await t.cur.execute(
            f"SELECT id, config FROM {t.s}.att_domains WHERE name = %s FOR UPDATE", (name,)
        )
        row = await t.cur.fetchone()
        if row is None:
            await t.cur.execute(
                f"INSERT INTO {t.s}.att_domains (name, config, created_at) "
                "VALUES (%s, %s::jsonb, %s) ON CONFLICT (name) DO NOTHING",
                (name, data, t.now),
            )
            if t.cur.rowcount == 1:
                return
            await t.cur.execute(
                f"SELECT id, config FROM {t.s}.att_domains WHERE name = %s FOR UPDATE", (name,)
            )
            row = await t.cur.fetchone()
            assert row is not None
        old = AttentionConfig.from_dict(row[1])
        if old == config:
            return
        await t.cur.execute(f"SELECT 1 FROM {t.s}.att_keys WHERE domain_id = %s LIMIT 1", (row[0],))
        check_change(name, old, config, await t.cur.fetchone() is not None)
        await t.cur.execute(
            f"UPDATE {t.s}.att_domains SET config = %s::jsonb WHERE id = %s", (data, row[0])
        )

    await _run(b, go)


async def attention_config(b: PostgresBackend, name: str) -> AttentionConfig:
    async def go(t: _Txn) -> AttentionConfig:
        return (await _domain(t, name)).config

    result: AttentionConfig = await _run(b, go)
    return result


async def list_attention(b: PostgresBackend, prefix: str) -> list[str]:
    from .topics import names

    return await b.pool.run(lambda cur: names(cur, b.s, "att_domains", prefix))


async def delete_attention(b: PostgresBackend, name: str) -> bool:
    async def go(t: _Txn) -> bool:
        await t.cur.execute(f"SELECT id FROM {t.s}.att_domains WHERE name = %s FOR UPDATE", (name,))
        row = await t.cur.fetchone()
        if row is None:
            return False
        for table in ("att_keys", "att_tenants", "att_signals", "att_slices"):
            await t.cur.execute(f"DELETE FROM {t.s}.{table} WHERE domain_id = %s", (row[0],))
        await t.cur.execute(f"DELETE FROM {t.s}.att_domains WHERE id = %s", (row[0],))
        return True

    return bool(await _run(b, go))


# -- the slice cycle -----------------------------------------------------------------------
async def publish(
    b: PostgresBackend,
    domain: str,
    key: str,
    envs: list[Envelope],
    connection: object | None = None,
) -> list[str]:
    from ...message import format_id

    async def go(t: _Txn) -> list[str]:
        d = await _domain(t, domain)
        k = await _load_key(t, d, key)
        if k is not None and k.state == "removed":
            raise InvalidOption(
                f"key {key!r} of {domain!r} was removed; set_resource(key, state='active') first"
            )
        name = d.config.queue_for(domain, key)
        await t.cur.execute(f"SELECT 1 FROM {t.s}.queues WHERE name = %s", (name,))
        if await t.cur.fetchone() is None:
            config = queue_config_from_options(name, dict(d.config.queue_options))
            await queues.declare_queue(t.cur, t.s, name, config, t.now)
        bodies, attrs, delays, prios, groups, dedups = queues.envelope_arrays(envs)
        await t.cur.execute(b.q.send, (name, t.now, bodies, attrs, delays, prios, groups, dedups))
        row = await t.cur.fetchone()
        assert row is not None
        ids = [format_id(i) for i in row[0]]
        k = k or await _key(t, d, key)
        view = await _view(t, d, k)
        await _note_backlog(t, d, k, bool(view.visible or view.waiting_due is not None))
        if k.pending == 0:
            if resignal_allowed(_plan(d, k), k.active, 0):
                await _signal(t, d, k, t.now if view.visible else (view.waiting_due or t.now))
        elif view.visible:
            await _pull_forward(t, d, k)
        await k.save(t, d)
        return ids

    result: list[str] = await _run(b, go, connection)
    return result


async def _pull_forward(t: _Txn, d: _Domain, k: _Key) -> None:
    """An immediate message must not wait behind the key's delayed signals only."""
    await t.cur.execute(
        f"SELECT 1 FROM {t.s}.att_signals WHERE domain_id = %s AND key = %s AND ready",
        (d.id, k.key),
    )
    if await t.cur.fetchone():
        return
    await t.cur.execute(
        f"DELETE FROM {t.s}.att_signals WHERE id = (SELECT id FROM {t.s}.att_signals "
        "WHERE domain_id = %s AND key = %s AND NOT ready ORDER BY due LIMIT 1) RETURNING id",
        (d.id, k.key),
    )
    if await t.cur.fetchone() is not None:
        k.pending -= 1
        await _signal(t, d, k, t.now)


async def _next_turn(t: _Txn, d: _Domain) -> tuple[str, int, str] | None:
    """THE scheduling decision: which signal is served next — the oldest ready signal of
    the tenant served least recently (ties: the one that became ready first). Returns
    (tenant, signal id, key), or None when no signal is due."""
    await t.cur.execute(
        f"SELECT x.tenant, s.id, s.key FROM {t.s}.att_tenants x "
        f"CROSS JOIN LATERAL (SELECT id, key FROM {t.s}.att_signals "
        "WHERE domain_id = x.domain_id AND tenant = x.tenant AND ready ORDER BY id LIMIT 1) s "
        "WHERE x.domain_id = %s AND x.ready > 0 ORDER BY x.turn, x.since LIMIT 1",
        (d.id,),
    )
    row = await t.cur.fetchone()
    return None if row is None else (row[0], int(row[1]), row[2])


async def take(b: PostgresBackend, domain: str) -> Slice | None:
    async def go(t: _Txn) -> Slice | None:
        d = await _domain(t, domain, lock=True)
        await _sweep(t, d)
        now = t.now
        for _ in range(_MAX_SIGNALS_PER_TAKE):
            turn = await _next_turn(t, d)
            if turn is None:
                # mend counts out of step (a tenant with ready > 0 but no ready signal)
                await t.cur.execute(
                    f"UPDATE {t.s}.att_tenants x SET ready = 0 WHERE domain_id = %s "
                    f"AND ready > 0 AND NOT EXISTS (SELECT 1 FROM {t.s}.att_signals s "
                    "WHERE s.domain_id = x.domain_id AND s.tenant = x.tenant AND s.ready)",
                    (d.id,),
                )
                return None
            tenant, sid, key = turn
            k = await _load_key(t, d, key)
            await t.cur.execute(f"DELETE FROM {t.s}.att_signals WHERE id = %s", (sid,))
            await t.cur.execute(
                f"UPDATE {t.s}.att_domains SET turn_counter = turn_counter + 1 WHERE id = %s "
                "RETURNING turn_counter",
                (d.id,),
            )
            row = await t.cur.fetchone()
            assert row is not None
            await t.cur.execute(
                f"UPDATE {t.s}.att_tenants SET ready = ready - 1, turn = %s "
                "WHERE domain_id = %s AND tenant = %s",
                (row[0], d.id, tenant),
            )
            if k is None:
                continue
            k.pending -= 1
            plan = _plan(d, k)
            view = await _view(t, d, k)
            decision = on_signal(view, plan, now)
            action = decision.action
            if action == "drop":
                await t.cur.execute(
                    f"UPDATE {t.s}.att_domains SET discarded = jsonb_set(discarded, "
                    "ARRAY[%s], to_jsonb(coalesce((discarded ->> %s)::bigint, 0) + 1)) "
                    "WHERE id = %s",
                    (k.state, k.state, d.id),
                )
            elif action == "park":
                k.parked = True
                await _count(t, d, "parked")
            elif action != "slice":
                await _count(t, d, "blocked" if action == "block" else action)
                if action == "rate_limited":
                    k.tokens, k.tokens_at = view.tokens, now
                if action == "empty" and decision.resignal_at is None:
                    await _note_backlog(t, d, k, view.waiting_due is not None)
            if decision.resignal_at is not None:
                await _signal(t, d, k, decision.resignal_at)
            if action != "slice":
                await k.save(t, d)
                continue
            token = secrets.token_hex(12)
            await t.cur.execute(
                f"INSERT INTO {t.s}.att_slices (token, domain_id, key, lease_until) "
                "VALUES (%s, %s, %s, %s)",
                (token, d.id, k.key, now + d.config.slice_lease),
            )
            k.active += 1
            k.tokens, k.tokens_at = view.tokens, now
            if decision.fan_out:
                await _signal(t, d, k, now)
            await k.save(t, d)
            return Slice(domain, k.key, k.queue, token, plan)
        return None

    result: Slice | None = await _run(b, go)
    return result


async def receive(
    b: PostgresBackend, domain: str, token: str, n: int, visibility_timeout: float | None
) -> tuple[list[Received], float | None]:
    async def go(t: _Txn) -> tuple[list[Received], float | None]:
        d = await _domain(t, domain)
        await t.cur.execute(
            f"SELECT key FROM {t.s}.att_slices WHERE token = %s AND domain_id = %s "
            "AND lease_until > %s",
            (token, d.id, t.now),
        )
        row = await t.cur.fetchone()
        if row is None:
            raise LeaseLost([token], "the slice's concurrency token expired")
        k = await _load_key(t, d, row[0])
        assert k is not None
        plan = _plan(d, k)
        tokens = refill(k.tokens, k.tokens_at, t.now, plan)
        allowed = n if tokens == math.inf else min(n, int(tokens))
        if allowed < 1:
            k.tokens, k.tokens_at = tokens, t.now
            await k.save(t, d)
            return [], next_permit(tokens, t.now, plan)
        await t.cur.execute(f"SELECT 1 FROM {t.s}.queues WHERE name = %s", (k.queue,))
        if await t.cur.fetchone() is None:
            return [], None
        await t.cur.execute(b.q.receive, (k.queue, t.now, allowed, visibility_timeout))
        rows = sorted(await t.cur.fetchall(), key=lambda r: r[7])
        got = [queues.received(r, k.queue) for r in rows]
        if tokens != math.inf:
            k.tokens, k.tokens_at = tokens - len(got), t.now
            await k.save(t, d)
        return got, None

    result: tuple[list[Received], float | None] = await _run(b, go)
    return result


async def extend(b: PostgresBackend, domain: str, token: str) -> bool:
    async def go(t: _Txn) -> bool:
        d = await _domain(t, domain)
        await t.cur.execute(
            f"UPDATE {t.s}.att_slices SET lease_until = %s WHERE token = %s AND domain_id = %s "
            "AND lease_until > %s",
            (t.now + d.config.slice_lease, token, d.id, t.now),
        )
        return t.cur.rowcount == 1

    return bool(await _run(b, go))


async def end(
    b: PostgresBackend, domain: str, token: str, processed: int, retry_at: float | None
) -> None:
    async def go(t: _Txn) -> None:
        d = await _domain(t, domain, lock=True)
        await _sweep(t, d)
        await _end_slice(t, d, token, processed, retry_at)

    await _run(b, go)


# -- resources -----------------------------------------------------------------------------
async def set_resource(
    b: PostgresBackend,
    domain: str,
    key: str,
    plan: str | None,
    state: str | None,
    tenant: str | None,
) -> None:
    async def go(t: _Txn) -> None:
        d = await _domain(t, domain, lock=True)
        await _sweep(t, d)
        if plan is not None and plan not in d.config.plans:
            raise InvalidOption(
                f"no plan {plan!r} in {domain!r} (plans: {', '.join(d.config.plans)})"
            )
        k = await _key(t, d, key)
        if plan is not None:
            k.plan = plan
        if tenant is not None and tenant != k.tenant:
            await _move_tenant(t, d, k, tenant)
        if state is not None:
            k.state = state
            if state == "active":
                k.parked = False
                view = await _view(t, d, k)
                if k.pending == 0 and resignal_allowed(_plan(d, k), k.active, 0):
                    if view.visible:
                        await _signal(t, d, k, t.now)
                    elif view.waiting_due is not None:
                        await _signal(t, d, k, view.waiting_due)
        await k.save(t, d)

    await _run(b, go)


async def _move_tenant(t: _Txn, d: _Domain, k: _Key, tenant: str) -> None:
    await t.cur.execute(
        f"UPDATE {t.s}.att_signals SET tenant = %s WHERE domain_id = %s AND key = %s "
        "RETURNING id, ready",
        (tenant, d.id, k.key),
    )
    ready_ids = sorted(int(r[0]) for r in await t.cur.fetchall() if r[1])
    if ready_ids:
        await t.cur.execute(
            f"UPDATE {t.s}.att_tenants SET ready = ready - %s WHERE domain_id = %s AND tenant = %s",
            (len(ready_ids), d.id, k.tenant),
        )
        await _tenant_ready(t, d, tenant, ready_ids[0], len(ready_ids))
    k.tenant = tenant


async def stats(b: PostgresBackend, domain: str) -> AttentionStats:
    async def go(t: _Txn) -> AttentionStats:
        d = await _domain(t, domain, lock=True)
        await _sweep(t, d)
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

    result: AttentionStats = await _run(b, go)
    return result


async def key_stats(b: PostgresBackend, domain: str, top: int) -> list[KeyStats]:
    async def go(t: _Txn) -> list[KeyStats]:
        d = await _domain(t, domain, lock=True)
        await _sweep(t, d)
        await t.cur.execute(
            "SELECT k.key, k.tenant, k.plan, k.state, k.queue, k.active, k.pending, k.processed, "
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

    result: list[KeyStats] = await _run(b, go)
    return result


async def reconcile(b: PostgresBackend, domain: str) -> int:
    """One query finds the keys to signal: no per-key round trips to find them."""

    async def go(t: _Txn) -> int:
        d = await _domain(t, domain, lock=True)
        await _sweep(t, d)
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
            k = await _load_key(t, d, key)
            if k is None or k.pending or k.active:
                continue
            view = await _view(t, d, k)
            due = t.now if view.visible else view.waiting_due
            if due is None:
                continue
            await _signal(t, d, k, due)
            await k.save(t, d)
            n += 1
        await _count(t, d, "reconciled", n)
        return n

    return int(await _run(b, go))


async def next_due(b: PostgresBackend, domains: list[str], now: float) -> float | None:
    """The earliest delayed signal or slice lease end of these domains."""
    s = b.s

    async def go(cur: Cursor) -> float | None:
        await cur.execute(
            f"SELECT least((SELECT min(g.due) FROM {s}.att_signals g WHERE NOT g.ready "
            "AND g.domain_id = d.id), (SELECT min(l.lease_until) FROM "
            f"{s}.att_slices l WHERE l.domain_id = d.id)) FROM {s}.att_domains d "
            "WHERE d.name = ANY(%s::text[])",
            (domains,),
        )
        found = [float(r[0]) for r in await cur.fetchall() if r[0] is not None]
        return min(found) if found else None

    result: float | None = await b.pool.run(go)
    return result
