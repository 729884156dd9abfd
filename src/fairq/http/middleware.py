"""``IdempotencyMiddleware``: the HTTP ``Idempotency-Key`` header over an idempotency store.

A pure ASGI middleware (no framework imported), for Starlette, FastAPI or any ASGI app:

    from fairq.http import IdempotencyMiddleware
    app.add_middleware(IdempotencyMiddleware, store=broker.idempotency("api", ttl=86_400))

For each ``POST``/``PATCH`` carrying the header (SPEC §7, the IETF draft "The
Idempotency-Key HTTP Header Field", Stripe's behaviour):

* the first request claims the key, runs, and its response is stored — before its last
  byte is sent, so a client holding the whole response always finds it stored;
* a repeat with the same key and the same request (method, path with query, body hash)
  gets the stored response replayed, with ``Idempotent-Replayed: true``;
* the same key with a different request: ``422``; while the first still runs: ``409``
  (with ``Retry-After``); without the header and ``required=True``: ``400``; a malformed
  key: ``400``. Error bodies are ``application/problem+json`` (RFC 9457) with an
  ``error`` code, as the rest of fairq's HTTP API.

Every response the app *returns* is stored, whatever its status: the draft says a retry
gets "the result of the previously completed operation, success or an error", and
Stripe replays "including 500 errors" — the work may have had effects, so running it
again is not safe (``store_response=`` narrows this, e.g. ``lambda s: s < 500``). An
exception escaping the app stores nothing and releases the key, so a retry runs again.

Streamed responses are passed through as they come and stored whole up to
``max_response_bytes``; a larger one is not stored, yet its key is completed (the work
is not run again): a repeat gets ``409`` saying the response was too large to keep.
The request body is read whole before the app runs (its hash is the fingerprint), up to
``max_body`` bytes (25 MiB by default): a larger one is
refused with ``413`` from its ``Content-Length``, or as soon as the bytes read pass the
limit — never buffered whole.

Keys belong to a client. By default a key is scoped by the credentials the request
carries (a hash of its ``Authorization``, ``X-API-Key`` and ``Cookie`` headers), so the
same key sent with other credentials is another key and never replays the first
client's response; ``partition(scope)`` names the owner instead (say, the authenticated
account, which survives a rotated session cookie). ``Set-Cookie`` is never stored nor
replayed: a cookie is for the client it was set for, not for whoever repeats the key.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Awaitable, Callable, Collection, MutableMapping
from typing import Any

import orjson

from ..errors import BackendError, ConnectionError, FairqError, InvalidName, InvalidOption
from ..idempotency import Claim, IdempotencyRecord, IdempotencyStore
from ..message import check_key

__all__ = ["MAX_BODY", "ASGIApp", "IdempotencyMiddleware", "Receive", "Scope", "Send"]

log = logging.getLogger("fairq.http")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

REPLAYED = (b"idempotent-replayed", b"true")
#: the default most bytes of a request body buffered: ``fairq serve``'s default body limit
#: (the largest message, 256 KiB, times the largest batch, 100)
MAX_BODY = 262_144 * 100
# request headers that say who the client is: the default partition of the keys
_CREDENTIALS = (b"authorization", b"x-api-key", b"cookie")
# response headers never stored nor replayed: they belong to the first client only
_NOT_REPLAYED = frozenset({"set-cookie", "set-cookie2"})
# server push extensions whose bodies never pass through ``send``: hidden from the app of
# a claimed request so that its response can be captured
_HIDDEN_EXTENSIONS = ("http.response.pathsend", "http.response.zerocopysend")


def _parse_key(raw: bytes) -> str:
    """The key of an ``Idempotency-Key`` value: an sf-string (``"..."``), or bare."""
    text = raw.decode("latin-1").strip()
    if len(text) >= 2 and text[0] == text[-1] == '"':
        text = text[1:-1]
    return check_key(text, "Idempotency-Key")


def fingerprint(method: str, path: str, query: bytes, body: bytes) -> str:
    """What makes two requests "the same request": method, path with query, body hash."""
    h = hashlib.sha256()
    h.update(method.encode("latin-1"))
    h.update(b"\n")
    h.update(path.encode("utf-8", "surrogateescape"))
    h.update(b"?")
    h.update(query)
    h.update(b"\n")
    h.update(body)
    return h.hexdigest()


def encode_response(status: int, headers: list[list[str]], body: bytes) -> bytes:
    """A stored response: a length-prefixed JSON head, then the body."""
    head = orjson.dumps({"status": status, "headers": headers})
    return len(head).to_bytes(4, "big") + head + body


def encode_not_stored(status: int, size: int) -> bytes:
    """The record of a response too large to keep: its status and size, no body."""
    head = orjson.dumps({"status": status, "not_stored": size})
    return len(head).to_bytes(4, "big") + head


def decode_response(raw: bytes) -> tuple[dict[str, Any], bytes]:
    """The head (status, headers or not_stored) and body of a stored response."""
    n = int.from_bytes(raw[:4], "big")
    head: dict[str, Any] = orjson.loads(raw[4 : 4 + n])
    return head, raw[4 + n :]


class _Capture:
    """The response of a claimed request, as the app sends it."""

    __slots__ = ("body", "headers", "limit", "size", "status")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.status = 0
        self.headers: list[list[str]] = []
        self.body: list[bytes] | None = []  # None: over the limit, no longer kept
        self.size = 0

    def start(self, message: Message) -> None:
        self.status = int(message["status"])
        self.headers = [
            [name, bytes(v).decode("latin-1")]
            for k, v in message.get("headers", ())
            if (name := bytes(k).decode("latin-1")).lower() not in _NOT_REPLAYED
        ]

    def chunk(self, data: bytes) -> None:
        self.size += len(data)
        if self.body is not None:
            if self.size > self.limit:
                self.body = None
            elif data:
                self.body.append(bytes(data))

    def stored(self) -> bytes:
        if self.body is None:
            return encode_not_stored(self.status, self.size)
        return encode_response(self.status, self.headers, b"".join(self.body))


class IdempotencyMiddleware:
    """Honours the ``Idempotency-Key`` request header; see the module docstring.

    ``store`` is an :class:`~fairq.IdempotencyStore` — or a function returning one, called
    at the first request, for apps whose broker is connected at start-up. Keys are
    1-100 characters from ``A-Z a-z 0-9 _ . : -`` (a UUID fits), kept for the store's
    ``ttl``. ``methods`` are the methods the header applies to (others pass through);
    ``lease`` is how long a crashed server's claim blocks its key (a running request keeps
    extending it); ``partition(scope)`` names whose key it is (say, the authenticated
    account), so that one client can never replay another's response with a guessed key
    — by default, and when it returns None, the hash of the request's credentials
    (``Authorization``, ``X-API-Key``, ``Cookie``; requests with none share one space).
    ``max_body``: the largest request body read (``413`` beyond; default 25 MiB).
    ``docs_url`` is linked from error answers (problem ``type`` and a
    ``Link`` header).
    """

    def __init__(
        self,
        app: ASGIApp,
        store: IdempotencyStore | Callable[[], IdempotencyStore],
        header: str = "Idempotency-Key",
        required: bool = False,
        *,
        methods: Collection[str] = ("POST", "PATCH"),
        lease: float = 60.0,
        max_response_bytes: int = 1_048_576,
        store_response: Callable[[int], bool] | None = None,
        partition: Callable[[Scope], str | None] | None = None,
        max_body: int = MAX_BODY,
        docs_url: str | None = None,
    ) -> None:
        if not isinstance(store, IdempotencyStore) and not callable(store):
            raise InvalidOption(
                f"store must be an IdempotencyStore or a function returning one, got {store!r}"
            )
        if not isinstance(header, str) or not header.strip():
            raise InvalidOption(f"header must be a header name, got {header!r}")
        if (
            isinstance(max_response_bytes, bool)
            or not isinstance(max_response_bytes, int)
            or max_response_bytes < 0
        ):
            raise InvalidOption(
                f"max_response_bytes must be an integer >= 0, got {max_response_bytes!r}"
            )
        if isinstance(max_body, bool) or not isinstance(max_body, int) or max_body < 0:
            raise InvalidOption(f"max_body must be an integer >= 0, got {max_body!r}")
        if isinstance(lease, bool) or not isinstance(lease, int | float) or not lease > 0:
            raise InvalidOption(f"lease must be a number of seconds > 0, got {lease!r}")
        self.app = app
        self._store = store if isinstance(store, IdempotencyStore) else None
        self._make_store = None if isinstance(store, IdempotencyStore) else store
        self.header = header
        self._header = header.strip().lower().encode("latin-1")
        self.required = required
        self.methods = frozenset(m.upper() for m in methods)
        self.lease = float(lease)
        self.max_response_bytes = max_response_bytes
        self.store_response = store_response
        self.partition = partition
        self.max_body = max_body
        self.docs_url = docs_url

    @property
    def store(self) -> IdempotencyStore:
        """The idempotency store (resolved at first use when given as a function)."""
        if self._store is None:
            assert self._make_store is not None
            store = self._make_store()
            if not isinstance(store, IdempotencyStore):
                raise InvalidOption(f"the store function returned {store!r}, not a store")
            self._store = store
        return self._store

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in self.methods:
            await self.app(scope, receive, send)
            return
        name = self._header
        values = [v for k, v in scope["headers"] if k == name]
        if not values:
            if self.required:
                await self._problem(
                    send,
                    400,
                    "idempotency_key_missing",
                    f"{self.header} is missing",
                    f"{scope['method']} requests here need an {self.header} header: a "
                    "unique value per operation, such as a UUID, repeated on every retry",
                )
                return
            await self.app(scope, receive, send)
            return
        if len(values) > 1:
            await self._problem(
                send,
                400,
                "idempotency_key_invalid",
                f"{self.header} is invalid",
                f"a request must not carry more than one {self.header} header",
            )
            return
        try:
            key = _parse_key(values[0])
        except InvalidName as exc:
            await self._problem(
                send, 400, "idempotency_key_invalid", f"{self.header} is invalid", str(exc)
            )
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_body:
            await self._too_large(send, f"{declared} bytes")
            return
        body = await _read_body(receive, self.max_body)
        if body is None:
            return  # the client left before its request was complete: nothing to run
        if body is _TOO_LARGE:
            await self._too_large(send, "more")
            return
        assert isinstance(body, bytes)
        owner = self.partition(scope) if self.partition is not None else None
        if owner is not None:
            key = "p:" + hashlib.sha256(f"{owner}\0{key}".encode()).hexdigest()
        else:
            credentials = _credentials(scope)
            if credentials is not None:
                key = "c:" + hashlib.sha256(credentials + b"\0" + key.encode()).hexdigest()
        fp = fingerprint(scope["method"], scope["path"], scope.get("query_string", b""), body)
        try:
            got = await self.store.try_claim(key, self.lease, fingerprint=fp)
        except (ConnectionError, BackendError) as exc:  # the key's store is away: retry
            await self._problem(
                send,
                503,
                "backend_unavailable",
                f"{self.header} cannot be checked now",
                f"the store of idempotency keys did not answer ({exc}); nothing was done: "
                "retry with the same key",
                [(b"retry-after", b"1")],
            )
            return
        if isinstance(got, Claim):
            await self._run(got, scope, body, receive, send)
        else:
            await self._answer_repeat(got, fp, send)

    # -- the first request ---------------------------------------------------------------
    async def _run(
        self, claim: Claim, scope: Scope, body: bytes, receive: Receive, send: Send
    ) -> None:
        extensions = scope.get("extensions")
        if extensions and any(e in extensions for e in _HIDDEN_EXTENSIONS):
            scope = dict(scope)
            scope["extensions"] = {
                k: v for k, v in extensions.items() if k not in _HIDDEN_EXTENSIONS
            }
        given = False

        async def replay_body() -> Message:
            nonlocal given
            if not given:
                given = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: wait for the disconnect as usual

        capture = _Capture(self.max_response_bytes)
        done = False

        async def capture_send(message: Message) -> None:
            nonlocal done
            kind = message["type"]
            if kind == "http.response.start":
                capture.start(message)
            elif kind == "http.response.body":
                capture.chunk(message.get("body", b""))
                if not message.get("more_body", False):
                    done = True
                    await self._settle(claim, capture)  # before the last byte goes out
            await send(message)

        claim.keep_alive()
        try:
            await self.app(scope, replay_body, capture_send)
        except BaseException:
            if not claim.settled:
                await asyncio.shield(claim.release())
            raise
        finally:
            claim.stop_keeping()
        if not done and not claim.settled:
            await claim.release()  # the app returned without a whole response

    async def _settle(self, claim: Claim, capture: _Capture) -> None:
        """Store the finished response (or release the key when it is not to be kept)."""
        try:
            if self.store_response is not None and not self.store_response(capture.status):
                await claim.release()
            else:
                if capture.body is None:
                    log.info(
                        "response to key %r is %d bytes, over max_response_bytes=%d: not stored",
                        claim.key,
                        capture.size,
                        self.max_response_bytes,
                    )
                await claim.complete(capture.stored())
        except FairqError as exc:  # the response still goes out; the key expires with its lease
            log.warning("could not store the response to key %r: %s", claim.key, exc)

    # -- repeats -------------------------------------------------------------------------
    async def _answer_repeat(self, record: IdempotencyRecord, fp: str, send: Send) -> None:
        if record.fingerprint != fp:
            await self._problem(
                send,
                422,
                "idempotency_key_reused",
                f"{self.header} is already used",
                f"this {self.header} was used for a different request (method, path or "
                "body); use a new key for a new operation",
            )
            return
        if record.running:
            await self._problem(
                send,
                409,
                "idempotency_key_in_use",
                f"A request is outstanding for this {self.header}",
                f"a request with this {self.header} is still being processed; retry later",
                [(b"retry-after", b"1")],
            )
            return
        raw = record.result
        if not isinstance(raw, bytes):  # completed through the store API, not by this class
            await self._problem(
                send,
                422,
                "idempotency_key_reused",
                f"{self.header} is already used",
                f"this {self.header} was used outside this API",
            )
            return
        head, content = decode_response(raw)
        if "not_stored" in head:
            await self._problem(
                send,
                409,
                "idempotency_response_not_stored",
                "The response of this request was not kept",
                f"the request with this {self.header} completed with status "
                f"{head['status']}, but its {head['not_stored']}-byte response was too large "
                "to keep; it will not run again — read the result from its resource instead",
            )
            return
        headers = [
            (k.encode("latin-1"), v.encode("latin-1"))
            for k, v in head["headers"]
            if k.lower() not in _NOT_REPLAYED  # kept by a version that stored them
        ]
        headers.append(REPLAYED)
        await send({"type": "http.response.start", "status": head["status"], "headers": headers})
        await send({"type": "http.response.body", "body": content, "more_body": False})

    async def _too_large(self, send: Send, size: str) -> None:
        await self._problem(
            send,
            413,
            "body_too_large",
            "The request body is too large",
            f"the request body is {size}; requests with an {self.header} may carry at most "
            f"{self.max_body} bytes",
            [(b"connection", b"close")],  # the rest of the body is never read
        )

    async def _problem(
        self,
        send: Send,
        status: int,
        code: str,
        title: str,
        detail: str,
        extra: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        body = orjson.dumps(
            {
                "type": self.docs_url or "about:blank",
                "title": title,
                "status": status,
                "detail": detail,
                "error": code,
            }
        )
        headers = [
            (b"content-type", b"application/problem+json"),
            (b"content-length", str(len(body)).encode()),
            *(extra or ()),
        ]
        if self.docs_url:
            headers.append((b"link", f'<{self.docs_url}>; rel="describedby"'.encode("latin-1")))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})


_TOO_LARGE = object()


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _credentials(scope: Scope) -> bytes | None:
    """A digest of the credentials a request carries (None: it carries none)."""
    found = [(k, bytes(v)) for k, v in scope.get("headers", ()) if k in _CREDENTIALS]
    if not found:
        return None
    h = hashlib.sha256()
    for name, value in sorted(found):
        h.update(name + b":" + value + b"\n")
    return h.digest()


async def _read_body(receive: Receive, limit: int) -> bytes | object | None:
    """The whole request body; None if the client disconnected first; ``_TOO_LARGE`` as
    soon as more than ``limit`` bytes have come (the rest is not read)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        kind = message["type"]
        if kind == "http.disconnect":
            return None
        if kind == "http.request":
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                return _TOO_LARGE
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)
