"""The waiting room over HTTP (``fairq.http.rooms``) and ``RequireAdmission``, on every
backend, through a real Starlette app and httpx (ASGI transport, no socket)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import parse_qs

import httpx
import jwt
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

import fairq
from fairq.http import RequireAdmission
from fairq.http.rooms import rooms_app

BASE = "http://shop.test"


def client(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE)


@pytest.fixture
async def room(broker: fairq.Broker) -> fairq.WaitingRoom:
    return await broker.waiting_room("ev-88", admit_rate=100)


@pytest.fixture
async def fans(
    broker: fairq.Broker, room: fairq.WaitingRoom
) -> AsyncIterator[Callable[[], httpx.AsyncClient]]:
    """New browsers (each with its own cookies) on the rooms app."""
    app = rooms_app(broker, target="/events/{room}/buy", join_burst=1000)
    made: list[httpx.AsyncClient] = []

    def new() -> httpx.AsyncClient:
        c = client(app)
        made.append(c)
        return c

    yield new
    for c in made:
        await c.aclose()


async def join(fan: httpx.AsyncClient, room: str = "ev-88") -> dict[str, Any]:
    r = await fan.post(f"/rooms/{room}/join", headers={"Accept": "application/json"})
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


# -- join and status ---------------------------------------------------------------------------
async def test_join_gives_each_browser_one_place(fans: Callable[[], httpx.AsyncClient]) -> None:
    a, b = fans(), fans()
    first = await join(a)
    assert first["state"] == "waiting" and first["position"] == 0 and first["ticket"]
    assert a.cookies.get("fairq_fan") and a.cookies.get("fairq_ticket")
    second = await join(b)
    assert second["position"] == 1
    again = await join(a)  # the same browser joining again keeps its place
    assert again["ticket"] == first["ticket"] and again["position"] == 0
    r = await a.get("/rooms/ev-88/status")  # the ticket comes from the cookie
    assert r.status_code == 200 and r.headers["cache-control"] == "no-store"
    assert r.json()["state"] == "waiting" and r.json()["position"] == 0
    r = await fans().get("/rooms/ev-88/status", params={"ticket": second["ticket"]})
    assert r.json()["position"] == 1


async def test_a_cookie_naming_another_fan_takes_nobodys_place(
    fans: Callable[[], httpx.AsyncClient], room: fairq.WaitingRoom
) -> None:
    """The public join trusts only anonymous ids it made itself: a fan the app joined
    under its own id ("user-42", through /v1 or the Python API) cannot be taken over by a
    browser that sets the cookie to that id (its ticket and admission token with it)."""
    theirs = await room.join("user-42")
    await room.admit(1)
    thief = fans()
    thief.cookies.set("fairq_fan", "user-42", domain="shop.test", path="/rooms")
    got = await join(thief)
    assert got["ticket"] != theirs.ticket and got["state"] == "waiting"
    assert thief.cookies.get("fairq_fan", path="/rooms", domain="shop.test") != "user-42"
    r = await thief.get("/rooms/ev-88/status")
    assert "token" not in r.json()


async def test_status_errors(fans: Callable[[], httpx.AsyncClient]) -> None:
    fan = fans()
    r = await fan.get("/rooms/ev-88/status")
    assert (r.status_code, r.json()["error"]) == (400, "invalid_ticket")
    r = await fan.get("/rooms/ev-88/status", params={"ticket": "1.AAAAAAAAAAAAAAAA.fan-1"})
    assert (r.status_code, r.json()["error"]) == (400, "invalid_ticket")
    for path in ("/rooms/nope/status?ticket=x", "/rooms/nope/jwks.json", "/rooms/nope"):
        r = await fan.get(path)
        assert r.status_code == 404, path
    r = await fan.post("/rooms/nope/join")
    assert (r.status_code, r.json()["error"]) == (404, "room_not_found")
    for path in ("/rooms/%00", "/rooms/" + "r" * 300, "/rooms/bad%20name/status?ticket=x"):
        r = await fan.get(path)
        assert (r.status_code, r.json()["error"]) == (400, "invalid_name"), path


async def test_refresh_is_longer_far_back(
    broker: fairq.Broker, room: fairq.WaitingRoom, fans: Callable[[], httpx.AsyncClient]
) -> None:
    front = await join(fans())
    await room.join_many([f"crowd-{i}" for i in range(3000)])
    back = await join(fans())
    assert back["position"] == 3001
    assert front["refresh"] == 2.0
    assert back["refresh"] == pytest.approx(min(30.0, back["eta"] / 10), abs=0.01)
    assert back["refresh"] > front["refresh"]


async def test_admitted_fans_get_the_token_in_a_cookie_never_in_a_url(
    room: fairq.WaitingRoom, fans: Callable[[], httpx.AsyncClient]
) -> None:
    fan = fans()
    await join(fan)
    await room.admit(1)
    r = await fan.get("/rooms/ev-88/status")
    body = r.json()
    assert body["state"] == "admitted" and body["refresh"] == 0
    assert body["next"] == "/events/ev-88/buy"
    token = body["token"]
    assert room.verify(token)["room"] == "ev-88"
    cookie = r.headers["set-cookie"]
    assert cookie.startswith(f"fairq_admission={token}")
    assert "HttpOnly" in cookie and "Path=/" in cookie and "SameSite=lax" in cookie
    assert fan.cookies.get("fairq_admission") == token
    page = await fan.get("/rooms/ev-88")
    assert "You're in!" in page.text and 'href="/events/ev-88/buy"' in page.text
    assert token not in page.text  # not in the page's links (nor anywhere in it)


async def test_jwks_verifies_tokens_offline(
    room: fairq.WaitingRoom, fans: Callable[[], httpx.AsyncClient]
) -> None:
    fan = fans()
    await join(fan)
    await room.admit(1)
    token = (await fan.get("/rooms/ev-88/status")).json()["token"]
    r = await fan.get("/rooms/ev-88/jwks.json")
    assert r.headers["content-type"] == "application/jwk-set+json"
    assert "max-age" in r.headers["cache-control"]
    (key,) = r.json()["keys"]
    claims = jwt.decode(
        token,
        jwt.PyJWK(key).key,
        algorithms=["EdDSA"],
        options={"verify_exp": False, "verify_iat": False},
    )
    assert claims["room"] == "ev-88"
    assert jwt.get_unverified_header(token)["kid"] == key["kid"]


async def test_sold_out_reaches_waiting_fans_and_later_joins(
    room: fairq.WaitingRoom, fans: Callable[[], httpx.AsyncClient]
) -> None:
    waiting = fans()
    before = await join(waiting)
    assert before["refresh"] > 0
    await room.sold_out()
    r = await waiting.get("/rooms/ev-88/status")  # the next refresh says it
    assert r.json() == {
        "room": "ev-88",
        "state": "sold_out",
        "position": None,
        "eta": None,
        "refresh": 0.0,
        "expires_at": None,
    }
    late = await join(fans())
    assert late["state"] == "sold_out" and late["ticket"] is None
    assert "Sold out" in (await waiting.get("/rooms/ev-88")).text
    assert "Sold out" in (await fans().get("/rooms/ev-88")).text


# -- joins: rate limit, challenge, identity ------------------------------------------------------
async def test_joins_are_rate_limited_per_client(
    broker: fairq.Broker, room: fairq.WaitingRoom
) -> None:
    app = rooms_app(broker, join_rate=0.5, join_burst=2)
    async with client(app) as fan:
        for _ in range(2):
            assert (await fan.post("/rooms/ev-88/join")).status_code == 200
        r = await fan.post("/rooms/ev-88/join")
        assert r.status_code == 429 and r.json()["error"] == "too_many_joins"
        assert int(r.headers["retry-after"]) >= 1


async def test_challenge_hook(broker: fairq.Broker, room: fairq.WaitingRoom) -> None:
    async def challenge(request: Request) -> bool:
        form = parse_qs((await request.body()).decode())
        return form.get("captcha") == ["solved"]

    app = rooms_app(broker, challenge=challenge, challenge_html='<div id="captcha"></div>')
    async with client(app) as fan:
        r = await fan.post(
            "/rooms/ev-88/join", data={"captcha": "no"}, headers={"Accept": "application/json"}
        )
        assert (r.status_code, r.json()["error"]) == (403, "challenge_failed")
        r = await fan.post(
            "/rooms/ev-88/join", data={"captcha": "solved"}, headers={"Accept": "application/json"}
        )
        assert r.status_code == 200
        page = (await client(app).get("/rooms/ev-88")).text
        assert '<div id="captcha"></div>' in page and 'data-auto="0"' in page


async def test_identify_hook(broker: fairq.Broker, room: fairq.WaitingRoom) -> None:
    def identify(request: Request) -> str | None:
        return request.headers.get("x-user")

    app = rooms_app(broker, identify=identify)
    async with client(app) as a, client(app) as b:
        r = await a.post("/rooms/ev-88/join")
        assert r.status_code == 401
        ta = (await a.post("/rooms/ev-88/join", headers={"x-user": "u-1"})).json()
        tb = (await b.post("/rooms/ev-88/join", headers={"x-user": "u-1"})).json()
        assert ta["ticket"] == tb["ticket"]  # one ticket per fan, whatever the browser
        assert "fairq_fan" not in a.cookies


async def test_form_join_without_javascript(fans: Callable[[], httpx.AsyncClient]) -> None:
    fan = fans()
    page = await fan.get("/rooms/ev-88")
    assert "Join the line" in page.text and '<meta http-equiv="refresh"' in page.text
    r = await fan.post("/rooms/ev-88/join", data={"join": "1"})  # a plain HTML form
    assert r.status_code == 303 and r.headers["location"] == "/rooms/ev-88"
    page = await fan.get("/rooms/ev-88")
    assert 'data-state="waiting"' in page.text and "fans ahead of you" in page.text


# -- RequireAdmission ----------------------------------------------------------------------------
def shop(room: fairq.WaitingRoom | str, **options: Any) -> Any:
    async def buy(request: Request) -> JSONResponse:
        return JSONResponse({"fan": request.scope.get("fairq.admission", {}).get("fan")})

    inner = Starlette(routes=[Route("/holds", buy, methods=["GET", "POST"]), Route("/about", buy)])
    return RequireAdmission(inner, room, paths=["/holds"], check_interval=0, **options)


async def test_require_admission_guards_paths_while_the_sale_runs(
    broker: fairq.Broker, room: fairq.WaitingRoom
) -> None:
    t = await room.join("fan-1")
    await room.admit(1)
    token = (await room.status(t.ticket)).token  # type: ignore[arg-type]
    assert token is not None
    other = await broker.waiting_room("ev-99")
    t2 = await other.join("fan-2")
    await other.admit(1)
    foreign = (await other.status(t2.ticket)).token  # type: ignore[arg-type]
    async with client(shop(room)) as http:
        r = await http.post("/holds")
        assert r.status_code == 401 and r.json()["error"] == "admission_required"
        assert r.json()["waiting_room"] == "/rooms/ev-88"
        assert r.headers["www-authenticate"].startswith("Bearer")
        for bad in ("garbage", token[:-4] + "AAAA", foreign):
            r = await http.post("/holds", headers={"Authorization": f"Bearer {bad}"})
            assert (r.status_code, r.json()["error"]) == (403, "invalid_token"), bad
        r = await http.post("/holds", headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 200 and r.json() == {"fan": "fan-1"}
        async with client(shop(room)) as browser:
            browser.cookies.set("fairq_admission", token)
            assert (await browser.post("/holds")).status_code == 200
        assert (await http.get("/about")).status_code == 200  # not guarded
        r = await http.get("/holds", headers={"Accept": "text/html"})  # a browser: to the room
        assert r.status_code == 303 and r.headers["location"] == "/rooms/ev-88"
        await room.sold_out()  # still guarded after the sell-out
        assert (await http.post("/holds")).status_code == 401
        await room.close()  # the sale is over: requests go through
        assert (await http.post("/holds")).status_code == 200


async def test_require_admission_single_use(broker: fairq.Broker, room: fairq.WaitingRoom) -> None:
    t = await room.join("fan-1")
    await room.admit(1)
    token = (await room.status(t.ticket)).token  # type: ignore[arg-type]
    async with client(shop("ev-88", broker=broker, consume=True)) as http:
        headers = {"Authorization": f"Bearer {token}"}
        assert (await http.post("/holds", headers=headers)).status_code == 200
        r = await http.post("/holds", headers=headers)
        assert r.status_code == 403 and "already used" in r.json()["detail"]


async def test_require_admission_before_opening_and_without_a_room(
    broker: fairq.Broker, clock: fairq.ManualClock
) -> None:
    async with client(shop("later", broker=broker)) as http:
        assert (await http.post("/holds")).status_code == 200  # no room: no sale running
        await broker.waiting_room("later", opens_at=clock.now() + 3600)
        r = await http.post("/holds")  # SPEC §8 rule 6: no sale runs before opening
        assert r.status_code == 200
        clock.advance(3601)  # 10:00: the sale runs, tokens are required
        assert (await http.post("/holds")).status_code == 401


def test_require_admission_needs_a_room() -> None:
    with pytest.raises(ValueError):
        RequireAdmission(Starlette(), "ev-88")
