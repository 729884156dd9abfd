"""What only the Redis backend has: its URLs (credentials masked everywhere), the server
clock option, ephemeral listeners across processes, and the Cluster's slot design (ids per
family, the outbox that carries moves between families, attention templates)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

import fairq
from fairq.backends.redis.conn import parse_url
from redis_servers import RedisServer, available, commandstats
from services import require


# -- URLs ----------------------------------------------------------------------------------
def test_url_options() -> None:
    o = parse_url("redis://app:s3cret@db.example:6380/3?prefix=shop:&timeout=2&clock=server")
    assert (o.host, o.port, o.db, o.username, o.password) == (
        "db.example",
        6380,
        3,
        "app",
        "s3cret",
    )
    assert (o.prefix, o.timeout, o.server_clock, o.cluster, o.ssl) == (
        "shop:",
        2.0,
        True,
        False,
        False,
    )
    assert "s3cret" not in o.url and "***" in o.url
    assert parse_url("rediss://h/0").ssl
    c = parse_url("redis+cluster://h:7000")
    assert c.cluster and c.port == 7000 and c.prefix == "fairq:"
    several = parse_url("redis+cluster://u:pw@h1:7000,h2,[::1]:7002?prefix=p:")
    assert several.seeds == [("h1", 7000), ("h2", 6379), ("::1", 7002)]
    assert (several.host, several.port, several.password) == ("h1", 7000, "pw")


@pytest.mark.parametrize(
    "bad, error",
    [
        ("redis://h/0?colour=blue", fairq.InvalidOption),
        ("redis://h/0?prefix=a{b}:", fairq.InvalidOption),
        ("redis://h/0?clock=sundial", fairq.InvalidOption),
        ("redis://h/0?timeout=-1", fairq.InvalidOption),
        ("redis://h/0?max_connections=0", fairq.InvalidOption),
        ("redis://h/0?max_connections=2.5", fairq.InvalidOption),
        ("redis://h/0?prefix=", fairq.InvalidOption),
        ("redis://h/0?prefix=a:&prefix=b:", fairq.InvalidOption),
        ("redis://h/zero", fairq.ConnectionError),
        ("redis+cluster://h:7000/2", fairq.ConnectionError),
        ("redis://h1:6379,h2:6379/0", fairq.ConnectionError),  # several hosts: Cluster only
        ("redis+cluster://h1:7000,h2:port", fairq.ConnectionError),
        ("redis+cluster://h1:7000,", fairq.ConnectionError),  # a seed left out
    ],
)
def test_bad_urls(bad: str, error: type[Exception]) -> None:
    with pytest.raises(error):
        parse_url(bad)


async def test_unreachable_server_is_a_connection_error_with_the_password_masked() -> None:
    url = "redis://app:hunter2@127.0.0.1:1/0?connect_timeout=0.5"
    with pytest.raises(fairq.ConnectionError) as info:
        await fairq.connect(url)
    text = str(info.value)
    assert "hunter2" not in text and "***" in text and "127.0.0.1:1" in text
    assert info.value.__cause__ is not None


async def test_a_cluster_url_on_a_server_that_is_no_cluster_is_a_connection_error() -> None:
    require("redis")
    with pytest.raises(fairq.ConnectionError, match="Cluster mode is not enabled"):
        await fairq.connect("redis+cluster://127.0.0.1:6379")


@pytest.mark.skipif(not available(), reason="redis-server is not installed")
async def test_wrong_password_is_a_connection_error_with_the_password_masked(
    tmp_path: Path,
) -> None:
    server = RedisServer(tmp_path, None, "--requirepass", "right-one").start()
    try:
        with pytest.raises(fairq.ConnectionError) as info:
            await fairq.connect(f"redis://:wrong-one@127.0.0.1:{server.port}/0")
        assert "wrong-one" not in str(info.value) and "***" in str(info.value)
        async with await fairq.connect(f"redis://:right-one@127.0.0.1:{server.port}/0") as b:
            assert "right-one" not in b.url
            q = await b.declare_queue("q")
            await q.send(b"x")
            assert [m.body for m in await q.receive()] == [b"x"]
    finally:
        server.stop()


@pytest.mark.skipif(not available(), reason="redis-server is not installed")
async def test_a_redis_that_evicts_keys_is_warned_of(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A cache-configured Redis (allkeys-lru) deletes confirmed messages under memory
    pressure: connecting says so once; the default noeviction says nothing."""
    server = RedisServer(tmp_path, None, "--maxmemory", "50mb", "--maxmemory-policy", "allkeys-lru")
    server.start()
    try:
        with caplog.at_level("WARNING", logger="fairq"):
            async with await fairq.connect(server.url):
                pass
        (warning,) = [r for r in caplog.records if "evicts keys" in r.getMessage()]
        assert "allkeys-lru" in warning.getMessage() and "noeviction" in warning.getMessage()
        caplog.clear()
        import redis

        r = redis.Redis(port=server.port)
        r.config_set("maxmemory-policy", "noeviction")
        r.close()
        with caplog.at_level("WARNING", logger="fairq"):
            async with await fairq.connect(server.url):
                pass
        assert not [r for r in caplog.records if "evicts keys" in r.getMessage()]
    finally:
        server.stop()


# -- the server's clock --------------------------------------------------------------------
async def test_server_clock_ignores_the_client_clock(shared_url: str) -> None:
    clock = fairq.ManualClock(start=1_000_000_000.0)  # years behind the server
    async with await fairq.connect(shared_url + "&clock=server", clock=clock) as b:
        q = await b.declare_queue("timed", visibility_timeout=30)
        await q.send(b"now")
        await q.send(b"later", delay=30)
        (m,) = await q.receive(max_messages=10)
        assert m.body == b"now"
        # the ids carry the server's time, not the manual clock's
        assert abs(m.enqueued_at - __import__("time").time()) < 60
        clock.advance(3600)  # the manual clock moves nothing
        assert await q.receive() == []
        s = await q.stats()
        assert (s.delayed, s.in_flight) == (1, 1)


# -- ephemeral listeners across processes --------------------------------------------------
PUBLISHER = """
import asyncio, sys, fairq
async def main(url):
    async with await fairq.connect(url) as b:
        t = b.topic("news")
        for i in range(20):
            await t.publish(f"m{i}".encode(), {"n": str(i)}, routing_key="eu.sport")
            await asyncio.sleep(0.02)
asyncio.run(main(sys.argv[1]))
"""


def _run_publisher(url: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", PUBLISHER, url],
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)),
    )


async def test_listen_gets_what_another_process_publishes(shared_url: str) -> None:
    async with await fairq.connect(shared_url) as b:
        await b.declare_topic("news")
        async with b.topic("news").listen(routing="eu.*") as listener:
            await asyncio.sleep(0.3)  # subscribed, and its keep-alive key is set
            child = _run_publisher(shared_url)
            got = []
            while len(got) < 20:
                m = await listener.get(timeout=10)
                assert m is not None, f"only {len(got)} of 20 arrived"
                got.append(m)
            await asyncio.to_thread(child.wait)
        assert [m.body for m in got] == [f"m{i}".encode() for i in range(20)]
        assert got[3].attributes["n"] == "3"
        assert got[0].id < got[-1].id


async def test_a_broker_does_not_hear_its_own_publishes_twice(shared_url: str) -> None:
    async with await fairq.connect(shared_url) as a, await fairq.connect(shared_url) as b:
        t = await a.declare_topic("echo")
        mine, theirs = a.topic("echo").listen(), b.topic("echo").listen()
        await asyncio.sleep(0.3)
        await t.publish(b"once")
        assert (await mine.get(2)).body == b"once"  # type: ignore[union-attr]
        assert (await theirs.get(2)).body == b"once"  # type: ignore[union-attr]
        assert await mine.get(0.3) is None and await theirs.get(0.3) is None
        await mine.close()
        await theirs.close()


# -- Redis Cluster -------------------------------------------------------------------------
async def test_cluster_ids_are_unique_and_ordered_within_a_family(
    cluster_broker: fairq.Broker,
) -> None:
    a = await cluster_broker.declare_queue("orders")
    b = await cluster_broker.declare_queue("orders.audit")
    ids = []
    for i in range(50):
        ids.append(await (a if i % 2 else b).send(str(i)))
    assert len(set(ids)) == 50 and ids == sorted(ids)


async def test_cluster_outbox_finishes_a_move_left_half_done(
    cluster_broker: fairq.Broker,
) -> None:
    """A dead letter into another family is recorded in the source's outbox first; if the
    process dies before delivering it, the next operation on that family delivers it, and
    delivering twice stores it once."""
    backend = cluster_broker.backend
    q = await cluster_broker.declare_queue("src", dead_letter="graveyard", max_attempts=1)
    await q.send(b"poison")
    (m,) = await q.receive()
    real_drain = backend.drain_outbox  # type: ignore[attr-defined]

    async def crash(name: str) -> None:  # the process "dies" between the two phases
        return None

    backend.drain_outbox = crash  # type: ignore[attr-defined]
    await m.nack()
    assert await cluster_broker.queue("graveyard").peek() == []
    entries = await backend.command("LRANGE", backend.fkey("src", "out"), 0, -1)  # type: ignore[attr-defined]
    assert len(entries) == 1
    backend.drain_outbox = real_drain  # type: ignore[attr-defined]
    # a repeated delivery (two processes draining at once) stores nothing twice
    _, token, packed = entries[0].split(b"\t", 2)
    await backend.run("deliver", "graveyard", "graveyard", "1", token, packed)  # type: ignore[attr-defined]
    await q.stats()  # any operation on the family drains its outbox
    dead = await cluster_broker.queue("graveyard").peek()
    assert [d.body for d in dead] == [b"poison"]
    assert dead[0].attributes["fairq.reason"] == "max_attempts"
    assert await backend.command("LLEN", backend.fkey("src", "out")) == 0  # type: ignore[attr-defined]


async def test_a_name_starting_with_a_dot_works_on_one_redis_and_is_refused_on_cluster(
    shared_url: str, cluster_broker: fairq.Broker
) -> None:
    """A name's first word is its keys' hash tag; ``.hidden``'s is empty, and Cluster
    ignores an empty tag ``{}``: its keys would fall in different slots, and each
    operation failed half-way with "Script attempted to access a non local key". On
    Cluster such names are refused (``Unsupported``) before anything is written."""
    async with await fairq.connect(shared_url) as one:
        q = await one.declare_queue(".hidden")
        await q.send(b"x")
        assert (await q.stats()).visible == 1
    for call in (
        lambda: cluster_broker.declare_queue(".hidden"),
        lambda: cluster_broker.declare_queue("orders", dead_letter=".graveyard"),
        lambda: cluster_broker.queue("..").send(b"x"),
        lambda: cluster_broker.queue(".x.dlq").receive(),
        lambda: cluster_broker.declare_topic(".news"),
    ):
        with pytest.raises(fairq.Unsupported, match=r"cannot start with '\.'"):
            await call()
    assert await cluster_broker.list_queues() == []


async def test_cluster_refuses_a_domain_scattered_over_slots(cluster_broker: fairq.Broker) -> None:
    with pytest.raises(fairq.Unsupported):
        await cluster_broker.declare_attention("market", work_queue="{key}.work")
    a = await cluster_broker.declare_attention("market", work_queue="{domain}.{key}.work")
    await a.publish("store-1", b"x")
    assert (await a.stats()).signals_pending == 1


# -- costs that must not grow --------------------------------------------------------------


async def test_status_costs_the_same_at_100_and_20000_fans(private: RedisServer) -> None:
    """SPEC §8 rule 8: a status is a few commands on the room's row, never a walk over the
    fans ahead (Redis's own counters say how many commands ran)."""
    costs = []
    async with await fairq.connect(private.url) as b:
        for fans in (100, 20_000):
            room = await b.waiting_room(f"r{fans}", admit_rate=1000)
            tickets = await room.join_many([f"fan-{i}" for i in range(fans)])
            await room.admit(10)
            await room.status(tickets[0].ticket)  # the script loaded (an EVAL the first time)
            before = commandstats(private.port)
            for t in (tickets[-1], tickets[fans // 2], tickets[3]):  # waiting and admitted
                await room.status(t.ticket)
            after = commandstats(private.port)
            costs.append({k: after[k] - before.get(k, 0) for k in after})
    assert costs[0] == costs[1], costs


async def test_acked_messages_leave_nothing_behind(private: RedisServer) -> None:
    import redis

    r = redis.Redis(port=private.port)
    async with await fairq.connect(private.url) as b:
        q = await b.declare_queue("clean", dedup_window=0)
        t = await b.declare_topic("clean")
        await t.subscribe("a")
        await t.subscribe("b")
        await q.send(b"warm")
        (m,) = await q.receive()
        await m.ack()
        keys_before = set(r.keys("*"))
        await q.send_batch([fairq.Outgoing(b"x" * 200) for _ in range(500)])
        await t.publish_batch([fairq.Outgoing(b"y" * 200) for _ in range(100)])
        for name in ("clean", "clean.a", "clean.b"):
            while msgs := await b.queue(name).receive(max_messages=100):
                await b.queue(name).ack_batch([x.receipt for x in msgs])
        leftover = set(r.keys("*")) - keys_before
        # a few keys per queue or family (empty streams, the body-ref counter), none per message
        assert len(leftover) <= 6, leftover
        for k in r.keys("*"):
            kind = r.type(k)
            if kind == b"stream":
                assert r.xlen(k) == 0, k
            elif kind == b"zset" and (k.endswith((b":r", b":l", b":d"))):
                assert r.zcard(k) == 0, k
            elif kind == b"hash" and k.endswith((b":a", b":k", b":y", b":b", b":bc")):
                assert r.hlen(k) == 0, k
    r.close()


async def test_a_big_receive_leaves_its_lease_set_a_skiplist(shared_url: str) -> None:
    """A receive of many messages turns the lease set and the attempts and lease-token
    hashes out of listpack first (each lookup in a listpack walks it: O(n^2) a batch),
    and leaves no trace of how: the structures hold exactly the leased messages."""
    import redis

    prefix = shared_url.split("prefix=")[1]
    r = redis.Redis(port=6379)
    try:
        async with await fairq.connect(shared_url) as b:
            q = await b.declare_queue("wide")
            await q.send_batch([fairq.Outgoing(b"x") for _ in range(100)])
            got = await q.receive(max_messages=100)
            base = f"{prefix}{{wide}}:q:wide:"
            assert r.object("encoding", base + "l") == b"skiplist"
            assert r.object("encoding", base + "a") == b"hashtable"
            assert r.object("encoding", base + "k") == b"hashtable"
            assert r.zcard(base + "l") == r.hlen(base + "a") == r.hlen(base + "k") == 100
            assert max(len(m) for m in r.zrange(base + "l", 0, -1)) == 16
            await q.ack_batch([m.receipt for m in got])
            assert not r.exists(base + "l", base + "a", base + "k")
            small = await q.send_batch([fairq.Outgoing(b"y") for _ in range(3)])
            assert len(small) == 3
            await q.receive(max_messages=3)  # a small batch stays a listpack
            assert r.object("encoding", base + "l") == b"listpack"
    finally:
        r.close()


def test_each_script_carries_only_the_libraries_it_uses() -> None:
    """Lua runs a script's whole chunk per call: a room step must not pay for making the
    queue and attention helpers' closures, while a receive has them (and every script's
    helpers resolve: the conformance suite runs them all)."""
    from fairq.backends.redis.conn import Scripts

    s = Scripts({"DLQ_CONFIG": "{}"})
    room, receive, publish = s["room_status"].source, s["receive"].source, s["publish"].source
    assert "local function room_place" in room and "local function lease_messages" not in room
    assert "local function lease_messages" in receive and "local function room_place" not in receive
    assert "local function load_domain" not in receive
    assert all(f"local function {f}" in publish for f in ("lease_messages", "load_domain"))
    assert len(room) < len(publish) / 2


async def test_a_redis_url_at_another_services_port_says_so_in_one_line() -> None:
    """PostgreSQL's port (redis-py's health check recursed until RecursionError: a
    2,000-line traceback)."""
    from services import require

    require("postgres")
    with pytest.raises(fairq.ConnectionError, match="does not answer as Redis"):
        await fairq.connect("redis://127.0.0.1:5432/0")
