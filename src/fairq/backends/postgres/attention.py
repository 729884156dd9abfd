"""PostgreSQL attention: domains and the slice cycle — publish, take (the scheduler),
receive, extend, end (the charge) and the sweep — each one transaction; a take and an end
one statement each (``att_take``, ``att_end``, migration 10), so the domain's row they lock
is never held across a round trip to this process.

Every decision is :mod:`fairq.backends.attention_policy`'s, the same as on every backend;
the take's (:func:`on_signal`, :func:`on_take`) and the end's (:func:`on_slice_end`,
:func:`slice_cost`, :func:`on_end`, :func:`next_estimate`) are mirrored in PL/pgSQL in
``migrations/0010_attention_one_call.sql``, as Redis mirrors them in Lua, and
tests/postgres/test_attention_plpgsql.py holds them to the memory backend's. The scheduler
(SPEC §5 rule 4) is start-time fair queueing over tenants in virtual time: ``att_pick``
finds the tenant with a ready signal and the smallest ``(vt, turn)`` — one probe of a
partial index, however many tenants and keys — and its oldest ready signal, its key and
work queue; a slice charges the tenant its estimate (``att_decided`` writes it and moves
the domain's clock); its end replaces the estimate with the real cost (``att_charge``).
Shared pieces are in :mod:`.attention_rows`; resources and stats in :mod:`.attention_keys`.
"""

from __future__ import annotations

import math
import secrets
from typing import TYPE_CHECKING, Any

import orjson

from ...errors import AttentionNotFound, InvalidOption, LeaseLost
from ...message import Received
from ...model.attention import AttentionConfig, Plan, Slice
from ...model.queues import Envelope, queue_config_from_options
from ..attention_policy import (
    check_change,
    next_permit,
    publish_signals,
    refill,
    resignal_allowed,
)
from . import queues
from .attention_rows import (
    Domain,
    Key,
    Txn,
    domain_row,
    key_row,
    load_key,
    note_backlog,
    plan_of,
    run,
    signal,
    view,
)
from .connection import Cursor

if TYPE_CHECKING:
    from . import PostgresBackend


async def begin(t: Txn, name: str) -> Domain:
    """The domain's row, locked, and swept (``att_begin``): delayed signals that came due
    join their tenant, expired slices free their token (``att_end_slice``, without their
    charge: a dead worker's slice keeps its estimate)."""
    await t.cur.execute(f"SELECT * FROM {t.s}.att_begin(%s, %s, %s)", (name, t.now, t.flush))
    row = await t.cur.fetchone()
    if row is None:
        raise AttentionNotFound(name)
    d = Domain(row[0], name, AttentionConfig.from_dict(row[1]))
    for token in row[2]:
        await t.cur.execute(
            f"SELECT woke, dues FROM {t.s}.att_end_slice(%s, %s, 0, NULL, %s, true)",
            (d.id, token, t.now),
        )
        ended = await t.cur.fetchone()
        assert ended is not None
        _ended(t, d.name, ended[0], ended[1])
    return d


def _ended(t: Txn, domain: str, woke: bool, dues: list[float]) -> None:
    """What ending a slice server-side wrote, for :func:`run` to act on after the commit."""
    if woke:
        t.notify.add(domain)
    if dues:
        t.scheduled.setdefault(domain, []).extend(dues)


# -- domains -------------------------------------------------------------------------------
async def declare_attention(b: PostgresBackend, name: str, config: AttentionConfig) -> None:
    data = orjson.dumps(config.to_dict()).decode()

    async def go(t: Txn) -> None:
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

    await run(b, go)


async def attention_config(b: PostgresBackend, name: str) -> AttentionConfig:
    async def go(t: Txn) -> AttentionConfig:
        return (await domain_row(t, name)).config

    result: AttentionConfig = await run(b, go)
    return result


async def list_attention(b: PostgresBackend, prefix: str) -> list[str]:
    from .topics import names

    return await b.pool.run(lambda cur: names(cur, b.s, "att_domains", prefix))


async def delete_attention(b: PostgresBackend, name: str) -> bool:
    async def go(t: Txn) -> bool:
        await t.cur.execute(f"SELECT id FROM {t.s}.att_domains WHERE name = %s FOR UPDATE", (name,))
        row = await t.cur.fetchone()
        if row is None:
            return False
        for table in ("att_keys", "att_tenants", "att_signals", "att_slices", "att_usage"):
            await t.cur.execute(f"DELETE FROM {t.s}.{table} WHERE domain_id = %s", (row[0],))
        await t.cur.execute(f"DELETE FROM {t.s}.att_domains WHERE id = %s", (row[0],))
        return True

    return bool(await run(b, go))


# -- the slice cycle -----------------------------------------------------------------------
async def publish(
    b: PostgresBackend,
    domain: str,
    key: str,
    envs: list[Envelope],
    connection: object | None = None,
) -> list[str]:
    from ...message import format_id

    async def go(t: Txn) -> list[str]:
        d = await domain_row(t, domain)
        k = await load_key(t, d, key)
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
        k = k or await key_row(t, d, key)
        v = await view(t, d, k)
        await note_backlog(t, d, k, bool(v.visible or v.waiting_due is not None))
        if k.pending == 0:
            if resignal_allowed(plan_of(d, k), k.active, 0) and publish_signals(k.state, k.parked):
                await signal(t, d, k, t.now if v.visible else (v.waiting_due or t.now))
        elif v.visible:
            await _pull_forward(t, d, k)
        await k.save(t, d)
        return ids

    result: list[str] = await run(b, go, connection)
    return result


async def _pull_forward(t: Txn, d: Domain, k: Key) -> None:
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
        await signal(t, d, k, t.now)


async def take(b: PostgresBackend, domain: str) -> Slice | None:
    """ONE statement (``att_take`` in 0010_attention_one_call.sql): the sweep, the
    scheduler's pick (``att_pick``: the tenant with a ready signal and the smallest
    ``(vt, turn)``, its oldest ready signal, its key and work queue), the decision
    (:func:`on_signal`, mirrored in PL/pgSQL) and its writes (``att_decided``), repeated
    until a signal yields a slice. The domain's row is locked for the server's time only.
    It commits without the WAL flush (see :func:`run`)."""
    now = b.now()
    token = secrets.token_hex(12)
    flush = b.options.durable_leases

    async def go(cur: Cursor) -> tuple[Any, ...] | None:
        await cur.execute(
            f"SELECT s_key, s_queue, s_plan, woke, dues FROM {b.s}.att_take(%s, %s, %s, %s)",
            (domain, now, flush, token),
        )
        return await cur.fetchone()

    row = await b.pool.run(go, wakes=lambda r: r is not None and bool(r[3]))
    if row is None:
        raise AttentionNotFound(domain)
    key, queue, plan, woke, dues = row
    if dues:
        b.att_scheduled.add(domain, list(dues), now)
    if woke:
        b.wakeups.notify([f"attention:{domain}"])
    if key is None:
        return None
    return Slice(domain, key, queue, token, Plan(**plan))


async def receive(
    b: PostgresBackend, domain: str, token: str, n: int, visibility_timeout: float | None
) -> tuple[list[Received], float | None]:
    """One statement (``att_receive``) for a plan without a rate; a key with a token bucket
    takes :func:`_receive_limited`, one transaction that keeps the bucket."""

    async def go(cur: Cursor) -> list[tuple[Any, ...]]:
        await cur.execute(
            f"SELECT * FROM {b.s}.att_receive(%s, %s, %s, %s, %s)",
            (token, domain, b.now(), n, visibility_timeout),
        )
        return await cur.fetchall()

    rows = await b.pool.run(go, wakes=False)
    status = rows[0][0]
    if status == "ok":
        queue = rows[0][9]
        got = sorted(rows[1:], key=lambda r: r[8])
        return [queues.received(r[1:], queue) for r in got], None
    if status == "lost":
        raise LeaseLost([token], "the slice's concurrency token expired")
    if status == "gone":
        raise AttentionNotFound(domain)
    if status == "noqueue":
        return [], None
    return await _receive_limited(b, domain, token, n, visibility_timeout)


async def _receive_limited(
    b: PostgresBackend, domain: str, token: str, n: int, visibility_timeout: float | None
) -> tuple[list[Received], float | None]:
    """The receive of a slice whose key has a rate: as many as its bucket allows."""

    async def go(t: Txn) -> tuple[list[Received], float | None]:
        await t.cur.execute(
            f"SELECT key FROM {t.s}.att_slices WHERE token = %s AND lease_until > %s",
            (token, t.now),
        )
        row = await t.cur.fetchone()
        d = await domain_row(t, domain)  # AttentionNotFound if that is why
        if row is None:
            raise LeaseLost([token], "the slice's concurrency token expired")
        k = await load_key(t, d, row[0])  # locked: its token bucket changes
        assert k is not None
        plan = plan_of(d, k)
        tokens = refill(k.tokens, k.tokens_at, t.now, plan)
        allowed = n if tokens == math.inf else min(n, int(tokens))
        if allowed < 1:
            k.tokens, k.tokens_at = tokens, t.now
            await k.save(t, d)
            return [], next_permit(tokens, t.now, plan)
        await t.cur.execute(f"SELECT 1 FROM {t.s}.queues WHERE name = %s", (k.queue,))
        if await t.cur.fetchone() is None:
            return [], None
        # receive() commits without the WAL flush (a lease), unless ?durable_leases=on
        await t.cur.execute(b.q.receive, (k.queue, t.now, allowed, visibility_timeout))
        rows = sorted(await t.cur.fetchall(), key=lambda r: r[7])
        got = [queues.received(r, k.queue) for r in rows]
        if tokens != math.inf:
            k.tokens, k.tokens_at = tokens - len(got), t.now
            await k.save(t, d)
        return got, None

    result: tuple[list[Received], float | None] = await run(b, go, wakes=False)
    return result


async def extend(b: PostgresBackend, domain: str, token: str) -> bool:
    async def go(t: Txn) -> bool:
        if not t.flush:
            await t.cur.execute("SET LOCAL synchronous_commit = off")
        d = await domain_row(t, domain)
        await t.cur.execute(
            f"UPDATE {t.s}.att_slices SET lease_until = %s WHERE token = %s AND domain_id = %s "
            "AND lease_until > %s",
            (t.now + d.config.slice_lease, token, d.id, t.now),
        )
        return t.cur.rowcount == 1

    return bool(await run(b, go, flush=False))


async def _count(t: Txn, domain: str, token: str, key: str, n: int) -> None:
    """``n`` acked messages of the slice ``token`` counted (``att_count``, migration 15): in
    the slice's row (``att_slices.counted``) while it runs — its end, or the sweep once its
    token expired, adds them to its key and the domain; :func:`.attention_keys.key_stats`
    adds running slices' to their key — and, when the slice has ended already, for the key
    and the domain now. The slice's row is its own: the acks of a key's other slices never
    wait on it, as they waited on the key's row while an ack's commit flushed the WAL."""
    if n <= 0:
        return
    await t.cur.execute(f"SELECT {t.s}.att_count(%s, %s, %s, %s)", (domain, token, key, n))


async def count(b: PostgresBackend, domain: str, token: str, key: str, n: int) -> None:
    async def go(t: Txn) -> None:
        await _count(t, domain, token, key, n)

    await run(b, go, wakes=False)


async def progress(
    b: PostgresBackend, domain: str, token: str, key: str, queue: str, receipts: list[str]
) -> list[str]:
    """A running slice's handled messages acked and the acked ones counted, in one
    transaction (with the ack's full WAL flush)."""
    ids, leases = queues.receipts_literals(receipts)
    now = b.now()

    async def go(cur: Cursor) -> tuple[list[str], bool]:
        await cur.execute(b.q.ack, (queue, now, ids, leases))
        row = await cur.fetchone()
        assert row is not None
        lost = queues.lost_of(row[0], receipts)
        await _count(Txn(cur, b, now), domain, token, key, len(set(receipts) - set(lost)))
        return lost, bool(row[1])

    # the NOTIFY round trip after it only when the ack noted a wake-up, as a plain ack's
    lost, woke = await b.pool.run(go, transaction=True, wakes=lambda r: r[1])
    if woke:
        b.wakeups.notify([queue])
    return lost


async def end(
    b: PostgresBackend, domain: str, token: str, processed: int, retry_at: float | None
) -> None:
    """ONE statement (``att_end`` in 0010_attention_one_call.sql): the domain's row is
    locked for the server's time only, not across round trips to this process. It commits
    without the WAL flush, as a take does (see :func:`run`)."""
    now = b.now()
    flush = b.options.durable_leases

    async def go(cur: Cursor) -> tuple[Any, ...] | None:
        await cur.execute(
            f"SELECT live, woke, dues FROM {b.s}.att_end(%s, %s, %s, %s, %s, %s)",
            (domain, token, processed, retry_at, now, flush),
        )
        return await cur.fetchone()

    row = await b.pool.run(go, wakes=lambda r: r is not None and bool(r[1]))
    if row is None:
        raise AttentionNotFound(domain)
    _, woke, dues = row
    if dues:
        b.att_scheduled.add(domain, list(dues), now)
    if woke:
        b.wakeups.notify([f"attention:{domain}"])
