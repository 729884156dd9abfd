"""Over a real socket (uvicorn on a free loopback port): the SSE stream of a topic, and
``--workers``: push-subscription deliveries and the attention reconciler in the server."""

from __future__ import annotations

import asyncio

import httpx
import orjson
from httpsupport import uvicorn_serving
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

import fairq
from fairq.http.app import create_app
from fairq.http.client import Client
from fairq.http.stream import events


async def read_events(response: httpx.Response, n: int) -> list[tuple[str, str]]:
    """The first ``n`` (event, data) pairs of an SSE response."""
    got: list[tuple[str, str]] = []
    event = "message"
    async for line in response.aiter_lines():
        if line.startswith("event: "):
            event = line[7:]
        elif line.startswith("data: "):
            got.append((event, line[6:]))
            if len(got) == n:
                return got
    return got


async def test_stream_delivers_what_is_published_while_listening() -> None:
    broker = await fairq.connect("memory://")
    app = create_app(broker)
    async with uvicorn_serving(app) as url, httpx.AsyncClient(base_url=url) as http:
        await http.put("/v1/topics/orders")
        await http.post("/v1/topics/orders/messages", json={"messages": [{"body": "before"}]})
        params = {"routing": "order.*", "filter": '{"channel": ["sms"]}'}
        async with http.stream("GET", "/v1/topics/orders/stream", params=params) as r:
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            reader = asyncio.create_task(read_events(r, 2))
            await asyncio.sleep(0.2)  # the listener is registered before the first byte
            messages = [
                {"body": "no sms", "routing_key": "order.new", "attributes": {"channel": "x"}},
                {"body": {"n": 1}, "routing_key": "order.new", "attributes": {"channel": "sms"}},
                {"body": "wrong key", "routing_key": "other", "attributes": {"channel": "sms"}},
                {"body": "two", "routing_key": "order.paid", "attributes": {"channel": "sms"}},
            ]
            await http.post("/v1/topics/orders/messages", json={"messages": messages})
            got = await asyncio.wait_for(reader, 5)
        assert [e for e, _ in got] == ["message", "message"]
        assert [orjson.loads(d)["body"] for _, d in got] == ['{"n":1}', "two"]
        # the client's listen() is the same stream
        async with Client(url) as client:
            listener = client.topic("orders").listen(routing="order.#")
            first = asyncio.create_task(listener.__anext__())
            await asyncio.sleep(0.2)
            await client.topic("orders").publish({"hello": 1}, routing_key="order.x")
            msg = await asyncio.wait_for(first, 5)
            assert msg.json() == {"hello": 1}
            await listener.close()
    await broker.close()


async def test_a_slow_listener_loses_the_oldest_and_is_told_how_many() -> None:
    broker = await fairq.connect("memory://")
    topic = await broker.declare_topic("t")
    listener = topic.listen(buffer=2)
    stream = events(listener, keepalive=0.05)
    assert await anext(stream) == b": listening\n\n"
    for i in range(5):
        await topic.publish(str(i))
    chunks = [await anext(stream) for _ in range(3)]
    assert chunks[0] == b"event: dropped\ndata: 3\n\n"
    assert b"data: " in chunks[1] and b'"body":"3"' in chunks[1]
    assert b'"body":"4"' in chunks[2]
    assert await anext(stream) == b": keep-alive\n\n"
    await stream.aclose()
    assert listener._closed, "the listener is closed with its stream"
    await broker.close()


async def test_workers_deliver_push_subscriptions_and_reconcile() -> None:
    got: list[tuple[bytes, str]] = []
    arrived = asyncio.Event()

    async def hook(request: Request) -> Response:
        got.append((await request.body(), request.headers["fairq-topic"]))
        arrived.set()
        return Response(status_code=204)

    receiver = Starlette(routes=[Route("/hook", hook, methods=["POST"])])
    broker = await fairq.connect("memory://")
    async with uvicorn_serving(receiver) as hook_url:
        topic = await broker.declare_topic("orders")
        await topic.subscribe("webhook", push=f"{hook_url}/hook")
        # work that reached a key's queue without its signal: only a reconciler finds it
        market = await broker.declare_attention("market")
        await market.publish("k", b"1")
        signal = await market._take(0)
        assert signal is not None
        msgs, retry_at = await market._receive(signal, 10, None)
        await msgs[0].ack()
        await market._end(signal, 1, retry_at)
        await (await market.queue("k")).send(b"orphan")
        app = create_app(broker, workers=True, reconcile_interval=0.1)
        async with uvicorn_serving(app) as url, httpx.AsyncClient(base_url=url) as http:
            r = await http.post(
                "/v1/topics/orders/messages", json={"messages": [{"body": "pushed"}]}
            )
            assert r.status_code == 200
            await asyncio.wait_for(arrived.wait(), 10)
            assert got == [(b"pushed", "orders")]
            for _ in range(100):
                if (await market.stats()).reconciled:
                    break
                await asyncio.sleep(0.05)
            assert (await market.stats()).reconciled == 1
            stats = (await http.get("/v1/queues/orders.webhook")).json()["stats"]
            for _ in range(100):
                if stats["acked"]:
                    break
                await asyncio.sleep(0.05)
                stats = (await http.get("/v1/queues/orders.webhook")).json()["stats"]
            assert stats["acked"] == 1
    await broker.close()
