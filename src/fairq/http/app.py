"""The Starlette app of ``fairq serve``: the REST API, ``/openapi.json``, ``/metrics``,
``/healthz``, the dashboard and its login.

    from fairq.http.app import create_app
    app = create_app(url="sqlite:///fairq.db")          # or create_app(broker)
    # uvicorn.run(app, host="127.0.0.1", port=8040)  — or: fairq serve

Around the routes, three pure-ASGI layers: :class:`~fairq.http.metrics.RequestTimer`
(latency histogram), :class:`~fairq.http.guard.BrowserGuard` (the ``Host`` check against
DNS rebinding, the ``Origin`` check against cross-site requests) and :class:`BodyLimit`
(a body over the limit is refused with 413 from its ``Content-Length``, or as soon as the
bytes read pass the limit — never read whole). Every route of
:data:`fairq.http.api.ROUTES` goes through :func:`endpoint`, which authenticates, checks
the scope, bounds the JSON's nesting, decodes the body and query with the route's models,
holds a slot of the waiting cap for streams and long polls, and turns every error into
``{"error": code, "detail": text}``.

The lifespan connects the broker (unless one is given), runs the stats sampler and,
with ``workers=True``, push-subscription deliveries (``Worker.push()``), the attention
reconciler of every domain and the admitter of every waiting room.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import msgspec
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from ..broker import Broker, connect
from ..errors import FairqError
from . import api
from . import models as m
from .api_idempotency import IdempotentCall
from .api_rooms import run_admitters
from .auth import COOKIE, KeyRing, Principal, require
from .errors import ApiError, carried, error_for
from .guard import BrowserGuard, HostPolicy
from .metrics import Metrics, RequestTimer
from .middleware import Receive, Scope, Send
from .nesting import MAX_DEPTH, too_deep
from .openapi import openapi
from .sampler import Sampler
from .session import SESSION_TTL, Sessions
from .waiting import (
    MAX_WAITING,
    ClientGone,
    Holding,
    ShuttingDown,
    WaitSlots,
    disconnected,
    may_wait,
    waits,
)

__all__ = ["BodyLimit", "create_app", "error_response"]

log = logging.getLogger("fairq.http")
DASHBOARD = Path(__file__).parent / "dashboard"
ROOMS_PREFIX = "/rooms"  # the waiting rooms' public routes (fans hold no key)
_SAFE = ("GET", "HEAD", "OPTIONS")
_TOO_DEEP = f"the body nests arrays and objects more than {MAX_DEPTH} levels deep"


def error_response(
    status: int, code: str, detail: str, headers: Any = None, fields: Any = None
) -> Response:
    """The JSON error answer every failure gets (``fields``: of ``errors.carried``)."""
    return Response(
        m.encode(m.Error(code, detail, **(fields or {}))),
        status_code=status,
        media_type="application/json",
        headers=headers,
    )


def _state(request: Request) -> api.ServerState:
    state: api.ServerState = request.app.state.fairq
    return state


def endpoint(
    route: api.Route,
    keys: KeyRing,
    sessions: Sessions | None = None,
    waiting: WaitSlots | None = None,
) -> Callable[[Request], Awaitable[Response]]:
    """The Starlette endpoint of one API route (``sessions``: the dashboard's;
    ``waiting``: the server's cap on streams, long polls and blocked sends)."""
    capped = waiting is not None and may_wait(route.stream, route.body)
    body_type = route.body
    body_required = body_type is not None and any(
        f.required for f in msgspec.structs.fields(body_type)
    )
    decoder: msgspec.json.Decoder[Any] | None = (
        msgspec.json.Decoder(body_type) if body_type is not None else None
    )

    async def handle(request: Request) -> Response:
        request.scope["fairq.route"] = route.path
        if route.stream:
            request.scope["fairq.stream"] = True
        try:
            principal: Principal | None
            if route.scope != "public":
                principal = keys.authenticate(request.headers, request.cookies, sessions)
                require(principal, route.scope)
                _check_cookie_request(request, keys)
                if route.idempotent and IdempotentCall.wanted(request):
                    return IdempotentCall(request, principal.label, handle)
            else:  # who it is decides only what a public route shows
                try:
                    principal = keys.authenticate(request.headers, request.cookies, sessions)
                except ApiError:
                    principal = None
            call = api.Call(request, _state(request), dict(request.path_params))
            call.principal = principal
            if decoder is not None:
                raw = await request.body()
                if too_deep(raw):
                    raise ApiError(400, "bad_request", _TOO_DEEP)
                if not raw.strip():
                    if body_required:
                        raise ApiError(422, "validation_error", "this operation needs a JSON body")
                    raw = b"{}"
                try:
                    call.body = decoder.decode(raw)
                except msgspec.ValidationError:
                    # JSON Schema counts 14.0 as an integer; msgspec does not: convert such
                    # numbers (outside message bodies) and check again
                    call.body = msgspec.convert(_integral(msgspec.json.decode(raw)), body_type)
            if route.query is not None:
                params = request.query_params
                items = params.multi_items()
                if len(items) != len(params):  # (every parameter takes one value)
                    twice = sorted({k for k, _ in items if len(params.getlist(k)) > 1})
                    raise ApiError(
                        422, "validation_error", f"query parameter given more than once: {twice}"
                    )
                call.query = msgspec.convert(dict(params), route.query, strict=False)
            if capped and waits(route.stream, call.body):
                assert waiting is not None
                if not waiting.take():
                    return error_response(
                        503,
                        "server_busy",
                        f"{waiting.limit} requests already wait here (streams, long polls, "
                        "blocked sends): retry shortly",
                        {"Retry-After": "1"},
                    )
                call.gone = asyncio.Event()
                left = None if route.stream else disconnected(request.receive)
                try:
                    result = await waiting.run(route.handler(call), call.gone, left)
                except ClientGone:
                    waiting.give()
                    # nobody reads this answer: the work ended having done nothing
                    return error_response(499, "client_gone", "the client closed the request")
                except ShuttingDown:
                    waiting.give()
                    return error_response(
                        503,
                        "shutting_down",
                        "the server is shutting down; nothing was received or stored by "
                        "this request: retry",
                        {"Retry-After": "1"},
                    )
                except BaseException:
                    waiting.give()
                    raise
                if isinstance(result, Response) and route.stream:
                    return Holding(result, waiting.give)  # held while the stream lasts
                waiting.give()
            else:
                result = await route.handler(call)
        except msgspec.ValidationError as exc:
            return error_response(422, "validation_error", str(exc))
        except msgspec.DecodeError as exc:
            return error_response(400, "bad_request", f"the body is not valid JSON: {exc}")
        except ApiError as exc:
            return error_response(exc.status, exc.code, exc.detail)
        except FairqError as exc:
            status, code = error_for(exc)
            if status >= 500:
                log.error("%s %s failed: %s", request.method, request.url.path, exc)
            headers = {"Retry-After": "1"} if status == 429 else None
            return error_response(status, code, str(exc), headers, carried(exc))
        if isinstance(result, Response):
            return result
        if result is None:
            return Response(status_code=204)
        return Response(m.encode(result), status_code=route.status, media_type="application/json")

    return handle


def _integral(value: Any) -> Any:
    """``value`` with every float that is a whole number made an int, except inside
    message bodies (``"body"`` keys), which are the user's data."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
        return int(value)
    if isinstance(value, list):
        return [_integral(v) for v in value]
    if isinstance(value, dict):
        return {k: v if k == "body" else _integral(v) for k, v in value.items()}
    return value


def _check_cookie_request(request: Request, keys: KeyRing) -> None:
    """A state-changing request authenticated only by the dashboard's cookie must say
    it comes from the dashboard (a header a cross-site form cannot set)."""
    if (
        keys.enabled
        and request.method not in _SAFE
        and "authorization" not in request.headers
        and "x-api-key" not in request.headers
        and request.headers.get("x-fairq-dashboard") != "1"
    ):
        raise ApiError(403, "forbidden", "cookie-authenticated changes need X-Fairq-Dashboard: 1")


class _TooLarge(Exception):
    pass


class BodyLimit:
    """Refuse request bodies over ``limit()`` bytes with 413, without reading them whole."""

    def __init__(self, app: Any, limit: Callable[[], int]) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit()
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = 0
                if declared > limit:
                    await _refuse(send, limit, declared)
                    return
        seen = 0
        started = False

        async def limited_receive() -> Any:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise _TooLarge
            return message

        async def tracking_send(message: Any) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _TooLarge:
            if started:
                raise
            await _refuse(send, limit, None)


async def _refuse(send: Send, limit: int, declared: int | None) -> None:
    size = f"{declared} bytes" if declared is not None else f"over {limit} bytes"
    body = m.encode(
        m.Error(
            "body_too_large",
            f"the request body is {size}; the limit is {limit} bytes (the server's --max-body)",
        )
    )
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


# -- dashboard and login -------------------------------------------------------------------
def _is_admin(request: Request, keys: KeyRing, sessions: Sessions) -> bool:
    if not keys.enabled:
        return True
    return sessions.verify(request.cookies.get(COOKIE), keys) is not None


def dashboard_routes(keys: KeyRing, sessions: Sessions) -> list[BaseRoute]:
    """The dashboard's page, its login and logout (a signed session cookie,
    :mod:`fairq.http.session`), and ``/openapi.json``."""

    async def index(request: Request) -> Response:
        request.scope["fairq.route"] = "/"
        if not _is_admin(request, keys, sessions):
            return RedirectResponse("/login", status_code=303)
        return FileResponse(DASHBOARD / "index.html", headers={"Cache-Control": "no-store"})

    async def login_page(request: Request) -> Response:
        if not keys.enabled:
            return RedirectResponse("/", status_code=303)
        return FileResponse(DASHBOARD / "login.html")

    async def login(request: Request) -> Response:
        form = parse_qs((await request.body()).decode("utf-8", "replace"))
        key = keys.find((form.get("key") or [""])[0].strip())
        if key is None or "admin" not in key.scopes:
            return RedirectResponse("/login?failed=1", status_code=303)
        response = RedirectResponse("/", status_code=303)
        response.set_cookie(
            COOKIE,
            sessions.issue(key),  # never the key itself: a stolen cookie must not be one
            max_age=int(sessions.ttl),
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
            path="/",
        )
        return response

    async def logout(request: Request) -> Response:
        sessions.revoke(request.cookies.get(COOKIE))
        response = RedirectResponse("/login" if keys.enabled else "/", status_code=303)
        response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
        return response

    async def spec(request: Request) -> Response:
        state = _state(request)
        doc = openapi(state.limits, auth=keys.enabled)
        return Response(msgspec.json.encode(doc), media_type="application/json")

    return [
        Route("/", index, methods=["GET"]),
        Route("/login", login_page, methods=["GET"]),
        Route("/login", login, methods=["POST"]),
        Route("/logout", logout, methods=["POST"]),
        Route("/openapi.json", spec, methods=["GET"]),
        Mount("/static", StaticFiles(directory=DASHBOARD), name="static"),
    ]


# -- the app -------------------------------------------------------------------------------
def _room_routes(secrets: Mapping[str, bytes]) -> list[BaseRoute]:
    """The waiting rooms' pages and JSON (:mod:`fairq.http.rooms`, public: fans hold no
    API key), when the ``room`` extra is installed; ``secrets`` as ``rooms_routes``'s."""
    try:
        from .rooms import rooms_routes
    except ImportError:  # pragma: no cover - depends on the install
        return []
    return rooms_routes(
        lambda request: _state(request).broker, secrets=secrets, prefix=ROOMS_PREFIX
    )


def _dispatch(
    handlers: dict[str, Callable[[Request], Awaitable[Response]]],
) -> Callable[[Request], Awaitable[Response]]:
    if len(handlers) == 1:
        return next(iter(handlers.values()))
    if "GET" in handlers:
        handlers = {**handlers, "HEAD": handlers["GET"]}

    async def by_method(request: Request) -> Response:
        return await handlers[request.method](request)

    return by_method


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    codes = {404: "not_found", 405: "method_not_allowed", 400: "bad_request"}
    return error_response(
        exc.status_code, codes.get(exc.status_code, "error"), str(exc.detail), exc.headers
    )


async def _reconcile(broker: Broker, interval: float) -> None:
    """The attention reconciler of every domain (SPEC §5 rule 7), every ``interval``."""
    while True:
        await asyncio.sleep(interval)
        try:
            for domain in await broker.list_attention():
                n = await broker.attention(domain).reconcile()
                if n:
                    log.info("reconciler signalled %d key(s) of %s", n, domain)
        except FairqError as exc:
            log.warning("reconciling attention domains failed: %s", exc)


def create_app(
    broker: Broker | None = None,
    *,
    url: str | None = None,
    keys: KeyRing | None = None,
    limits: api.Limits | None = None,
    sample_interval: float = 2.0,
    history: float = 900.0,
    rate_window: float = 30.0,
    max_sampled_queues: int = 1000,
    workers: bool = False,
    reconcile_interval: float = 30.0,
    push_concurrency: int = 8,
    allowed_hosts: Iterable[str] | None = None,
    session_secret: bytes | str | None = None,
    session_ttl: float = SESSION_TTL,
    max_waiting: int = MAX_WAITING,
    room_secrets: Mapping[str, bytes] | None = None,
) -> Starlette:
    """The app serving ``broker`` (or a broker it connects to ``url`` at start-up and
    closes at shutdown). ``keys`` None or empty: no authentication (keep it on
    loopback). ``workers``: also deliver push subscriptions and reconcile attention
    domains in this process.

    ``allowed_hosts``: the ``Host`` names answered besides the loopback ones (``name`` or
    ``name:port``; ``"*"``: any). Without keys only those are answered, against DNS
    rebinding; with keys any name is, unless some are given (:mod:`fairq.http.guard`).
    ``session_secret`` signs the dashboard's session cookies (None: drawn at start, so a
    restart ends every session), which last ``session_ttl`` seconds. ``max_waiting``: the
    most streams, long polls and blocked sends at once (:mod:`fairq.http.waiting`).
    ``room_secrets``: room name (or ``"*"``) → the ``secret=`` a room was made with, so
    that its pages can be served.
    """
    keys = keys or KeyRing()
    sessions = Sessions(session_secret, session_ttl)
    waiting = WaitSlots(max_waiting)
    hosts = list(allowed_hosts or ())
    host_policy = HostPolicy(hosts) if hosts or not keys.enabled else None
    limits = limits or api.Limits()
    metrics = Metrics()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        b = broker if broker is not None else await connect(url)
        sampler = Sampler(b, sample_interval, history, rate_window, max_sampled_queues)
        app.state.fairq = api.ServerState(
            b, limits, sampler, metrics, keys.enabled, dict(room_secrets or {})
        )
        tasks = [asyncio.create_task(sampler.run(), name="fairq-sampler")]
        worker = None
        if workers:
            from ..worker import Worker

            worker = Worker(b, handle_signals=False, grace=5.0)
            worker.push(concurrency=push_concurrency)
            tasks.append(asyncio.create_task(worker.run(), name="fairq-push"))
            tasks.append(
                asyncio.create_task(_reconcile(b, reconcile_interval), name="fairq-reconcile")
            )
            tasks.append(asyncio.create_task(run_admitters(b), name="fairq-admitters"))
        try:
            yield
        finally:
            if worker is not None:
                worker.stop()
            for task in tasks:
                if task.get_name() != "fairq-push":
                    task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            if broker is None:
                await b.close()

    by_path: dict[str, dict[str, Callable[[Request], Awaitable[Response]]]] = {}
    for r in api.ROUTES:
        by_path.setdefault(r.path, {})[r.method] = endpoint(r, keys, sessions, waiting)
    # one Starlette route per path, so a 405 lists every method of the path in Allow
    routes: list[BaseRoute] = [
        Route(path, _dispatch(handlers), methods=list(handlers))
        for path, handlers in by_path.items()
    ]
    routes += dashboard_routes(keys, sessions)
    routes += _room_routes(room_secrets or {})
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={HTTPException: _http_error},
    )

    def body_limit() -> int:
        state: api.ServerState | None = getattr(app.state, "fairq", None)
        size = state.broker.max_message_bytes if state is not None else 262_144
        return limits.body_limit(size)

    app.add_middleware(BodyLimit, limit=body_limit)
    # outside the body limit: a refused request is never read
    app.add_middleware(BrowserGuard, hosts=host_policy, exempt=[ROOMS_PREFIX])
    app.add_middleware(RequestTimer, metrics=metrics)
    app.state.stop_waiting = waiting.close  # serve() calls it when a stop signal comes
    return app
