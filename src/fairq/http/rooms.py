"""The waiting room over HTTP (SPEC §8): join, status, the JWKS and the fan's page.

    from fairq.http.rooms import rooms_routes, rooms_app
    routes += rooms_routes(broker)              # in any Starlette app (fairq serve mounts it)
    app = rooms_app(url="sqlite:///fairq.db")   # or standalone

Routes (``{room}`` is a room's name):

* ``POST /rooms/{room}/join`` — put the fan in line; JSON ``{"ticket", "state",
  "position", "eta", "refresh"}`` (a plain form post is redirected to the page). The fan is
  who ``identify(request)`` says (your login), else an anonymous id kept in a cookie. Each
  client (IP) may join ``join_rate`` times a second (burst ``join_burst``), else ``429``
  with ``Retry-After``; ``challenge(request)`` may refuse a join (``403``) — the hook for a
  CAPTCHA or bot score, its widget rendered into the page's form by ``challenge_html``.
* ``GET /rooms/{room}/status`` — where the fan stands (``?ticket=``, else the ticket
  cookie the join set): ``{"state", "position", "eta", "refresh", "expires_at"}``; an
  admitted fan also gets ``token`` and ``next`` (where to go), and the token in the
  ``fairq_admission`` cookie (HttpOnly, SameSite=Lax) — never in a URL.
* ``GET /rooms/{room}/jwks.json`` — the room's public key, for gateways verifying offline.
* ``GET /rooms/{room}`` — the page: position, ETA and a progress bar, updating itself every
  ``refresh`` seconds as the server suggests (2 s near the front, up to 30 s far back,
  jittered), then "you're in" with a link to the purchase, or "sold out". It works without
  JavaScript too (a form and a meta refresh).

Every answer is ``Cache-Control: no-store`` except the JWKS. Errors are JSON ``{"error",
"detail"}``: ``404`` no such room, ``400`` a ticket the room never issued or a name that
cannot be a room's or a fan's (``invalid_name``), ``429`` too many
joins, ``403`` a failed challenge, ``503`` the backend failed, or the room was made with a
``secret=`` these routes were not given (``room_secret_missing``).
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import inspect
import logging
import math
import re
import secrets
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from importlib import resources
from string import Template
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from ..broker import Broker, connect
from ..errors import (
    BackendError,
    ConfigConflict,
    FairqError,
    InvalidName,
    InvalidOption,
    InvalidTicket,
    RoomNotFound,
)
from ..message import check_key, check_name
from ..waitingroom import Status, Ticket, WaitingRoom, refresh_interval
from .admission import ADMISSION_COOKIE

__all__ = [
    "FAN_COOKIE",
    "TICKET_COOKIE",
    "ClientLimiter",
    "RoomSecretMissing",
    "rooms_app",
    "rooms_routes",
]

log = logging.getLogger("fairq.http.rooms")

#: the anonymous fan id of a browser (when no ``identify`` hook says who the fan is)
FAN_COOKIE = "fairq_fan"
#: the fan's ticket, scoped to the room's path
TICKET_COOKIE = "fairq_ticket"
_FIRST_COOKIE = "fairq_first"  # the position at join, for the progress bar
_HANDLE_TTL = 10.0  # seconds a room handle is reused before the room is read again

BrokerSource = Broker | Callable[[Request], Broker]
Identify = Callable[[Request], "str | Awaitable[str | None] | None"]
Challenge = Callable[[Request], "bool | Awaitable[bool]"]


class ClientLimiter:
    """Token buckets per client: ``rate`` joins per second, bursts of ``burst``; the
    ``max_clients`` most recently seen are remembered."""

    def __init__(self, rate: float, burst: float, max_clients: int = 100_000) -> None:
        self.rate = rate
        self.burst = max(1.0, burst)
        self.max_clients = max_clients
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def take(self, client: str, now: float | None = None) -> float:
        """Take a token for ``client``: 0.0 if it had one, else seconds until it will."""
        now = time.monotonic() if now is None else now
        tokens, at = self._buckets.pop(client, (self.burst, now))
        tokens = min(self.burst, tokens + (now - at) * self.rate)
        wait = 0.0
        if tokens >= 1.0:
            tokens -= 1.0
        else:
            wait = (1.0 - tokens) / self.rate if self.rate > 0 else math.inf
        self._buckets[client] = (tokens, now)
        if len(self._buckets) > self.max_clients:
            self._buckets.popitem(last=False)
        return wait


async def _maybe(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


def _json(data: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> Response:
    return Response(
        orjson.dumps(data),
        status_code=status,
        media_type="application/json",
        headers={"Cache-Control": "no-store", **(headers or {})},
    )


def _error(
    status: int, code: str, detail: str, headers: Mapping[str, str] | None = None
) -> Response:
    return _json({"error": code, "detail": detail}, status, headers)


def _wants_json(request: Request) -> bool:
    accept = request.headers.get("accept", "")
    if "application/json" in accept:
        return True
    kind = request.headers.get("content-type", "")
    return not kind.startswith(("application/x-www-form-urlencoded", "multipart/form-data"))


class RoomSecretMissing(Exception):
    """This server cannot serve a room: it was made with ``secret=``, and the server has
    no secret for it, or another one (a configuration problem, not bad input)."""

    def __init__(self, room: str, wrong: bool) -> None:
        what = "another secret than the room's" if wrong else "no secret for it"
        super().__init__(
            f"waiting room {room!r} was created with secret=, and this server has {what} "
            "(its tokens are signed with that secret): give the server the room's secret "
            "(fairq serve: "
            f"FAIRQ_ROOM_SECRETS='{room}=<secret>', or '*=<secret>' for every room; an app: "
            "rooms_routes(secrets={...}))"
        )
        self.room = room
        self.wrong = wrong


async def open_room(broker: Broker, name: str, secrets_: Mapping[str, bytes]) -> WaitingRoom:
    """The handle of room ``name`` with its signing key: from the backend for a room made
    without ``secret=``, else from ``secrets_`` (room name, or ``"*"``, → secret);
    ``RoomSecretMissing`` when this server cannot sign for it."""
    secret = secrets_.get(name)
    if secret is None:
        try:
            return await broker.room(name)
        except InvalidOption:  # made with secret=: only the given secret opens it
            secret = secrets_.get("*")
            if secret is None:
                raise RoomSecretMissing(name, wrong=False) from None
    try:
        return await broker.room(name, secret)
    except ConfigConflict:
        raise RoomSecretMissing(name, wrong=True) from None


class _Rooms:
    """Room handles by name, reused for a few seconds (opening one derives its keys).
    ``secrets_``: room name → secret, ``"*"`` for every room made with a secret."""

    def __init__(self, broker: BrokerSource, secrets_: Mapping[str, bytes]) -> None:
        self._broker = broker
        self._secrets = dict(secrets_)
        self._handles: dict[str, tuple[WaitingRoom, float]] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    def broker(self, request: Request) -> Broker:
        return self._broker if isinstance(self._broker, Broker) else self._broker(request)

    async def get(self, request: Request, name: str, fresh: bool = False) -> WaitingRoom:
        check_name(name, "waiting room")
        now = time.monotonic()
        found = self._handles.get(name)
        if found is not None and not fresh and now - found[1] < _HANDLE_TTL:
            return found[0]
        lock = self._locks.setdefault(name, asyncio.Lock())
        async with lock:
            found = self._handles.get(name)
            if found is not None and not fresh and time.monotonic() - found[1] < _HANDLE_TTL:
                return found[0]
            room = await self._open(self.broker(request), name)
            old = found[0] if found is not None else None
            if old is not None and old.record.created_at == room.record.created_at:
                room = old  # the same room: keep the handle (and its derived keys)
            self._handles[name] = (room, time.monotonic())
            if len(self._handles) > 1000:
                self._handles.pop(next(iter(self._handles)))
            return room

    async def _open(self, broker: Broker, name: str) -> WaitingRoom:
        return await open_room(broker, name, self._secrets)


def _page_template() -> Template:
    text = resources.files(__package__).joinpath("rooms/page.html").read_text("utf-8")
    return Template(text)


_STATES = ("none", "pre_queue", "waiting", "admitted", "used", "sold_out", "expired", "closed")


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "unknown"
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{round(s / 60)} min"
    return f"{s / 3600:.1f} h"


def rooms_routes(
    broker: BrokerSource,
    *,
    secrets: Mapping[str, bytes] | None = None,
    identify: Identify | None = None,
    challenge: Challenge | None = None,
    challenge_html: str = "",
    join_rate: float = 1.0,
    join_burst: float = 5.0,
    trust_forwarded: bool = False,
    target: str | Callable[[str], str] = "/",
    refresh_bounds: tuple[float, float] = (2.0, 30.0),
    prefix: str = "/rooms",
) -> list[BaseRoute]:
    """The waiting-room routes (see the module docstring) for a Starlette app.

    ``broker``: the broker, or a function of the request returning it (for an app that
    connects at start-up). ``secrets``: room name → secret, for rooms made with one
    (``"*"``: the secret of every room made with one and not named); a room made with a
    secret the routes do not have answers ``503 room_secret_missing``, saying so.
    ``identify``: who the fan is (a string, None: not signed in → 401); default: an
    anonymous id in a cookie. ``challenge``: False refuses a join (403); its widget goes in
    the page's form as ``challenge_html`` (trusted HTML). ``join_rate``/``join_burst``:
    joins per second per client IP (``trust_forwarded``: the first ``X-Forwarded-For``
    address, behind your own proxy only). ``target``: where an admitted fan is sent (a
    string with ``{room}``, or a function of the room name). ``refresh_bounds``: the
    shortest and longest refresh interval suggested.
    """
    rooms = _Rooms(broker, secrets or {})
    limiter = ClientLimiter(join_rate, join_burst)
    template = _page_template()
    low, high = refresh_bounds
    base = prefix.rstrip("/")

    def target_of(room: str) -> str:
        return target(room) if callable(target) else target.replace("{room}", room)

    def refresh_of(state: str, position: int | None, eta: float | None) -> float:
        suggested = refresh_interval(state, position, eta)  # type: ignore[arg-type]
        if suggested <= 0:
            return 0.0
        return round(max(low, min(high, suggested)), 2)

    def client_of(request: Request) -> str:
        if trust_forwarded:
            forwarded = request.headers.get("x-forwarded-for")
            if forwarded:
                return forwarded.split(",")[0].strip()
        return request.client.host if request.client else "unknown"

    def secure(request: Request) -> bool:
        return request.url.scheme == "https"

    def status_body(room: WaitingRoom, st: Status) -> dict[str, Any]:
        body: dict[str, Any] = {
            "room": room.name,
            "state": st.state,
            "position": st.position,
            "eta": None if st.eta is None else round(st.eta, 1),
            "refresh": refresh_of(st.state, st.position, st.eta),
            "expires_at": st.expires_at,
        }
        if st.token is not None:
            body["token"] = st.token
            body["next"] = target_of(room.name)
        return body

    def admit_cookie(request: Request, response: Response, st: Status) -> None:
        if st.token is None or st.expires_at is None:
            return
        response.set_cookie(
            ADMISSION_COOKIE,
            st.token,
            max_age=max(1, int(st.expires_at - time.time())),
            path="/",
            httponly=True,
            samesite="lax",
            secure=secure(request),
        )

    async def fan_of(request: Request) -> tuple[str | None, bool]:
        """The fan id, and whether it is a new anonymous one (to be set as a cookie)."""
        if identify is not None:
            fan = await _maybe(identify(request))
            return (None if fan is None else check_key(fan, "fan id")), False
        fan = request.cookies.get(FAN_COOKIE)
        if fan and is_anonymous_fan(fan):
            # only an id this server made: a cookie naming an app's fan ("user-42", who
            # joined through /v1) would take that fan's place and admission token
            return fan, False
        return ANONYMOUS_PREFIX + secrets_token(), True

    async def status_of(request: Request, name: str, ticket: str) -> tuple[WaitingRoom, Status]:
        room = await rooms.get(request, name)
        try:
            return room, await room.status(ticket)
        except InvalidTicket:
            # the room may have been made again since this handle was opened
            room = await rooms.get(request, name, fresh=True)
            return room, await room.status(ticket)

    async def guarded(request: Request, call: Callable[[], Awaitable[Response]]) -> Response:
        try:
            return await call()
        except RoomNotFound as exc:
            return _error(404, "room_not_found", str(exc))
        except InvalidTicket as exc:
            return _error(400, "invalid_ticket", str(exc))
        except InvalidName as exc:  # a room name or fan id that cannot be: 400, as under /v1
            return _error(400, "invalid_name", str(exc))
        except BackendError as exc:
            log.error("%s %s failed: %s", request.method, request.url.path, exc)
            return _error(503, "backend_error", str(exc), {"Retry-After": "1"})
        except RoomSecretMissing as exc:
            log.warning("%s", exc)
            return _error(503, "room_secret_missing", str(exc))
        except FairqError as exc:
            return _error(422, "invalid", str(exc))

    # -- join ------------------------------------------------------------------------------
    async def join(request: Request) -> Response:
        request.scope["fairq.route"] = f"{base}/{{room}}/join"  # the metrics' label
        name = request.path_params["room"]

        async def run() -> Response:
            wait = limiter.take(client_of(request))
            if wait > 0:
                retry = str(max(1, math.ceil(wait)))
                return _error(
                    429, "too_many_joins", "too many joins; try again", {"Retry-After": retry}
                )
            if challenge is not None and not await _maybe(challenge(request)):
                return _error(403, "challenge_failed", "the challenge was not passed")
            fan, new_fan = await fan_of(request)
            if fan is None:
                return _error(401, "unauthorized", "sign in to join the line")
            room = await rooms.get(request, name)
            t: Ticket = await room.join(fan)
            body = {
                "room": room.name,
                "ticket": t.ticket,
                "state": t.state,
                "position": t.position,
                "eta": None if t.eta is None else round(t.eta, 1),
                "refresh": refresh_of(t.state, t.position, t.eta),
            }
            response: Response
            if _wants_json(request):
                response = _json(body)
            else:
                response = RedirectResponse(f"{base}/{name}", status_code=303)
            path = f"{base}/{name}"
            if new_fan:
                response.set_cookie(
                    FAN_COOKIE,
                    fan,
                    max_age=86_400,
                    path=base or "/",
                    httponly=True,
                    samesite="lax",
                    secure=secure(request),
                )
            if t.ticket is not None:
                for key, value in (
                    (TICKET_COOKIE, t.ticket),
                    (_FIRST_COOKIE, str(t.position or 0)),
                ):
                    response.set_cookie(
                        key,
                        value,
                        max_age=86_400,
                        path=path,
                        httponly=True,
                        samesite="lax",
                        secure=secure(request),
                    )
            return response

        return await guarded(request, run)

    # -- status ----------------------------------------------------------------------------
    async def status(request: Request) -> Response:
        request.scope["fairq.route"] = f"{base}/{{room}}/status"  # the metrics' label
        name = request.path_params["room"]

        async def run() -> Response:
            ticket = request.query_params.get("ticket") or request.cookies.get(TICKET_COOKIE)
            if not ticket:
                return _error(400, "invalid_ticket", "no ticket: join the line first")
            room, st = await status_of(request, name, ticket)
            response = _json(status_body(room, st))
            admit_cookie(request, response, st)
            return response

        return await guarded(request, run)

    # -- jwks ------------------------------------------------------------------------------
    async def jwks(request: Request) -> Response:
        request.scope["fairq.route"] = f"{base}/{{room}}/jwks.json"  # the metrics' label
        name = request.path_params["room"]

        async def run() -> Response:
            room = await rooms.get(request, name)
            return Response(
                orjson.dumps(room.jwks()),
                media_type="application/jwk-set+json",
                headers={"Cache-Control": "public, max-age=300"},
            )

        return await guarded(request, run)

    # -- the page --------------------------------------------------------------------------
    async def page(request: Request) -> Response:
        request.scope["fairq.route"] = f"{base}/{{room}}"  # the metrics' label
        name = request.path_params["room"]

        async def run() -> Response:
            room = await rooms.get(request, name)
            ticket = request.cookies.get(TICKET_COOKIE)
            st: Status | None = None
            if ticket:
                try:
                    room, st = await status_of(request, name, ticket)
                except InvalidTicket:
                    st = None
            state: str = st.state if st is not None else "none"
            if st is None:
                phase = await room.phase()
                if phase in ("sold_out", "closed"):
                    state = phase
            refresh = refresh_of(state, st.position if st else None, st.eta if st else None)
            try:
                first = int(request.cookies.get(_FIRST_COOKIE, "0"))
            except ValueError:
                first = 0
            position = st.position if st is not None else None
            if position is not None and position > first:
                first = position
            percent = 100.0 * (1 - position / first) if position is not None and first else 0.0
            until = "-"
            if st is not None and st.expires_at is not None:
                until = time.strftime("%H:%M:%S", time.localtime(st.expires_at))
            values = {
                "room": html.escape(room.name),
                "state": state,
                "refresh": refresh,
                "refresh_whole": max(1, math.ceil(refresh or high)),
                "refresh_text": _duration(refresh),
                "first": first,
                "status_url": html.escape(f"{base}/{name}/status"),
                "join_url": html.escape(f"{base}/{name}/join"),
                "auto_join": "0" if challenge_html else "1",
                "challenge": challenge_html,
                "position": f"{position:,}" if position is not None else "-",
                "percent": f"{percent:.1f}",
                "eta_text": _duration(st.eta if st is not None else None),
                "until_text": until,
                "target": html.escape(target_of(room.name)),
                "hide_refresh": "" if refresh else "hidden",
            }
            for s in _STATES:
                values[f"hide_{s}"] = "" if s == state else "hidden"
            response = HTMLResponse(
                template.substitute(values), headers={"Cache-Control": "no-store"}
            )
            if st is not None:
                admit_cookie(request, response, st)
            return response

        return await guarded(request, run)

    return [
        Route(f"{base}/{{room}}/join", join, methods=["POST"]),
        Route(f"{base}/{{room}}/status", status, methods=["GET"]),
        Route(f"{base}/{{room}}/jwks.json", jwks, methods=["GET"]),
        Route(f"{base}/{{room}}", page, methods=["GET"]),
    ]


def secrets_token() -> str:
    """A new anonymous fan id (128 random bits, URL-safe)."""
    return secrets.token_urlsafe(16)


#: what starts the id of an anonymous visitor of the public pages (reserved: /v1 refuses it)
ANONYMOUS_PREFIX = "f-"
_ANONYMOUS = re.compile(r"f-[A-Za-z0-9_-]{22}")


def is_anonymous_fan(fan: str) -> bool:
    """Whether ``fan`` has the form of an id the public pages make (``f-`` + 22 random
    URL-safe characters)."""
    return _ANONYMOUS.fullmatch(fan) is not None


def rooms_app(broker: Broker | None = None, *, url: str | None = None, **options: Any) -> Starlette:
    """A Starlette app serving only the waiting-room routes, on ``broker`` or on a broker
    it connects to ``url`` at start-up (and closes at shutdown). ``options`` are
    :func:`rooms_routes`'s."""
    state: dict[str, Broker] = {}

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        state["broker"] = broker if broker is not None else await connect(url)
        try:
            yield
        finally:
            if broker is None:
                await state["broker"].close()

    def broker_of(request: Request) -> Broker:
        return state["broker"]

    return Starlette(
        routes=rooms_routes(broker if broker is not None else broker_of, **options),
        lifespan=lifespan,
    )
