"""SPEC §4 rule 5: push subscriptions, delivered by the worker runtime to a real local
HTTP endpoint (uvicorn + Starlette) that fails on purpose some of the time."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import AsyncIterator

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

import fairq


class Endpoint:
    """Answers 500 to the first attempt of every third order, hangs past the client's
    timeout on the first attempt of every fifth, and always fails 'poison' orders."""

    def __init__(self) -> None:
        self.calls: list[dict[str, str]] = []
        self.ok: Counter[str] = Counter()

    async def __call__(self, request: Request) -> Response:
        body = json.loads(await request.body())
        headers = {k.lower(): v for k, v in request.headers.items()}
        self.calls.append(headers)
        attempt = int(headers["fairq-attempt"])
        n = body["n"]
        if body.get("poison"):
            return Response("no", status_code=422)
        if attempt == 1 and n % 3 == 0:
            return Response("try later", status_code=500)
        if attempt == 1 and n % 5 == 0:
            await asyncio.sleep(2)  # the client gives up first
        self.ok[headers["fairq-message-id"]] += 1
        return Response(status_code=204)


@pytest.fixture
async def endpoint() -> AsyncIterator[tuple[str, Endpoint]]:
    handler = Endpoint()
    app = Starlette(routes=[Route("/hook", handler.__call__, methods=["POST"])])
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="error"))
    task = asyncio.create_task(server.serve())
    while not server.started:  # noqa: ASYNC110 - uvicorn offers no event to wait on
        await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}/hook", handler
    server.should_exit = True
    await task


async def test_push_delivers_every_message_or_dead_letters_it(
    live_broker: fairq.Broker, endpoint: tuple[str, Endpoint]
) -> None:
    url, handler = endpoint
    t = await live_broker.declare_topic("orders")
    q = await t.subscribe("webhook", push=url, max_attempts=3, visibility_timeout=5)
    pull = await t.subscribe("pull")  # a pull subscription beside it is left alone
    await t.publish_batch(
        [
            fairq.Outgoing({"n": i}, attributes={"channel": "sms"}, routing_key="order.new")
            for i in range(30)
        ]
        + [fairq.Outgoing({"n": 99, "poison": True})]
    )
    worker = fairq.Worker(live_broker, handle_signals=False, poll_wait=0.2)
    worker.push(timeout=0.5, retry=fairq.Backoff(base=0.05, cap=0.2))
    run = asyncio.create_task(worker.run())
    try:
        for _ in range(300):
            s = await q.stats()
            if s.acked + s.dead_lettered == 31 and s.in_flight == 0:
                break
            await asyncio.sleep(0.05)
    finally:
        worker.stop()
        await asyncio.wait_for(run, 10)
    s = await q.stats()
    assert (s.acked, s.dead_lettered, s.visible, s.in_flight) == (30, 1, 0, 0), s
    assert len(handler.ok) == 30, "every good message reached the endpoint"
    (dead,) = await live_broker.queue("orders.webhook.dlq").receive()
    assert dead.json() == {"n": 99, "poison": True}
    assert dead.attributes["fairq.reason"] == "max_attempts"
    retried = Counter(c["fairq-message-id"] for c in handler.calls)
    assert max(retried.values()) >= 2, "failures were retried"
    first = next(c for c in handler.calls if "fairq-attr-channel" in c)
    assert first["content-type"] == "application/json"
    assert first["fairq-topic"] == "orders" and first["fairq-subscription"] == "webhook"
    assert first["fairq-routing-key"] == "order.new"
    assert json.loads(first["fairq-attributes"]) == {
        "channel": "sms",
        "content-type": "application/json",
        "fairq.routing_key": "order.new",
    }
    assert first["fairq-attr-channel"] == "sms"
    assert (await pull.stats()).visible == 31


async def test_push_subscription_needs_a_url(broker: fairq.Broker) -> None:
    t = await broker.declare_topic("t")
    for bad in (
        "ftp://example",
        "https://",
        "http://a b/",
        "http://h/x\r\nX-Injected: 1",
        "http://h:99999/",
    ):
        with pytest.raises(fairq.InvalidOption, match="push must be"):
            await t.subscribe("s", push=bad)
    assert await t.subscriptions() == []


class Hooks:
    """Three endpoints that record the message numbers they were sent."""

    def __init__(self) -> None:
        self.got: dict[str, list[int]] = {"a": [], "b": [], "c": []}

    async def __call__(self, request: Request) -> Response:
        self.got[request.path_params["name"]].append(json.loads(await request.body())["n"])
        return Response(status_code=204)


async def _until(check: object, what: str, limit: float = 10.0) -> None:
    assert callable(check)
    for _ in range(int(limit / 0.05)):
        if check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(what)


async def test_removed_and_changed_push_subscriptions_leave_the_worker_running(
    live_broker: fairq.Broker,
) -> None:
    """Removing a push subscription stops its deliveries, not the worker (its other push
    subscriptions and queues go on); a changed URL is followed and a subscription that no
    longer pushes is left to its pullers, both within a rescan."""
    hooks = Hooks()
    app = Starlette(routes=[Route("/{name}", hooks.__call__, methods=["POST"])])
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="error"))
    serving = asyncio.create_task(server.serve())
    while not server.started:  # noqa: ASYNC110 - uvicorn offers no event to wait on
        await asyncio.sleep(0.01)
    base = f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    t = await live_broker.declare_topic("hooks")
    await t.subscribe("one", push=f"{base}/a")
    two = await t.subscribe("two", push=f"{base}/b")
    jobs = await live_broker.declare_queue("push-jobs")
    handled: list[str] = []
    worker = fairq.Worker(live_broker, handle_signals=False, poll_wait=0.2)
    worker.push(rescan=0.2)

    @worker.queue("push-jobs")
    async def job(msg: fairq.Received) -> None:
        handled.append(msg.body.decode())

    run = asyncio.create_task(worker.run())
    try:
        await t.publish({"n": 1})
        await _until(lambda: hooks.got["a"] == [1] and hooks.got["b"] == [1], "first delivery")
        await t.unsubscribe("one")
        await t.publish({"n": 2})
        await _until(lambda: hooks.got["b"] == [1, 2], "the other subscription goes on")
        await jobs.send("after")
        await _until(lambda: handled == ["after"], "the worker's queues go on")
        assert not run.done(), "removing a push subscription stopped the worker"
        await _until(
            lambda: (
                not [t for t in asyncio.all_tasks() if t.get_name() == "fairq-runner:hooks.one"]
            ),
            "the removed subscription's runner tasks end",
        )
        await t.subscribe("two", push=f"{base}/c")
        await asyncio.sleep(0.6)  # a rescan
        await t.publish({"n": 3})
        await _until(lambda: hooks.got["c"] == [3], "the changed URL is followed")
        assert hooks.got["b"] == [1, 2]
        await t.subscribe("two")  # a pull subscription now
        await asyncio.sleep(0.6)
        await t.publish({"n": 4})
        await asyncio.sleep(0.6)
        assert hooks.got["c"] == [3], "a subscription that no longer pushes was posted"
        (left,) = await two.receive(wait=2)
        assert left.json() == {"n": 4}
        assert hooks.got["a"] == [1]
    finally:
        worker.stop()
        await asyncio.wait_for(run, 10)
        server.should_exit = True
        await serving
