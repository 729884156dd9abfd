"""``fairq.http.Client``: the in-process API's method names over HTTP."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from httpsupport import ADMIN, KEYS, SENDER, Server, serving

import fairq
from fairq.http import Client
from fairq.http.auth import KeyRing
from fairq.http.errors import RemoteError


@pytest.fixture
async def client(server: Server) -> AsyncIterator[Client]:
    async with Client("http://fairq", transport=httpx.ASGITransport(app=server.app)) as c:
        yield c


async def test_queues_through_the_client(client: Client) -> None:
    q = await client.declare_queue("jobs", max_attempts=2, visibility_timeout=30)
    assert q.name == "jobs" and (await q.config()).max_attempts == 2
    first = await q.send({"order": "o-1"}, attributes={"channel": "sms"})
    ids = await q.send_batch([fairq.Outgoing(b"\x00\xff raw"), fairq.Outgoing("text", delay=0)])
    assert len(ids) == 2 and first < ids[0]
    msgs = await q.receive(max_messages=10, wait=1)
    assert isinstance(msgs[0], fairq.Received)
    assert msgs[0].json() == {"order": "o-1"} and msgs[0].attributes["channel"] == "sms"
    assert msgs[1].body == b"\x00\xff raw" and msgs[2].text() == "text"
    await msgs[0].ack()
    with pytest.raises(fairq.LeaseLost):
        await msgs[0].ack()
    await msgs[1].extend(60)
    await msgs[1].nack()
    await msgs[2].dead_letter("no good")
    stats = await q.stats()
    assert isinstance(stats, fairq.QueueStats)
    assert (stats.acked, stats.visible, stats.dead_lettered) == (1, 1, 1)
    assert await client.list_queues() == ["jobs", "jobs.dlq"]
    assert (await client.queue_stats("jobs."))["jobs.dlq"].visible == 1
    peeked = await client.queue("jobs.dlq").peek()
    assert peeked[0].attributes["fairq.reason"] == "rejected"
    assert await client.redrive("jobs.dlq") == 1
    assert await q.purge() == 2
    assert await client.delete_queue("jobs") is True
    assert await client.delete_queue("jobs") is False
    with pytest.raises(fairq.QueueNotFound, match="does not exist"):
        await client.queue("jobs").send(1)
    with pytest.raises(fairq.InvalidName):
        await client.queue("bad name").stats()


async def test_a_last_nack_through_the_client_keeps_its_error(client: Client) -> None:
    q = await client.declare_queue("once", max_attempts=1)
    await q.send(b"x")
    (m,) = await q.receive()
    await m.nack(error="KeyError: 'total'")
    (dead,) = await client.queue("once.dlq").peek()
    assert (dead.attributes["fairq.reason"], dead.attributes["fairq.detail"]) == (
        "max_attempts",
        "KeyError: 'total'",
    )


async def test_topics_and_attention_through_the_client(client: Client) -> None:
    t = await client.declare_topic("orders")
    sub = await t.subscribe("sms", filter={"channel": ["sms"]}, routing="order.#", max_attempts=3)
    assert sub.name == "orders.sms"
    r = await t.publish("hi", attributes={"channel": "sms"}, routing_key="order.new")
    assert r.subscriptions == ["sms"]
    results = await t.publish_batch([fairq.Outgoing(1, routing_key="x")])
    assert results[0].subscriptions == []
    assert (await t.stats()).published == 2
    subs = await t.subscriptions()
    assert [s.name for s in subs] == ["sms"]
    assert isinstance(subs[0], fairq.Subscription) and subs[0].queue == t.name + ".sms"
    with pytest.raises(fairq.InvalidMessage):  # as in-process: queues take priorities
        await t.publish_batch([fairq.Outgoing("x", priority=3)])
    assert await client.list_topics() == ["orders"]
    assert await t.unsubscribe("sms") is True and await t.unsubscribe("sms") is False
    with pytest.raises(fairq.InvalidFilter):
        await t.subscribe("bad", filter={"a": [{"nope": 1}]})
    assert await client.delete_topic("orders") and not await client.delete_topic("orders")

    market = await client.declare_attention(
        "market", plans={"basic": fairq.Plan(1, 10, 5.0), "pro": fairq.Plan(3, 50, 5.0)}
    )
    await market.publish("store-1", {"sync": "stock"})
    await market.publish_batch("store-2", [fairq.Outgoing(1), fairq.Outgoing(2)])
    await market.set_resource("store-1", plan="pro", tenant="group-a")
    stats = await market.stats()
    assert isinstance(stats, fairq.AttentionStats) and stats.keys == 2
    keys = await market.key_stats(top=5)
    assert [(k.key, k.backlog) for k in keys] == [("store-2", 2), ("store-1", 1)]
    assert keys[1].plan == "pro" and keys[1].tenant == "group-a"
    await market.remove("store-2", purge=True)
    assert await client.list_attention() == ["market"]
    assert await client.delete_attention("market") is True
    with pytest.raises(fairq.AttentionNotFound):
        await client.attention("market").stats()
    assert (await client.health())["status"] == "ok"
    assert "queues" in await client.overview()


async def test_the_client_sends_its_key() -> None:
    async with serving(keys=KeyRing.parse(KEYS)) as s:
        transport = httpx.ASGITransport(app=s.app)
        async with Client("http://fairq", api_key=SENDER, transport=transport) as sender:
            with pytest.raises(RemoteError) as info:
                await sender.declare_queue("jobs")
            assert info.value.status == 403 and info.value.code == "forbidden"
        async with Client("http://fairq", api_key=ADMIN, transport=transport) as admin:
            await admin.declare_queue("jobs")
        async with Client("http://fairq", api_key=SENDER, transport=transport) as sender:
            assert await sender.queue("jobs").send("x")
        async with Client("http://fairq", transport=transport) as nobody:
            with pytest.raises(RemoteError) as info:
                await nobody.list_queues()
            assert info.value.status == 401


def test_importing_fairq_http_stays_light() -> None:
    import subprocess
    import sys

    code = (
        "import sys, fairq.http; from fairq.http import IdempotencyMiddleware; "
        "print(sorted(m for m in ('starlette', 'httpx', 'msgspec', 'uvicorn', 'prometheus_client')"
        " if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


async def test_waiting_rooms_through_the_client(client: Client) -> None:
    room = await client.waiting_room("ev-88", admit_rate=0, token_ttl=120)
    assert room.name == "ev-88" and await client.list_rooms() == ["ev-88"]
    with pytest.raises(fairq.RoomNotFound):
        await client.room("nope")
    assert (await client.room("ev-88")).name == "ev-88"
    first = await room.join("fan-1")
    assert isinstance(first, fairq.Ticket) and (first.state, first.position) == ("waiting", 0)
    assert (await room.join("fan-1")).ticket == first.ticket
    second = await room.join("fan-2")
    assert await room.admit(1) == 1
    st = await room.status(first.ticket or "")
    assert isinstance(st, fairq.Status) and st.state == "admitted" and st.token
    assert (await room.status(second.ticket or "")).position == 0
    with pytest.raises(fairq.InvalidTicket):
        await room.status("1.AAAAAAAAAAAAAAAA.fan-1")
    assert (await room.verify(st.token))["fan"] == "fan-1"
    assert (await room.consume(st.token))["jti"]
    with pytest.raises(fairq.InvalidToken):
        await room.consume(st.token)
    (jwk,) = (await room.jwks())["keys"]
    assert jwk["kty"] == "OKP" and jwk["crv"] == "Ed25519"
    await room.set_rate(42)
    stats = await room.stats()
    assert isinstance(stats, fairq.RoomStats) and stats.admit_rate == 42.0
    assert (stats.joined, stats.admitted, stats.used, stats.token_ttl) == (2, 1, 1, 120.0)
    assert await room.sold_out() == 1 and await room.phase() == "sold_out"
    assert (await room.join("late")).state == "sold_out"
    await room.close()
    assert await room.phase() == "closed"
    assert await client.delete_room("ev-88") is True
    assert await client.delete_room("ev-88") is False


async def test_idempotency_and_versions_through_the_client(client: Client) -> None:
    store = client.idempotency("pdf-worker", ttl=3600)
    claim = await store.claim("o-1", lease=30)
    assert claim is not None and claim.token and not claim.settled
    assert await store.claim("o-1") is None
    held = await store.try_claim("o-1")
    assert isinstance(held, fairq.IdempotencyRecord) and held.running
    await claim.extend(60)
    await claim.complete({"pdf": "o-1.pdf"})
    assert claim.settled
    with pytest.raises(fairq.ClaimLost):
        await claim.complete()
    record = await store.get("o-1")
    assert record is not None and record.completed and record.result == {"pdf": "o-1.pdf"}
    assert record.expires_at > client.clock.now() + 3500  # the store's ttl
    async with store.once("o-1") as first:
        assert first is False
    assert await store.forget("o-1") is True and await store.forget("o-1") is False
    async with store.once("o-1") as first:
        assert first is True
    assert (await store.get("o-1")).completed  # type: ignore[union-attr]

    raw = await store.claim("bytes")
    assert raw is not None
    await raw.complete(b"\x00\xff")
    assert (await store.get("bytes")).result == b"\x00\xff"  # type: ignore[union-attr]

    # a claim whose key was taken by another claimer is lost
    stale = await store.claim("o-2")
    assert stale is not None and await store.forget("o-2")
    other = await store.claim("o-2")
    assert other is not None
    with pytest.raises(fairq.ClaimLost):
        await stale.complete()
    assert await other.release() is True and await other.release() is False
    assert await store.get("missing") is None
    with pytest.raises(fairq.InvalidName):
        await store.claim("bad key")

    gate = client.versions("user-birthdate")
    assert await gate.current("u-1") is None
    assert await gate.advance("u-1", 5) is True
    assert await gate.advance("u-1", 4) is False
    assert await gate.current("u-1") == 5
    when = datetime(2026, 3, 1, 10, tzinfo=UTC)
    assert await gate.advance("u-2", when) is True
    assert await gate.advance("u-2", when - timedelta(seconds=1)) is False
    assert await gate.current("u-2") == when.timestamp()
    with pytest.raises(fairq.InvalidOption):
        await gate.advance("u-2", datetime(2026, 3, 1, 10))  # naive: no time zone


async def test_a_remote_send_to_a_full_blocking_queue_waits_as_in_process(
    client: Client,
) -> None:
    """timeout=None waits for room however long it takes, and a timeout above the server's
    20 s per request is several requests; a reject queue still refuses at once."""
    import asyncio

    q = await client.declare_queue("narrow", max_length=1, overflow="block")
    await q.send(b"first")
    blocked = asyncio.create_task(q.send(b"second"))  # timeout=None
    await asyncio.sleep(0.5)
    assert not blocked.done(), "a send with timeout=None gave up on a full blocking queue"
    (m,) = await q.receive()
    await m.ack()
    await asyncio.wait_for(blocked, 10)
    later = asyncio.create_task(q.send(b"third", timeout=30))  # above the server's 20 s
    await asyncio.sleep(0.3)
    (m,) = await q.receive()
    await m.ack()
    await asyncio.wait_for(later, 10)
    strict = await client.declare_queue("strict-full", max_length=1, overflow="reject")
    await strict.send(b"x")
    started = asyncio.get_running_loop().time()
    with pytest.raises(fairq.QueueFull):
        await strict.send(b"y")
    assert asyncio.get_running_loop().time() - started < 5


async def test_remote_exceptions_carry_their_attributes(client: Client) -> None:
    """As in-process: the queue named, a full queue's max_length and overflow, the lost
    receipts, a lost claim's key."""
    with pytest.raises(fairq.QueueNotFound) as missing:
        await client.queue("nowhere").stats()
    assert missing.value.name == "nowhere"
    q = await client.declare_queue("tight", max_length=1, overflow="reject")
    await q.send(b"x")
    with pytest.raises(fairq.QueueFull) as full:
        await q.send(b"y")
    assert (full.value.name, full.value.max_length, full.value.overflow) == (
        "tight",
        1,
        "reject",
    )
    (m,) = await q.receive()
    await m.ack()
    with pytest.raises(fairq.LeaseLost) as lost:
        await m.nack()
    assert lost.value.lost == [m.receipt]
    store = client.idempotency("attrs", ttl=60)
    claim = await store.claim("k", lease=60)
    assert claim is not None
    await claim.complete()
    stale = type(claim)(store, "k", "not-the-token", 60)
    with pytest.raises(fairq.ClaimLost) as claimed:
        await stale.complete()
    assert claimed.value.key == "k"


def test_a_server_that_stops_or_is_busy_is_a_connection_error() -> None:
    """503 shutting_down and server_busy: nothing was done, retry, as for an engine that
    is away (fairq.ConnectionError), and still a RemoteError with its status and code."""
    from fairq.http.errors import RemoteError, exception_from

    for code in ("shutting_down", "server_busy"):
        exc = exception_from(503, code, "retry")
        assert isinstance(exc, fairq.ConnectionError) and isinstance(exc, RemoteError)
        assert (exc.status, exc.code) == (503, code)


async def test_values_the_server_refuses_raise_invalid_option(client: Client) -> None:
    """As in-process, where each of these is an InvalidOption (a ValueError): refused by the
    client's own checks, or by the server (then with its status)."""
    q = await client.declare_queue("strict")
    calls = (
        q.receive(max_messages=0),
        q.receive(wait=-1),
        q.peek(0),
        client.declare_queue("bad-vt", visibility_timeout=-1),
    )
    for call in calls:
        with pytest.raises(fairq.InvalidOption) as caught:
            await call
        assert isinstance(caught.value, ValueError)
        assert getattr(caught.value, "status", 422) in (400, 422)


async def test_a_remote_once_keeps_its_claim_while_the_block_runs(client: Client) -> None:
    """As in-process: a block longer than the lease keeps the key (the claim is extended),
    so a second claimer does not run the work beside it."""
    import asyncio

    store = client.idempotency("slow-work", ttl=3600)
    intruders: list[bool] = []

    async def intruder() -> None:
        await asyncio.sleep(1.0)
        intruders.append(await store.claim("k", lease=0.6) is not None)

    other = asyncio.create_task(intruder())
    async with store.once("k", lease=0.6) as first:
        assert first
        await asyncio.sleep(1.5)  # 2.5 leases
    await other
    assert intruders == [False], "the key was taken while its work ran"
    record = await store.get("k")
    assert record is not None and record.completed
    claim = await store.claim("j", lease=0.6)
    assert claim is not None
    async with claim.kept_alive():
        await asyncio.sleep(1.0)
    assert await store.claim("j") is None
    await claim.complete()


async def test_sends_and_publishes_with_an_idempotency_key(client: Client, server: Server) -> None:
    q = await client.declare_queue("jobs")
    one = await q.send("pdf", idempotency_key="send-1")
    assert await q.send("pdf", idempotency_key="send-1") == one
    assert await q.send("pdf") != one
    with pytest.raises(RemoteError) as info:
        await q.send("another", idempotency_key="send-1")
    assert (info.value.status, info.value.code) == (422, "idempotency_key_reused")
    assert (await server.broker.queue("jobs").stats()).sent == 2
    t = await client.declare_topic("orders")
    await t.subscribe("all")
    r = await t.publish({"order": 1}, idempotency_key="pub-1")
    assert await t.publish({"order": 1}, idempotency_key="pub-1") == r
    assert (await server.broker.queue("orders.all").stats()).visible == 1


async def test_stats_through_a_server_ask_once_per_queue_or_once_for_all(server: Server) -> None:
    from fairq.cli.queues import stats_table

    asked: list[str] = []

    class Counting(httpx.ASGITransport):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            asked.append(request.url.path)
            return await super().handle_async_request(request)

    for name in ("a", "b", "c"):
        await server.broker.declare_queue(name, dead_letter="graves" if name == "a" else None)
    await server.broker.queue("graves").send(b"x")
    async with Client("http://fairq", transport=Counting(app=server.app)) as c:
        table = await stats_table(c, width=200)
        assert asked == ["/v1/queues"], "stats and options of every queue in one page"
        assert table.row_count == 4  # a, b, c and graves
        asked.clear()
        await stats_table(c, ["a", "b"], width=200)
        assert asked == ["/v1/queues/a", "/v1/queues/b", "/v1/queues/graves"]


async def test_queues_named_dot_and_dot_dot_work_through_the_client(client: Client) -> None:
    """``.`` and ``..`` are valid names (SPEC §2); HTTP clients resolve such path segments
    away, so the client percent-encodes them and reaches the queue, not another route."""
    for name in (".", ".."):
        q = await client.declare_queue(name)
        await q.send(name.encode())
        assert (await q.stats()).visible == 1
        assert [m.body for m in await client.queue(name).peek()] == [name.encode()]
        (m,) = await q.receive()
        await m.ack()
        assert (await q.stats()).acked == 1
    assert {".", ".."} <= set(await client.list_queues())
