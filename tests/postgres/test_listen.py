"""``Topic.listen`` across processes on PostgreSQL (SPEC §4 rule 6): a publish in another
process reaches this one's listeners through NOTIFY — payloads past NOTIFY's 8,000-byte
limit through a side table — and a publish in a caller's transaction only at its commit."""

from __future__ import annotations

import asyncio
import os
import sys
import textwrap

import psycopg
import pytest

import fairq
from services import PG_SERVER, pg_database

_PUBLISHER = textwrap.dedent(
    """
    import asyncio, sys
    import fairq

    async def main(url):
        async with await fairq.connect(url) as b:
            t = b.topic("news")
            await t.publish(b"small", attributes={"kind": "a"}, routing_key="eu.sport")
            await t.publish(b"x" * 20_000, routing_key="eu.big")
            await t.publish(b"filtered out", attributes={"kind": "b"}, routing_key="eu.sport")

    asyncio.run(main(sys.argv[1]))
    """
)


async def test_listen_hears_another_process(url: str) -> None:
    async with await fairq.connect(url) as b:
        topic = await b.declare_topic("news")
        everything = topic.listen()
        sport = topic.listen(routing="eu.*", filter={"kind": ["a"]})
        await asyncio.sleep(0.3)  # the listeners' row is written; LISTEN is on
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            _PUBLISHER,
            url,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )
        assert await asyncio.wait_for(proc.wait(), 60) == 0
        got = [await everything.get(timeout=5) for _ in range(3)]
        assert [m.body[:5] if m else None for m in got] == [b"small", b"xxxxx", b"filte"]
        assert got[1] is not None and len(got[1].body) == 20_000  # past NOTIFY's limit
        assert got[0] is not None and got[0].attributes["kind"] == "a"
        first = await sport.get(timeout=5)
        assert first is not None and first.body == b"small"
        assert await sport.get(timeout=0.3) is None
        await everything.close()
        await sport.close()


async def test_listen_in_this_process_gets_each_message_once(url: str) -> None:
    async with await fairq.connect(url) as a, await fairq.connect(url) as b:
        topic = await a.declare_topic("news")
        listener = topic.listen()
        await asyncio.sleep(0.3)
        await b.topic("news").publish(b"from b")  # b's local hub and a's NOTIFY both see it
        await topic.publish(b"from a")
        got = [await listener.get(timeout=3) for _ in range(2)]
        assert sorted(m.body for m in got if m) == [b"from a", b"from b"]
        assert await listener.get(timeout=0.5) is None  # no second copy
        await listener.close()


async def test_a_publish_in_a_transaction_is_heard_at_its_commit(url: str) -> None:
    async with await fairq.connect(url) as b:
        topic = await b.declare_topic("news")
        listener = topic.listen()
        await asyncio.sleep(0.3)
        async with await psycopg.AsyncConnection.connect(f"{PG_SERVER}/{pg_database()}") as c:
            with pytest.raises(RuntimeError):
                async with c.transaction():
                    await topic.publish(b"rolled back", connection=c)
                    raise RuntimeError
            async with c.transaction():
                await topic.publish(b"committed", connection=c)
                assert await listener.get(timeout=0.3) is None
        got = await listener.get(timeout=3)
        assert got is not None and got.body == b"committed"
        assert await listener.get(timeout=0.3) is None
        await listener.close()
