"""SPEC §7, the HTTP side: ``fairq.http.IdempotencyMiddleware`` in front of a real Starlette
app, driven by httpx (in process, and once through uvicorn over TCP), on every backend."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

import fairq
from fairq.http import IdempotencyMiddleware
from fairq.http.middleware import fingerprint

KEY = "3f1c0b7e-8d5a-4c57-9a77-1b2e6f0d9c41"


class Shop:
    """A tiny order API that counts what really ran; ``/orders`` can be held open."""

    def __init__(self) -> None:
        self.runs: list[tuple[str, str]] = []
        self.gate: asyncio.Event | None = None  # set: requests to /orders wait for it
        self.entered = asyncio.Event()

    async def create(self, request: Request) -> Response:
        body = await request.body()
        self.runs.append((request.method, request.url.path))
        self.entered.set()
        if self.gate is not None:
            await self.gate.wait()
        n = len(self.runs)
        return JSONResponse(
            {"order": f"o-{n}", "echo": json.loads(body or b"null")},
            status_code=201,
            headers={"x-order": f"o-{n}"},
        )

    async def fail(self, request: Request) -> Response:
        self.runs.append((request.method, request.url.path))
        return JSONResponse({"error": "inventory down"}, status_code=503)

    async def crash(self, request: Request) -> Response:
        self.runs.append((request.method, request.url.path))
        raise RuntimeError("bug in the endpoint")

    async def stream(self, request: Request) -> Response:
        self.runs.append((request.method, request.url.path))
        size = int(request.query_params.get("size", "5"))

        async def chunks() -> AsyncIterator[bytes]:
            for i in range(size):
                yield f"chunk {i:04d}\n".encode()
                await asyncio.sleep(0)

        return StreamingResponse(chunks(), media_type="text/plain", status_code=200)

    async def read(self, request: Request) -> Response:
        self.runs.append((request.method, request.url.path))
        return JSONResponse({"orders": len(self.runs)})

    def app(self, store: Any, **options: Any) -> Starlette:
        routes = [
            Route("/orders", self.create, methods=["POST", "PATCH"]),
            Route("/orders", self.read, methods=["GET"]),
            Route("/refunds", self.create, methods=["POST"]),
            Route("/fail", self.fail, methods=["POST"]),
            Route("/crash", self.crash, methods=["POST"]),
            Route("/stream", self.stream, methods=["POST"]),
        ]
        middleware = [Middleware(IdempotencyMiddleware, store=store, **options)]
        return Starlette(routes=routes, middleware=middleware)


def client(app: Starlette) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    return httpx.AsyncClient(transport=transport, base_url="http://shop")


@pytest.fixture
def shop() -> Shop:
    return Shop()


@pytest.fixture
def store(broker: fairq.Broker) -> fairq.IdempotencyStore:
    return broker.idempotency("http", ttl=3600)


def headers(key: str = KEY, **more: str) -> dict[str, str]:
    return {"Idempotency-Key": key, **more}


async def until_pending(tasks: list[asyncio.Task[httpx.Response]], left: int) -> None:
    """Wait until only ``left`` of ``tasks`` are still running."""
    pending = {t for t in tasks if not t.done()}
    while len(pending) > left:
        _, pending = await asyncio.wait(pending, timeout=5, return_when=asyncio.FIRST_COMPLETED)
        assert pending or left == 0


def problem(r: httpx.Response, status: int, code: str) -> None:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/problem+json"
    body = r.json()
    assert body["status"] == status and body["error"] == code and body["detail"]


# -- first request, repeats -------------------------------------------------------------------
async def test_the_first_request_runs_and_its_response_is_stored(
    shop: Shop, store: fairq.IdempotencyStore
) -> None:
    async with client(shop.app(store)) as c:
        r = await c.post("/orders", json={"seats": ["B-12"]}, headers=headers())
    assert r.status_code == 201
    assert r.json() == {"order": "o-1", "echo": {"seats": ["B-12"]}}
    assert "idempotent-replayed" not in r.headers
    assert shop.runs == [("POST", "/orders")]
    record = await store.get(KEY)
    assert record is not None and record.completed


async def test_a_repeat_gets_the_stored_response_replayed(
    shop: Shop, store: fairq.IdempotencyStore
) -> None:
    async with client(shop.app(store)) as c:
        first = await c.post("/orders", json={"seats": ["B-12"]}, headers=headers())
        repeats = [
            await c.post("/orders", json={"seats": ["B-12"]}, headers=headers()) for _ in range(3)
        ]
        other = await c.post("/orders", json={"seats": ["B-12"]}, headers=headers("another-key"))
    assert shop.runs == [("POST", "/orders"), ("POST", "/orders")], "only new keys run"
    for r in repeats:
        assert r.status_code == 201
        assert r.content == first.content
        assert r.headers["x-order"] == "o-1"
        assert r.headers["content-type"] == "application/json"
        assert r.headers["idempotent-replayed"] == "true"
    assert other.json()["order"] == "o-2"


async def test_the_same_key_for_another_request_is_422(
    shop: Shop, store: fairq.IdempotencyStore
) -> None:
    async with client(shop.app(store)) as c:
        assert (await c.post("/orders", json={"n": 1}, headers=headers())).status_code == 201
        for r in (
            await c.post("/orders", json={"n": 2}, headers=headers()),  # body
            await c.post("/refunds", json={"n": 1}, headers=headers()),  # path
            await c.patch("/orders", json={"n": 1}, headers=headers()),  # method
            await c.post("/orders?dry_run=1", json={"n": 1}, headers=headers()),  # query
        ):
            problem(r, 422, "idempotency_key_reused")
        assert (await c.post("/orders", json={"n": 1}, headers=headers())).status_code == 201
    assert len(shop.runs) == 1


async def test_the_same_key_while_the_first_runs_is_409(
    shop: Shop, store: fairq.IdempotencyStore
) -> None:
    shop.gate = asyncio.Event()
    async with client(shop.app(store)) as c:
        first = asyncio.create_task(c.post("/orders", json={"n": 1}, headers=headers()))
        await asyncio.wait_for(shop.entered.wait(), 5)
        r = await c.post("/orders", json={"n": 1}, headers=headers())
        problem(r, 409, "idempotency_key_in_use")
        assert r.headers["retry-after"] == "1"
        problem(
            await c.post("/orders", json={"n": 2}, headers=headers()), 422, "idempotency_key_reused"
        )
        shop.gate.set()
        assert (await first).status_code == 201
        after = await c.post("/orders", json={"n": 1}, headers=headers())
    assert after.headers["idempotent-replayed"] == "true"
    assert len(shop.runs) == 1


async def test_concurrent_duplicates_run_once(shop: Shop, store: fairq.IdempotencyStore) -> None:
    shop.gate = asyncio.Event()
    async with client(shop.app(store)) as c:
        tasks = [
            asyncio.create_task(c.post("/orders", json={"n": 1}, headers=headers()))
            for _ in range(20)
        ]
        await asyncio.wait_for(shop.entered.wait(), 5)
        await until_pending(tasks, 1)
        shop.gate.set()
        answers = await asyncio.gather(*tasks)
        later = await asyncio.gather(
            *(c.post("/orders", json={"n": 1}, headers=headers()) for _ in range(10))
        )
    assert len(shop.runs) == 1
    assert sorted(r.status_code for r in answers) == [201] + [409] * 19
    assert {r.status_code for r in later} == {201}
    assert {r.headers["idempotent-replayed"] for r in later} == {"true"}
    assert {r.json()["order"] for r in later} == {"o-1"}


# -- the header ------------------------------------------------------------------------------
async def test_required_answers_400_without_the_header(
    shop: Shop, store: fairq.IdempotencyStore
) -> None:
    async with client(shop.app(store, required=True)) as c:
        problem(await c.post("/orders", json={"n": 1}), 400, "idempotency_key_missing")
        assert (await c.get("/orders")).status_code == 200, "GET needs no key"
        assert (await c.post("/orders", json={"n": 1}, headers=headers())).status_code == 201
    assert shop.runs == [("GET", "/orders"), ("POST", "/orders")]


async def test_without_required_a_request_without_the_header_just_runs(
    shop: Shop, store: fairq.IdempotencyStore
) -> None:
    async with client(shop.app(store)) as c:
        for _ in range(2):
            assert (await c.post("/orders", json={"n": 1})).status_code == 201
    assert len(shop.runs) == 2


async def test_malformed_keys_are_400(shop: Shop, store: fairq.IdempotencyStore) -> None:
    async with client(shop.app(store)) as c:
        for bad in ("has space", "x" * 101, '"unterminated', "ключ".encode()):
            r = await c.post("/orders", json={}, headers={"Idempotency-Key": bad})
            problem(r, 400, "idempotency_key_invalid")
        two = [("Idempotency-Key", "a"), ("Idempotency-Key", "b")]
        problem(await c.post("/orders", json={}, headers=two), 400, "idempotency_key_invalid")
        # an sf-string (the draft's syntax) and a bare value are the same key
        quoted = await c.post("/orders", json={}, headers={"Idempotency-Key": f'"{KEY}"'})
        bare = await c.post("/orders", json={}, headers={"Idempotency-Key": KEY})
    assert quoted.status_code == 201 and bare.headers["idempotent-replayed"] == "true"
    assert len(shop.runs) == 1


async def test_another_header_name(shop: Shop, store: fairq.IdempotencyStore) -> None:
    async with client(shop.app(store, header="X-Request-Id", required=True)) as c:
        problem(await c.post("/orders", headers=headers()), 400, "idempotency_key_missing")
        for _ in range(2):
            r = await c.post("/orders", headers={"x-request-id": "req-1"})
    assert r.headers["idempotent-replayed"] == "true"
    assert len(shop.runs) == 1


# -- what is stored --------------------------------------------------------------------------
async def test_error_responses_are_stored_and_replayed(
    shop: Shop, store: fairq.IdempotencyStore
) -> None:
    """The draft: a retry gets "the result of the previously completed operation, success
    or an error"; Stripe replays "including 500 errors"."""
    async with client(shop.app(store)) as c:
        first = await c.post("/fail", headers=headers())
        again = await c.post("/fail", headers=headers())
    assert first.status_code == again.status_code == 503
    assert again.json() == {"error": "inventory down"}
    assert again.headers["idempotent-replayed"] == "true"
    assert len(shop.runs) == 1


async def test_store_response_can_keep_server_errors_out(
    shop: Shop, store: fairq.IdempotencyStore
) -> None:
    async with client(shop.app(store, store_response=lambda status: status < 500)) as c:
        for _ in range(3):
            r = await c.post("/fail", headers=headers())
            assert r.status_code == 503 and "idempotent-replayed" not in r.headers
    assert len(shop.runs) == 3
    assert await store.get(KEY) is None


async def test_an_exception_in_the_app_releases_the_key(
    shop: Shop, store: fairq.IdempotencyStore
) -> None:
    async with client(shop.app(store)) as c:
        for _ in range(2):
            r = await c.post("/crash", headers=headers())
            assert r.status_code == 500 and "idempotent-replayed" not in r.headers
    assert len(shop.runs) == 2, "a crash stores nothing: the retry runs again"
    assert await store.get(KEY) is None


async def test_a_streamed_response_is_stored_whole(
    shop: Shop, store: fairq.IdempotencyStore
) -> None:
    async with client(shop.app(store)) as c:
        first = await c.post("/stream?size=50", headers=headers())
        again = await c.post("/stream?size=50", headers=headers())
    assert first.text == "".join(f"chunk {i:04d}\n" for i in range(50))
    assert again.content == first.content
    assert again.headers["idempotent-replayed"] == "true"
    assert again.headers["content-type"].startswith("text/plain")
    assert len(shop.runs) == 1


async def test_a_response_over_the_limit_is_not_stored_but_not_rerun(
    shop: Shop, store: fairq.IdempotencyStore
) -> None:
    async with client(shop.app(store, max_response_bytes=100)) as c:
        first = await c.post("/stream?size=50", headers=headers())  # 550 bytes
        again = await c.post("/stream?size=50", headers=headers())
    assert len(first.content) == 550, "the first client gets the whole response"
    problem(again, 409, "idempotency_response_not_stored")
    assert "200" in again.json()["detail"]
    assert len(shop.runs) == 1, "the work is done: a repeat must not run it again"


# -- time ------------------------------------------------------------------------------------
async def test_a_key_runs_again_after_the_ttl(
    shop: Shop, broker: fairq.Broker, clock: fairq.ManualClock
) -> None:
    store = broker.idempotency("http-ttl", ttl=600)
    async with client(shop.app(store)) as c:
        await c.post("/orders", json={}, headers=headers())
        clock.advance(599)
        assert (await c.post("/orders", json={}, headers=headers())).headers.get(
            "idempotent-replayed"
        ) == "true"
        clock.advance(2)
        r = await c.post("/orders", json={}, headers=headers())
    assert "idempotent-replayed" not in r.headers and r.json()["order"] == "o-2"


async def test_the_claim_of_a_crashed_server_expires(
    shop: Shop, store: fairq.IdempotencyStore, clock: fairq.ManualClock
) -> None:
    body = b'{"n":1}'
    fp = fingerprint("POST", "/orders", b"", body)
    dead = await store.try_claim(KEY, 60, fingerprint=fp)  # a server that died mid-request
    assert isinstance(dead, fairq.Claim)
    async with client(shop.app(store, lease=60)) as c:
        send = {"content": body, "headers": headers(**{"content-type": "application/json"})}
        problem(await c.post("/orders", **send), 409, "idempotency_key_in_use")  # type: ignore[arg-type]
        clock.advance(61)
        r = await c.post("/orders", **send)  # type: ignore[arg-type]
    assert r.status_code == 201 and len(shop.runs) == 1


# -- options ---------------------------------------------------------------------------------
async def test_partitions_keep_clients_apart(shop: Shop, store: fairq.IdempotencyStore) -> None:
    def account(scope: Any) -> str | None:
        return dict(scope["headers"]).get(b"x-account", b"").decode() or None

    async with client(shop.app(store, partition=account)) as c:
        alice = await c.post("/orders", json={}, headers=headers(**{"x-account": "alice"}))
        mallory = await c.post("/orders", json={}, headers=headers(**{"x-account": "mallory"}))
        alice2 = await c.post("/orders", json={}, headers=headers(**{"x-account": "alice"}))
    assert alice.json()["order"] == "o-1"
    assert mallory.json()["order"] == "o-2", "another account's key never replays alice's"
    assert alice2.headers["idempotent-replayed"] == "true" and alice2.content == alice.content


async def test_the_store_can_be_given_as_a_function(shop: Shop, broker: fairq.Broker) -> None:
    made: list[fairq.IdempotencyStore] = []

    def late_store() -> fairq.IdempotencyStore:  # e.g. from app.state after start-up
        made.append(broker.idempotency("late", ttl=60))
        return made[-1]

    async with client(shop.app(late_store)) as c:
        for _ in range(2):
            r = await c.post("/orders", json={}, headers=headers())
    assert r.headers["idempotent-replayed"] == "true"
    assert len(made) == 1


def test_bad_options() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        pass

    store_fn: Callable[[], Any] = lambda: None  # noqa: E731
    for bad in (
        {"store": 42},
        {"store": store_fn, "max_response_bytes": -1},
        {"store": store_fn, "lease": 0},
        {"store": store_fn, "header": ""},
    ):
        with pytest.raises(fairq.InvalidOption):
            IdempotencyMiddleware(app, **bad)


# -- a real server ---------------------------------------------------------------------------
async def test_through_uvicorn_with_concurrent_duplicates(live_broker: fairq.Broker) -> None:
    shop = Shop()
    shop.gate = asyncio.Event()
    app = shop.app(live_broker.idempotency("http-live", ttl=60))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="error"))
    serving = asyncio.create_task(server.serve())
    try:
        while not server.started:  # noqa: ASYNC110 - uvicorn offers no event to wait on
            await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as c:
            tasks = [
                asyncio.create_task(c.post("/orders", json={"n": 7}, headers=headers()))
                for _ in range(8)
            ]
            await asyncio.wait_for(shop.entered.wait(), 5)
            await until_pending(tasks, 1)
            shop.gate.set()
            answers = await asyncio.gather(*tasks)
            replay = await c.post("/orders", json={"n": 7}, headers=headers())
    finally:
        server.should_exit = True
        await serving
    assert sorted(r.status_code for r in answers) == [201] + [409] * 7
    assert replay.headers["idempotent-replayed"] == "true"
    assert replay.json() == {"order": "o-1", "echo": {"n": 7}}
    assert len(shop.runs) == 1


async def test_a_store_that_is_away_answers_503_and_runs_nothing(
    shop: Shop, broker: fairq.Broker
) -> None:
    """The key cannot be checked while its engine is down: a JSON 503 with Retry-After
    (retry with the same key), not a plain-text 500, and the request does not run."""

    class Away(fairq.IdempotencyStore):
        async def try_claim(self, *args: Any, **kwargs: Any) -> Any:
            raise fairq.ConnectionError("redis at redis://cache:6379/0: connection refused")

    async with client(shop.app(Away(broker.backend, "http", 3600))) as c:
        r = await c.post("/orders", json={"seats": ["B-12"]}, headers=headers())
    problem(r, 503, "backend_unavailable")
    assert r.headers["retry-after"] == "1"
    assert shop.runs == []
