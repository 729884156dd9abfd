"""A slice's acks count in the slice's own row (migration 15): the acks of a key's other
slices never wait on them. Before, each batch of acks also updated the key's row, and the
ack's transaction — committed with the full WAL flush — kept that row locked until the
flush was done: a key's concurrent slices took turns on it, so a tenant whose share ran as
many slices of one key handled fewer messages in the worker time it was charged (weight
2 got 1.6-1.7x the messages of weight 1 with 8 slices at once; Redis 2.0x)."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg

import fairq
from fairq.backends.postgres import attention as pg_attention
from fairq.backends.postgres import queues as pg_queues
from fairq.backends.postgres.attention_rows import Txn
from fairq.backends.postgres.connection import parse_url


async def test_acks_of_a_key_wait_on_no_other_slice(url: str) -> None:
    async with await fairq.connect(url) as broker:
        a = await broker.declare_attention("counts", plans={"basic": fairq.Plan(2, 1, 20.0)})
        await a.publish_batch("k", [fairq.Outgoing(str(i)) for i in range(4)])
        s1, s2 = await a._take(0), await a._take(0)  # two slices of k (fan-out)
        assert s1 is not None and s2 is not None and s1.key == s2.key == "k"
        m1, _ = await a._receive(s1, 1, None)
        m2, _ = await a._receive(s2, 1, None)
        backend: Any = broker.backend
        conninfo = parse_url(url).conninfo
        # slice 1's acks as attention.progress makes them (the ack, then the count), in a
        # transaction not committed yet, as one whose commit waits for the WAL flush
        async with (
            await psycopg.AsyncConnection.connect(conninfo) as other,
            other.transaction(),
            other.cursor() as cur,
        ):
            now = broker.clock.now()
            ids, leases = pg_queues.receipts_literals([m.receipt for m in m1])
            await cur.execute(backend.q.ack, (s1.queue, now, ids, leases))
            assert (await cur.fetchone())[0] == []  # type: ignore[index]
            await pg_attention._count(Txn(cur, backend, now), "counts", s1.token, "k", 1)  # type: ignore[arg-type]
            # slice 2 acks meanwhile: it must not wait for slice 1's commit
            lost = await asyncio.wait_for(a._progress(s2, m2), timeout=5)
            assert lost == []
        (key,) = await a.key_stats()
        assert key.processed == 2, "running slices' counted acks show in the key's count"
        assert (await a.stats()).processed == 0, "the domain counts them at the slices' ends"
        await a._end(s1, 1, None)
        await a._end(s2, 1, None)
        st = await a.stats()
        (key,) = await a.key_stats()
        assert (st.processed, key.processed, st.slices) == (2, 2, 0)


async def test_slices_running_across_the_upgrade_to_migration_15_count_once(url: str) -> None:
    """Under migration 12 a running slice's acks were counted in its key's row as well as
    its own; migration 15 takes them out of the key's row, since the slice's end (and
    key_stats meanwhile) now adds them. Here: a slice acks 2 under the old rules (the key's
    row holds them), then the migration runs again over that state."""
    from fairq.backends.postgres import migrate

    async with await fairq.connect(url) as broker:
        a = await broker.declare_attention("upgrade", plans={"basic": fairq.Plan(1, 5, 20.0)})
        await a.publish_batch("k", [fairq.Outgoing(str(i)) for i in range(3)])
        s = await a._take(0)
        assert s is not None
        msgs, _ = await a._receive(s, 3, None)
        assert await a._progress(s, msgs[:2]) == []
        backend: Any = broker.backend
        schema = parse_url(url).schema
        async with await psycopg.AsyncConnection.connect(
            parse_url(url).conninfo, autocommit=True
        ) as c:
            # what migration 12's progress would have left: the key's row counts them too
            await c.execute(
                f'UPDATE "{schema}".att_keys SET processed = processed + 2 WHERE key = %s',
                ("k",),
            )
            await c.execute(f'DELETE FROM "{schema}".migrations WHERE version = 15')
            done = await migrate.apply(c, schema, backend.options.channel)
            assert [m.version for m in done] == [15]
        (key,) = await a.key_stats()
        assert key.processed == 2
        assert await a._progress(s, msgs[2:]) == []
        await a._end(s, 3, None)
        (key,) = await a.key_stats()
        assert (key.processed, (await a.stats()).processed) == (3, 3)
