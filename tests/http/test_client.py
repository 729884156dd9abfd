"""``fairq.http.Client``: the in-process API's method names over HTTP."""

from __future__ import annotations

from collections.abc import AsyncIterator

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


async def test_topics_and_attention_through_the_client(client: Client) -> None:
    t = await client.declare_topic("orders")
    sub = await t.subscribe("sms", filter={"channel": ["sms"]}, routing="order.#", max_attempts=3)
    assert sub.name == "orders.sms"
    r = await t.publish("hi", attributes={"channel": "sms"}, routing_key="order.new")
    assert r.subscriptions == ["sms"]
    results = await t.publish_batch([fairq.Outgoing(1, routing_key="x")])
    assert results[0].subscriptions == []
    assert (await t.stats()).published == 2
    assert [s["name"] for s in await t.subscriptions()] == ["sms"]
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
