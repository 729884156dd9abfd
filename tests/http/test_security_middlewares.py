"""Issue 15 against the two ASGI middlewares, served by a real uvicorn on a free loopback
port: ``RequireAdmission`` under a path prefix and for ``HEAD``; ``IdempotencyMiddleware``
keeping clients apart, never replaying ``Set-Cookie``, and bounding the body it buffers.
"""

from __future__ import annotations

import asyncio
import select
import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from httpsupport import uvicorn_serving
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route

import fairq
from fairq.http import IdempotencyMiddleware, RequireAdmission


@pytest.fixture
async def memory() -> AsyncIterator[fairq.Broker]:
    b = await fairq.connect("memory://")
    try:
        yield b
    finally:
        await b.close()


class Purchases:
    """The shop's purchase handler, counting what really ran (its side effects)."""

    def __init__(self) -> None:
        self.runs: list[str] = []

    async def hold(self, request: Request) -> Response:
        self.runs.append(request.method)
        return JSONResponse({"held": len(self.runs)})

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/holds", self.hold, methods=["GET", "POST"])])


# -- RequireAdmission ------------------------------------------------------------------------
async def test_require_admission_under_a_mount_fails_closed(memory: fairq.Broker) -> None:
    """Defect 1: inside ``Mount("/shop", ...)`` the guard saw ``/shop/holds`` while the
    routes saw ``/holds``: a purchase without a token went through while the sale ran."""
    await memory.waiting_room("ev-88", admit_rate=100)
    shop = Purchases()
    guarded = RequireAdmission(shop.app(), "ev-88", broker=memory, paths=["/holds"])
    outer = Starlette(routes=[Mount("/shop", app=guarded)])
    async with uvicorn_serving(outer) as url, httpx.AsyncClient(base_url=url) as http:
        r = await http.post("/shop/holds")
        assert r.status_code == 401, r.text
        assert r.json()["error"] == "admission_required"
        assert shop.runs == [], "the purchase handler must not run without a token"


async def test_require_admission_behind_a_root_path(memory: fairq.Broker) -> None:
    """Defect 1: ``uvicorn --root-path /shop`` (a proxy strips ``/shop``): the guard must
    match what the routed app sees."""
    room = await memory.waiting_room("ev-88", admit_rate=100)
    t = await room.join("fan-1")
    await room.admit(1)
    token = (await room.status(t.ticket)).token  # type: ignore[arg-type]
    shop = Purchases()
    app = RequireAdmission(shop.app(), room, paths=["/holds"])
    async with (
        uvicorn_serving(app, root_path="/shop") as url,
        httpx.AsyncClient(base_url=url) as http,
    ):
        r = await http.post("/holds")
        assert r.status_code == 401, r.text
        assert shop.runs == []
        r = await http.post("/holds", headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 200 and shop.runs == ["POST"]


async def test_require_admission_guards_head_with_get(memory: fairq.Broker) -> None:
    """Defect 2: Starlette runs the GET endpoint for HEAD; ``methods=["GET"]`` must guard
    HEAD too, or its side effects run without a token."""
    await memory.waiting_room("ev-88", admit_rate=100)
    shop = Purchases()
    app = RequireAdmission(
        shop.app(), "ev-88", broker=memory, paths=["/holds"], methods=["GET", "POST"]
    )
    async with uvicorn_serving(app) as url, httpx.AsyncClient(base_url=url) as http:
        assert (await http.get("/holds")).status_code == 401
        r = await http.head("/holds")
        assert r.status_code == 401
        assert shop.runs == [], "HEAD ran the GET endpoint without a token"


# -- IdempotencyMiddleware -------------------------------------------------------------------
KEY = "5d0c6d8e-0b1f-4f0e-9a57-2f8f6c1e7b10"


class Orders:
    """An order API that answers each client its own data and a session cookie."""

    def __init__(self) -> None:
        self.runs = 0
        self.read = 0

    async def create(self, request: Request) -> Response:
        body = await request.body()
        self.read += len(body)
        self.runs += 1
        response = JSONResponse(
            {"order": f"o-{self.runs}", "for": request.headers.get("authorization")},
            status_code=201,
        )
        response.set_cookie("session", f"secret-of-{request.headers.get('authorization')}")
        return response

    def app(self, store: fairq.IdempotencyStore, **options: Any) -> Any:
        inner = Starlette(routes=[Route("/orders", self.create, methods=["POST"])])
        return IdempotencyMiddleware(inner, store, **options)


async def test_idempotency_keys_are_scoped_by_credentials(memory: fairq.Broker) -> None:
    """Defect 6: with the default ``partition=None`` another client sending the same key
    and body got the first client's response replayed, ``Set-Cookie`` included."""
    orders = Orders()
    app = orders.app(memory.idempotency("api", ttl=60))
    key = {"Idempotency-Key": KEY}
    async with uvicorn_serving(app) as url, httpx.AsyncClient(base_url=url) as http:
        alice = await http.post(
            "/orders", json={"n": 1}, headers={**key, "Authorization": "Bearer alice"}
        )
        assert alice.status_code == 201 and "secret-of-Bearer alice" in alice.headers["set-cookie"]
        http.cookies.clear()
        mallory = await http.post(
            "/orders", json={"n": 1}, headers={**key, "Authorization": "Bearer mallory"}
        )
        assert "idempotent-replayed" not in mallory.headers, "alice's response was replayed"
        assert mallory.json() == {"order": "o-2", "for": "Bearer mallory"}
        http.cookies.clear()
        again = await http.post(
            "/orders", json={"n": 1}, headers={**key, "Authorization": "Bearer alice"}
        )
        assert again.headers["idempotent-replayed"] == "true"
        assert again.json() == alice.json()
        assert "set-cookie" not in again.headers, "a stored Set-Cookie was replayed"
    assert orders.runs == 2


async def test_idempotency_never_stores_set_cookie_even_with_a_partition(
    memory: fairq.Broker,
) -> None:
    orders = Orders()
    app = orders.app(memory.idempotency("api", ttl=60), partition=lambda scope: "tenant-1")
    key = {"Idempotency-Key": KEY}
    async with uvicorn_serving(app) as url, httpx.AsyncClient(base_url=url) as http:
        first = await http.post("/orders", json={}, headers={**key, "Authorization": "Bearer a"})
        assert "set-cookie" in first.headers
        http.cookies.clear()
        again = await http.post("/orders", json={}, headers={**key, "Authorization": "Bearer b"})
        assert again.headers["idempotent-replayed"] == "true", "one partition: one key space"
        assert "set-cookie" not in again.headers


def raw_request(port: int, head: bytes, chunks: Iterator[bytes], timeout: float = 10.0) -> bytes:
    """Send ``head`` then ``chunks`` — stopping as soon as the server answers or closes —
    and return its answer (read until it closes the connection). The request body is
    never finished, so a server that waits for all of it never answers."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(head)
        for chunk in chunks:
            readable, _, _ = select.select([sock], [], [], 0)
            if readable:
                break  # the server answered (or closed) before the body was complete
            try:
                sock.sendall(chunk)
            except OSError:  # the server closed its side
                break
        answer = b""
        try:
            while data := sock.recv(65536):
                answer += data
        except (TimeoutError, ConnectionResetError):
            pass
        return answer


async def test_idempotency_bounds_the_body_it_buffers(memory: fairq.Broker) -> None:
    """Defect 7: the middleware read a whole chunked body (200 MB: +330 MB RSS) before the
    app and its body limit ran, unauthenticated. It must answer 413 past ``max_body``
    (default 25 MiB, as ``fairq serve``) without reading the rest."""
    orders = Orders()
    app = orders.app(memory.idempotency("api", ttl=60))
    async with uvicorn_serving(app) as url:
        port = int(url.rsplit(":", 1)[1])
        head = (
            b"POST /orders HTTP/1.1\r\nHost: 127.0.0.1\r\nIdempotency-Key: "
            + KEY.encode()
            + b"\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        mib = b"x" * (1 << 20)
        chunk = f"{len(mib):x}\r\n".encode() + mib + b"\r\n"
        sent = 0

        def body() -> Iterator[bytes]:  # up to 60 MiB, never the last chunk
            nonlocal sent
            for _ in range(60):
                sent += 1
                yield chunk

        answer = await asyncio.to_thread(raw_request, port, head, body())
        assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
        assert b"body_too_large" in answer
        assert sent < 40, f"the server read {sent} MiB before answering"
        # a declared length over the limit is refused before a byte of the body is read
        head = (
            b"POST /orders HTTP/1.1\r\nHost: 127.0.0.1\r\nIdempotency-Key: "
            + KEY.encode()
            + b"\r\nContent-Length: 209715200\r\n\r\n"
        )
        answer = await asyncio.to_thread(raw_request, port, head, iter([mib] * 5))
        assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert orders.runs == 0 and orders.read == 0


async def test_idempotency_max_body_can_be_lowered(memory: fairq.Broker) -> None:
    orders = Orders()
    app = orders.app(memory.idempotency("api", ttl=60), max_body=1000)
    async with uvicorn_serving(app) as url, httpx.AsyncClient(base_url=url) as http:
        key = {"Idempotency-Key": KEY}
        r = await http.post("/orders", content=b"x" * 1001, headers=key)
        assert r.status_code == 413 and r.json()["error"] == "body_too_large"
        assert (await http.post("/orders", content=b"x" * 1000, headers=key)).status_code == 201
        # without the header the middleware buffers nothing: the app's own limit decides
        assert (await http.post("/orders", content=b"x" * 5000)).status_code == 201
