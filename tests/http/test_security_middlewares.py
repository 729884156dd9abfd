"""Issue 15 against the two ASGI middlewares, served by a real uvicorn on a free loopback
port: ``RequireAdmission`` under a path prefix and for ``HEAD``; ``IdempotencyMiddleware``
keeping clients apart, never replaying ``Set-Cookie``, and bounding the body it buffers.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from httpsupport import uvicorn_serving
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route

import fairq
from fairq.http import RequireAdmission


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
