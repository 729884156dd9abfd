"""``RequireAdmission``: the gateway's check of a waiting room's admission tokens.

A pure ASGI middleware (no framework imported) for the purchase paths of an app::

    from fairq.http import RequireAdmission
    app = RequireAdmission(app, room=room, paths=["/holds", "/checkout"])
    # or, opening the room by name on first use:
    app = RequireAdmission(app, room="ev-88", broker=broker, paths=["/holds"], consume=True)

While the room's sale is running — from its ``opens_at`` (at once when it has none),
through sell-out, until :meth:`WaitingRoom.close <fairq.waitingroom.WaitingRoom.close>`
(SPEC §8 rule 6: "while the room is running (opened, not closed)") — a request to a
guarded path must carry a valid
admission token of the room, as ``Authorization: Bearer <token>`` or in the cookie the
room's page sets (``fairq_admission``). Without one the answer is ``401`` (no token) or
``403`` (a forged, altered, expired, other room's or, with ``consume=True``, already used
token), JSON ``{"error": ..., "detail": ..., "room": ..., "waiting_room": "/rooms/<room>"}``;
a browser's ``GET`` for a page is sent to the waiting room instead (``303``). With no sale
running (before opening, after closing, or no such room) requests pass through untouched,
as the seed's gateway does: before 10:00 the shop decides what it sells, not the room.

Verification needs no backend call (Ed25519, the room's key); only the room's phase is
read, at most once per ``check_interval`` seconds, and ``consume=True`` (single use: the
token's ``jti`` is burnt) costs one backend step. The claims of an admitted request are
in ``scope["fairq.admission"]``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection, Sequence
from http.cookies import SimpleCookie

import orjson

from ..broker import Broker
from ..errors import InvalidToken, RoomNotFound
from ..waitingroom import WaitingRoom
from .middleware import ASGIApp, Receive, Scope, Send

__all__ = ["ADMISSION_COOKIE", "RequireAdmission"]

#: the cookie a room's page puts the admission token in
ADMISSION_COOKIE = "fairq_admission"


async def _sale_running(room: WaitingRoom) -> bool:
    """Opened (its ``opens_at`` has passed, or it has none) and not closed."""
    record = await room.backend.room_record(room.name)
    if record.phase == "closed":
        return False
    opens_at = record.config.opens_at
    return opens_at is None or room.backend.clock.now() >= opens_at


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value).decode("latin-1")
    return None


def token_of(scope: Scope, cookie: str = ADMISSION_COOKIE) -> str | None:
    """The admission token of a request: ``Authorization: Bearer``, else the cookie."""
    auth = _header(scope, b"authorization")
    if auth:
        kind, _, value = auth.partition(" ")
        if kind.lower() == "bearer" and value.strip():
            return value.strip()
    raw = _header(scope, b"cookie")
    if raw:
        jar: SimpleCookie = SimpleCookie()
        try:
            jar.load(raw)
        except Exception:  # a malformed Cookie header is no token, not a crash
            return None
        morsel = jar.get(cookie)
        if morsel is not None and morsel.value:
            return morsel.value
    return None


def _route_paths(path: str, root_path: str) -> tuple[str, ...]:
    """The spellings of ``path`` the application may route: without ``root_path`` (what
    Starlette's router matches, ASGI's rule) and as it is (servers that leave
    ``root_path`` out of ``path``)."""
    if root_path and path.startswith(root_path):
        rest = path[len(root_path) :]
        if not rest:
            return (path, "/")
        if rest.startswith("/"):
            return (path, rest)
    return (path,)


class RequireAdmission:
    """Refuse requests to ``paths`` without a valid admission token of ``room`` while its
    sale runs. See the module docstring.

    ``room``: a :class:`~fairq.waitingroom.WaitingRoom`, or its name with ``broker`` (a
    broker, or a callable returning one) and, if the room was made with one, ``secret``.
    ``paths``: path prefixes to guard (``"/holds"`` guards ``/holds`` and ``/holds/7``), as
    the wrapped app routes them — under a ``Mount("/shop", ...)`` or ``--root-path /shop``
    still ``"/holds"``; ``methods``: only these methods (default: all; ``GET`` includes
    ``HEAD``). ``consume``: burn each token on use.
    ``room_page``: where a browser is sent (default ``/rooms/<room>``).
    """

    def __init__(
        self,
        app: ASGIApp,
        room: WaitingRoom | str,
        *,
        paths: Sequence[str] = ("/",),
        methods: Collection[str] | None = None,
        broker: Broker | Callable[[], Broker] | None = None,
        secret: bytes | None = None,
        consume: bool = False,
        cookie: str = ADMISSION_COOKIE,
        room_page: str | None = None,
        check_interval: float = 1.0,
    ) -> None:
        self.app = app
        self._room: WaitingRoom | None = None if isinstance(room, str) else room
        self.room_name = room if isinstance(room, str) else room.name
        if self._room is None and broker is None:
            raise ValueError("RequireAdmission needs a WaitingRoom, or a room name and broker=")
        self._broker: Callable[[], Broker] | None = (
            (lambda: broker) if isinstance(broker, Broker) else broker
        )
        self._secret = secret
        self.paths = tuple(p.rstrip("/") or "/" for p in paths)
        self.methods = None if methods is None else {m.upper() for m in methods}
        if self.methods is not None and "GET" in self.methods:
            # Starlette (like most frameworks) runs a GET endpoint for HEAD: the body is
            # dropped, its side effects are not
            self.methods.add("HEAD")
        self.consume = consume
        self.cookie = cookie
        self.room_page = room_page or f"/rooms/{self.room_name}"
        self.check_interval = check_interval
        self._running = True
        self._checked_at = -float("inf")
        self._lock = asyncio.Lock()

    def guards(self, scope: Scope) -> bool:
        """True if the request is to a guarded path and method.

        ``paths`` are the paths the wrapped application routes, so the request's path is
        matched with its ``root_path`` taken off (a Starlette ``Mount``, ``uvicorn
        --root-path``), as Starlette's router does. Servers disagree on whether
        ``path`` includes ``root_path``, so the path is also matched as it is: when
        either spelling is guarded, the request is guarded (fail closed).
        """
        if self.methods is not None and scope.get("method", "GET") not in self.methods:
            return False
        path: str = scope.get("path", "/")
        return any(self._matches(p) for p in _route_paths(path, scope.get("root_path", "")))

    def _matches(self, path: str) -> bool:
        for prefix in self.paths:
            if prefix == "/" or path == prefix or path.startswith(prefix + "/"):
                return True
        return False

    async def _handle(self) -> WaitingRoom | None:
        if self._room is not None:
            return self._room
        assert self._broker is not None
        try:
            self._room = await self._broker().room(self.room_name, self._secret)
        except RoomNotFound:
            return None
        return self._room

    async def running(self) -> bool:
        """Whether the room's sale runs (read at most once per ``check_interval``)."""
        now = time.monotonic()
        if now - self._checked_at < self.check_interval:
            return self._running
        async with self._lock:
            if time.monotonic() - self._checked_at >= self.check_interval:
                room = await self._handle()
                try:
                    self._running = room is not None and await _sale_running(room)
                except RoomNotFound:  # deleted: no sale; a new room of that name is opened anew
                    self._running = False
                    if self._broker is not None:
                        self._room = None
                self._checked_at = time.monotonic()
        return self._running

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.guards(scope) or not await self.running():
            await self.app(scope, receive, send)
            return
        room = self._room
        assert room is not None
        token = token_of(scope, self.cookie)
        if token is None:
            await self._refuse(
                scope, send, 401, "admission_required", "an admission token is needed"
            )
            return
        try:
            claims = await room.consume(token) if self.consume else room.verify(token)
        except InvalidToken as exc:
            await self._refuse(scope, send, 403, "invalid_token", str(exc))
            return
        scope["fairq.admission"] = claims
        await self.app(scope, receive, send)

    async def _refuse(self, scope: Scope, send: Send, status: int, code: str, detail: str) -> None:
        accept = _header(scope, b"accept") or ""
        if scope.get("method") == "GET" and "text/html" in accept:
            see = [(b"location", self.room_page.encode()), (b"content-length", b"0")]
            await send({"type": "http.response.start", "status": 303, "headers": see})
            await send({"type": "http.response.body", "body": b""})
            return
        body = orjson.dumps(
            {
                "error": code,
                "detail": detail,
                "room": self.room_name,
                "waiting_room": self.room_page,
            }
        )
        challenge = 'Bearer realm="fairq"' + ("" if status == 401 else ', error="invalid_token"')
        headers: list[tuple[bytes, bytes]] = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"www-authenticate", challenge.encode()),
            (b"cache-control", b"no-store"),
        ]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
