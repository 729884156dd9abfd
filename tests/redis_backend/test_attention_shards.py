"""Attention domains of several shards on Redis: each shard its own slot (a Cluster spreads
a domain over its nodes), tenants' shares hold across the shards, a slice costs two
scripts, and a declare or delete cut short between shards is finished by the next."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import orjson
import pytest

import fairq
from fairq.model.attention import AttentionConfig, shard_of
from redis_servers import RedisServer, commandstats

PLANS = {"basic": fairq.Plan(1, 5, 60.0)}


async def _drain(a: fairq.Attention, limit: int = 10_000) -> list[tuple[str, bytes]]:
    """Take and serve slices like a worker until none is left (or ``limit`` slices)."""
    out = []
    for _ in range(limit):
        s = await a._take(0)
        if s is None:
            return out
        msgs, retry_at = await a._receive(s, s.plan.max_messages, None)
        out.extend((s.key, m.body) for m in msgs)
        await a._end(s, len(msgs), retry_at, msgs)
    assert limit < 10_000, "the domain never ran dry"
    return out


async def test_a_sharded_domain_spreads_over_the_cluster_nodes(cluster_url: str) -> None:
    import redis
    from redis.cluster import RedisCluster

    async with await fairq.connect(cluster_url) as broker:
        a = await broker.declare_attention("market", plans=PLANS, shards=8)
        keys = [f"store-{i}" for i in range(64)]
        for k in keys:
            await a.publish(k, k.encode())
        assert (await a.queue("store-1")).name == f"market-{shard_of('store-1', 8)}.store-1.work"
        got = await _drain(a)
        assert sorted(got) == sorted((k, k.encode()) for k in keys)
        st = await a.stats()
        assert (st.keys, st.processed, st.signals_pending, st.slices) == (64, 64, 0, 0)
        assert len(await a.key_stats(top=100)) == 64
        assert {t.tenant for t in await a.tenant_stats(top=100)} == set(keys)
        # where the keys are: every node holds some of the domain's state
        prefix = cluster_url.rsplit("prefix=", 1)[1]
        host, port = cluster_url.split("//")[1].split("?")[0].split(":")
        cluster = RedisCluster(host=host, port=int(port))
        try:
            nodes = [(n.host, n.port) for n in cluster.get_primaries()]
        finally:
            cluster.close()
        holding = 0
        for h, p in nodes:
            r = redis.Redis(host=h, port=p)
            try:
                found = list(r.scan_iter(match=f"{prefix}{{market-*}}:a:market#*", count=1000))
            finally:
                r.close()
            holding += bool(found)
        assert holding == len(nodes) == 3, "the 8 shards' slots are on every node"


async def test_a_cluster_domain_needs_the_shard_in_the_first_word(cluster_url: str) -> None:
    async with await fairq.connect(cluster_url) as broker:
        with pytest.raises(fairq.InvalidOption, match="first word"):
            await broker.declare_attention(
                "market", shards=4, work_queue="process.{domain}.{shard}.{key}.work"
            )
        with pytest.raises(fairq.Unsupported):
            await broker.declare_attention("market", shards=4, work_queue="{key}.{shard}.work")


@pytest.mark.parametrize("charge", ["messages", "time"])
async def test_tenants_share_fairly_across_shards(shared_url: str, charge: str) -> None:
    """Tenant A has one key (in one shard), tenant B 40 keys spread over all four: B must
    not get a share per shard. Each shard alone would give B four times A."""
    clock = fairq.ManualClock()
    async with await fairq.connect(shared_url, clock=clock) as broker:
        a = await broker.declare_attention("ab", plans=PLANS, shards=4, charge=charge)  # type: ignore[arg-type]
        await a.set_resource("a", tenant="A")
        await a.publish_batch("a", [fairq.Outgoing(b"a")] * 400)
        b_keys = [f"B-{i}" for i in range(40)]
        assert {shard_of(k, 4) for k in b_keys} == {0, 1, 2, 3}
        for k in b_keys:
            await a.set_resource(k, tenant="B")
            await a.publish_batch(k, [fairq.Outgoing(b"b")] * 20)
        served: Counter[str] = Counter()
        shards: set[int] = set()
        for _ in range(120):
            s = await a._take(0)
            assert s is not None
            msgs, retry_at = await a._receive(s, s.plan.max_messages, None)
            clock.advance(0.01 * len(msgs))  # 10 ms a message
            await a._end(s, len(msgs), retry_at, msgs)
            served["A" if s.key == "a" else "B"] += len(msgs)
            shards.add(shard_of(s.key, 4))
        assert shards == {0, 1, 2, 3}
        ratio = served["B"] / served["A"]
        assert 0.8 <= ratio <= 1.25, served


async def test_a_one_message_slice_costs_two_scripts(private: RedisServer) -> None:
    """The take leases the slice's first messages and the end carries its acks: a slice
    of one message is two scripts (after the first slice told the broker what a first
    receive asks for)."""
    async with await fairq.connect(f"{private.url}?prefix=p:") as broker:
        a = await broker.declare_attention("m", plans=PLANS, work_queue="{domain}.{key}.work")
        for k in ("first", "second"):
            await a.publish(k, k.encode())
        await _drain(a, limit=1)  # the first slice: a receive of its own
        before = commandstats(private.port)
        s = await a._take(0)
        assert s is not None and s.key == "second"
        msgs, _ = await a._receive(s, 32, None)
        assert [m.body for m in msgs] == [b"second"]
        assert await a._receive(s, 31, None) == ([], None), "the take saw nothing more"
        assert await a._end(s, 1, None, msgs) == []
        after = commandstats(private.port)
        scripts = sum(
            after.get(c, 0) - before.get(c, 0) for c in ("cmdstat_evalsha", "cmdstat_eval")
        )
        assert scripts == 2
        st = await (await a.queue("second")).stats()
        assert (st.visible, st.in_flight, st.acked) == (0, 0, 1)


async def test_an_ended_slice_gives_back_what_it_leased_but_never_handed_out(
    shared_url: str,
) -> None:
    async with await fairq.connect(shared_url) as broker:
        a = await broker.declare_attention("m", plans=PLANS)
        await a.publish("w", b"warm-up")
        await _drain(a)  # first receives ask for 5 from now on
        await a.publish_batch("k", [fairq.Outgoing(str(i)) for i in range(3)])
        s = await a._take(0)
        assert s is not None
        q = await a.queue("k")
        assert (await q.stats()).in_flight == 3, "the take leased them"
        await a._end(s, 0, None)  # the worker stopped before receiving
        st = await q.stats()
        assert (st.visible, st.in_flight) == (3, 0)
        got = await _drain(a)
        assert [b for _, b in got] == [b"0", b"1", b"2"]
        s2 = await a._take(0)
        assert s2 is None
        # given back, not counted as an attempt
        await a.publish("k", b"3")
        s3 = await a._take(0)
        assert s3 is not None
        (m,), _ = await a._receive(s3, 5, None)
        assert m.attempt == 1


async def test_a_declare_cut_short_between_shards_is_finished_by_the_next(
    shared_url: str,
) -> None:
    async with await fairq.connect(shared_url) as broker:
        backend: Any = broker.backend
        config = AttentionConfig(plans=PLANS, shards=4, work_queue="{domain}-{shard}.{key}.work")
        new = orjson.dumps(config.to_dict()).decode()
        for s in (0, 1):  # the declaring process dies after two shards
            await backend.run("declare_attention", f"m-{s}", f"m#{s}", new, "")
        with pytest.raises(fairq.AttentionNotFound):
            await broker.attention("m").config()
        assert await broker.list_attention() == []
        a = await broker.declare_attention("m", plans=PLANS, shards=4)
        for i in range(20):
            await a.publish(f"k{i}", b"x")
        assert len(await _drain(a)) == 20


async def test_a_delete_cut_short_between_shards_is_finished_by_the_next(
    shared_url: str,
) -> None:
    import redis

    async with await fairq.connect(shared_url) as broker:
        backend: Any = broker.backend
        a = await broker.declare_attention("m", plans=PLANS, shards=4)
        for i in range(20):
            await a.publish(f"k{i}", b"x")
        for s in (0, 1):  # the deleting process dies after two shards
            await backend.run("delete_attention", f"m-{s}", f"m#{s}", "1")
        assert await broker.list_attention() == ["m"], "the pointer goes last"
        assert await broker.delete_attention("m")
        assert await broker.list_attention() == []
        prefix = shared_url.rsplit("prefix=", 1)[1]
        r = redis.Redis(port=6379)
        try:
            left = [k for k in r.scan_iter(match=f"{prefix}*", count=1000) if b":a:m#" in k]
            atts = [r.hget(f"{prefix}{{m-{s}}}:att", "m") for s in range(4)]
        finally:
            r.close()
        assert left == [] and atts == [None] * 4


async def test_a_broker_that_dies_holding_charges_loses_no_message(shared_url: str) -> None:
    """What crosses shards through a broker (charges, the clock) is about fairness only: a
    broker closed mid-slice, with charges it never passed on, loses no work."""
    clock = fairq.ManualClock()
    first = await fairq.connect(shared_url, clock=clock)
    a = await first.declare_attention("m", plans=PLANS, shards=4, slice_lease=5.0)
    for i in range(12):
        await a.publish(f"k{i}", str(i).encode())
    s = await a._take(0)
    assert s is not None
    await a._receive(s, 5, None)
    await first.close()  # dies: its slice, its leases and its pending charges with it
    clock.advance(60)
    async with await fairq.connect(shared_url, clock=clock) as second:
        got = await _drain(second.attention("m"))
    assert sorted(b for _, b in got) == sorted(str(i).encode() for i in range(12))


async def test_a_worker_in_another_process_wakes_for_a_publish_to_any_shard(
    shared_url: str,
) -> None:
    async with (
        await fairq.connect(shared_url) as pub,
        await fairq.connect(shared_url) as sub,
    ):
        a = await pub.declare_attention("m", plans=PLANS, shards=4)
        seen: list[str] = []
        worker = fairq.Worker(sub, concurrency=4, handle_signals=False, poll_wait=30.0)
        done = asyncio.Event()

        @worker.attention("m")
        async def handle(msg: fairq.Received) -> None:
            seen.append(msg.key or "")
            if len(seen) == 8:
                done.set()

        task = asyncio.create_task(worker.run())
        try:
            await asyncio.sleep(0.3)  # the worker idles, waiting on wake-ups
            keys = [f"k{i}" for i in range(8)]
            assert len({shard_of(k, 4) for k in keys}) >= 3
            for k in keys:
                await a.publish(k, b"x")
            await asyncio.wait_for(done.wait(), 10)  # not the 30 s poll
        finally:
            worker.stop()
            await task
        assert sorted(seen) == sorted(keys)


async def test_the_reconciler_costs_the_same_at_100_and_2000_idle_keys(
    private: RedisServer,
) -> None:
    """It visits the keys with backlog and those work reached past the attention API,
    never the idle ones; and it still finds what a plain send left without a signal."""
    async with await fairq.connect(f"{private.url}?prefix=p:") as broker:
        costs = []
        for n in (100, 2000):
            a = await broker.declare_attention(
                f"d{n}", plans=PLANS, shards=2, work_queue="{domain}-{shard}.{key}.work"
            )
            for i in range(0, n, 100):
                await asyncio.gather(*(a.publish(f"k{j}", b"x") for j in range(i, i + 100)))
            assert len(await _drain(a)) == n
            before = commandstats(private.port)
            assert await a.reconcile() == 0
            after = commandstats(private.port)
            costs.append(sum(after.values()) - sum(before.values()))
        assert costs[1] <= costs[0] + 5, costs  # not one command per idle key
        q = await a.queue("k7")
        await q.send(b"past the API")
        await q.send(b"and again")
        assert await a._take(0) is None
        assert await a.reconcile() == 1
        got = await _drain(a)
        assert got == [("k7", b"past the API"), ("k7", b"and again")]
