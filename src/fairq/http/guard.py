"""What a browser may make ``fairq serve`` do on a page's behalf: the ``Host`` and
``Origin`` checks (pure ASGI, in front of every route).

A server on loopback is not out of the web's reach: every page its user visits runs in
a browser that can reach ``127.0.0.1``. Two attacks need no key at all on an open server,
and the second one works against any server whose credentials a browser holds:

* **DNS rebinding.** A page on ``attacker.example`` makes its own name resolve to
  127.0.0.1, and is then same-origin with the server: it can read, peek and delete
  everything. Its requests still carry ``Host: attacker.example``, so a server that
  answers only to names it knows is out of reach. Without API keys (the open, loopback
  server) only the loopback names — ``localhost``, ``127.0.0.1`` (all of 127/8),
  ``[::1]`` — and the names given with ``--allowed-host`` / ``FAIRQ_ALLOWED_HOSTS`` are
  answered; other ``Host`` values get ``400 host_not_allowed``. With keys, names are
  checked only when some are given.
* **Cross-site "simple" requests** (CSRF). Any page may ``POST`` to any address with a
  form's content type or ``text/plain`` — no CORS preflight is asked for, the response
  is unreadable, but the request has done its work: purge, send, ack, redrive. A
  state-changing request (any method but ``GET``, ``HEAD``, ``OPTIONS``) that a browser
  marks as coming from another site — ``Sec-Fetch-Site: cross-site`` or ``same-site``,
  else an ``Origin`` that is not the request's own ``Host`` (or ``null``) — is refused
  with ``403 cross_site_request`` unless its body is JSON (``application/json`` or
  ``*+json``): a browser sends a cross-site JSON request only after a CORS preflight,
  which this server never grants. Requests without those headers (curl, SDKs,
  ``fairq.http.Client``) and the dashboard's own same-origin calls are not affected.

Paths under ``exempt`` (the waiting rooms' public pages, which carry no authority: fans
hold no key) skip the ``Origin`` check; the ``Host`` check applies everywhere.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import orjson

from .auth import is_loopback
from .middleware import ASGIApp, Receive, Scope, Send

__all__ = ["SAFE_METHODS", "BrowserGuard", "HostPolicy", "is_json", "split_host"]

#: methods that change nothing, which the Origin check lets through
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_FOREIGN_FETCH = frozenset({"cross-site", "same-site"})


def split_host(value: str) -> tuple[str, str | None]:
    """``(name, port)`` of a ``Host`` header value (or an allowed-host entry): lower case,
    without a trailing dot, an IPv6 address with its brackets."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return value, None
        name, rest = value[: end + 1], value[end + 1 :]
        port = rest[1:] if rest.startswith(":") else None
    else:
        name, sep, port_text = value.rpartition(":")
        if not sep:
            name, port_text = value, ""
        port = port_text or None
    return name.rstrip("."), port


class HostPolicy:
    """Which ``Host`` names a server answers to: the loopback names, and ``allowed``
    (``name`` for any port, ``name:port`` for one; ``*``: any host at all)."""

    def __init__(self, allowed: Iterable[str] = ()) -> None:
        self.any = False
        self.names: set[str] = set()
        self.pairs: set[tuple[str, str]] = set()
        for entry in allowed:
            entry = entry.strip()
            if not entry:
                continue
            if entry == "*":
                self.any = True
                continue
            name, port = split_host(entry)
            if port is None:
                self.names.add(name)
            else:
                self.pairs.add((name, port))

    def allows(self, host: str | None) -> bool:
        """True if a request with this ``Host`` header is answered (no header: no)."""
        if self.any:
            return True
        if not host:
            return False
        name, port = split_host(host)
        if port is not None and not port.isdigit():
            return False  # "127.0.0.1:80@evil.example" names no port of ours
        if is_loopback(name):
            return True
        return name in self.names or (port is not None and (name, port) in self.pairs)


def is_json(content_type: str | None) -> bool:
    """True for ``application/json`` and ``application/*+json`` (parameters ignored)."""
    if not content_type:
        return False
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )


def _foreign(headers: dict[bytes, str], host: str | None) -> bool:
    """True if a browser says the request comes from another site."""
    fetch_site = headers.get(b"sec-fetch-site")
    if fetch_site is not None:
        # the browser's own verdict, immune to proxies that rewrite Host
        return fetch_site.strip().lower() in _FOREIGN_FETCH
    origin = headers.get(b"origin")
    if origin is None:
        return False  # not a browser, or a same-origin GET-like navigation
    origin = origin.strip().lower()
    if origin == "null" or "://" not in origin:
        return True  # sandboxed frames, file: pages, data: URLs
    netloc = origin.split("://", 1)[1].split("/", 1)[0]
    return host is None or netloc != host.strip().lower()


class BrowserGuard:
    """Refuse requests a browser was tricked into sending (see the module docstring).

    ``hosts``: the ``Host`` policy, None to answer any name; ``exempt``: path prefixes
    without the ``Origin`` check.
    """

    def __init__(
        self, app: ASGIApp, hosts: HostPolicy | None = None, exempt: Sequence[str] = ()
    ) -> None:
        self.app = app
        self.hosts = hosts
        self.exempt = tuple(p.rstrip("/") + "/" for p in exempt)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = {bytes(k): bytes(v).decode("latin-1") for k, v in scope.get("headers", ())}
        host = headers.get(b"host")
        if self.hosts is not None and not self.hosts.allows(host):
            await _refuse(
                scope,
                send,
                400,
                "host_not_allowed",
                f"this server does not answer to the host name {host!r}: without API keys it "
                "answers only to localhost, 127.0.0.1 and [::1] (a page rebinding its own "
                "name to this address must not reach it); add names with --allowed-host "
                "or FAIRQ_ALLOWED_HOSTS",
            )
            return
        if (
            scope["type"] == "http"
            and scope["method"] not in SAFE_METHODS
            and not self._exempt(scope)
            and _foreign(headers, host)
            and not is_json(headers.get(b"content-type"))
        ):
            await _refuse(
                scope,
                send,
                403,
                "cross_site_request",
                f"a {scope['method']} from another site without a JSON body is refused: a "
                "browser sends those on any page's behalf without asking this server. Send "
                "Content-Type: application/json (scripts and SDKs send no Origin at all)",
            )
            return
        await self.app(scope, receive, send)

    def _exempt(self, scope: Scope) -> bool:
        path: str = scope.get("path", "/")
        root: str = scope.get("root_path", "")
        if root and path.startswith(root + "/"):
            path = path[len(root) :]
        return any(path.startswith(prefix) for prefix in self.exempt)


async def _refuse(scope: Scope, send: Send, status: int, code: str, detail: str) -> None:
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 1008})
        return
    body = orjson.dumps({"error": code, "detail": detail})
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
