"""``fairq serve``: run the app under uvicorn (the CLI's ``serve`` command calls
:func:`serve`).

API keys come from ``FAIRQ_API_KEYS`` (see :mod:`fairq.http.auth`); without keys the
server refuses any address but loopback, and says why, and answers only to loopback
``Host`` names and ``allowed_hosts`` (:mod:`fairq.http.guard`).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import errno
import logging
import re
import socket
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidOption
from ..message import check_name
from .api import Limits
from .auth import KeyRing, check_bind
from .session import SESSION_TTL, Sessions
from .waiting import MAX_WAITING, WaitSlots

__all__ = ["ServeOptions", "listen", "parse_hosts", "parse_room_secrets", "serve"]

log = logging.getLogger("fairq.http")


@dataclass(frozen=True, slots=True)
class ServeOptions:
    """What ``fairq serve`` was asked for."""

    url: str | None = None
    host: str = "127.0.0.1"
    port: int = 8040
    workers: bool = False
    api_keys: str | None = None
    max_body: int | None = None
    max_batch: int = 100
    max_wait: float = 20.0
    sample_interval: float = 2.0
    #: the most queues sampled for the dashboard and given series in /metrics
    max_queues: int = 1000
    reconcile_interval: float = 30.0
    log_level: str = "info"
    access_log: bool = False
    #: ``Host`` names answered besides the loopback ones (``FAIRQ_ALLOWED_HOSTS``)
    allowed_hosts: tuple[str, ...] = ()
    #: whose ``X-Forwarded-For``/``-Proto`` to believe (uvicorn's default: 127.0.0.1)
    forwarded_allow_ips: str | None = None
    #: signs the dashboard's sessions (``FAIRQ_SESSION_SECRET``; None: drawn at start)
    session_secret: str | None = None
    session_ttl: float = SESSION_TTL
    #: the most streams, long polls and blocked sends at once
    max_waiting: int = MAX_WAITING
    #: ``FAIRQ_ROOM_SECRETS``: the secrets of rooms made with ``secret=``
    room_secrets: str | None = None


def parse_hosts(text: str | None) -> tuple[str, ...]:
    """The host names of ``FAIRQ_ALLOWED_HOSTS``: separated by commas or white space."""
    return tuple(h for h in re.split(r"[,\s]+", text or "") if h)


def _secret_bytes(text: str) -> bytes | None:
    """The 32 bytes a secret spells: 64 hex digits, base64 (standard or URL-safe, padding
    optional), or 32 bytes of text as ``secret=`` takes a str — none of them ambiguous."""
    if len(text) == 64:
        with contextlib.suppress(ValueError):
            return bytes.fromhex(text)
    if len(text) in (43, 44):
        standard = text.replace("-", "+").replace("_", "/")
        with contextlib.suppress(ValueError, binascii.Error):
            raw = base64.b64decode(standard + "=" * (-len(standard) % 4), validate=True)
            if len(raw) == 32:
                return raw
    raw = text.encode()
    return raw if len(raw) == 32 else None


def parse_room_secrets(text: str | None) -> dict[str, bytes]:
    """The ``FAIRQ_ROOM_SECRETS`` format: entries separated by commas or newlines, each
    ``ROOM=SECRET`` (``*=SECRET``: every room made with a secret and not named); SECRET as
    ``_secret_bytes`` reads it. ``InvalidOption`` names a bad entry, never its secret."""
    out: dict[str, bytes] = {}
    for n, raw in enumerate(re.split(r"[,\n]", text or ""), 1):
        entry = raw.strip()
        if not entry:
            continue
        room, sep, secret_text = entry.partition("=")
        room = room.strip()
        if not sep or not room:  # the entry itself is not shown: it may hold a secret
            raise InvalidOption(f"FAIRQ_ROOM_SECRETS: entry {n} is not ROOM=SECRET")
        if room != "*":
            check_name(room, "waiting room")
        secret = _secret_bytes(secret_text.strip())
        if secret is None:
            raise InvalidOption(
                f"FAIRQ_ROOM_SECRETS: the secret of {room!r} must be 32 bytes: 64 hex "
                "digits, base64 of 32 bytes, or 32 characters of text"
            )
        if room in out:
            raise InvalidOption(f"FAIRQ_ROOM_SECRETS names {room!r} twice")
        out[room] = secret
    return out


def prepare(options: ServeOptions) -> KeyRing:
    """Parse the keys and check the address; raise ``InvalidOption`` saying what is wrong."""
    keys = KeyRing.parse(options.api_keys)
    check_bind(options.host, keys)
    Sessions(options.session_secret, options.session_ttl)  # its options are checked here
    try:
        WaitSlots(options.max_waiting)
    except ValueError as exc:
        raise InvalidOption(str(exc)) from None
    parse_room_secrets(options.room_secrets)
    return keys


def listen(host: str, port: int) -> socket.socket:
    """The server's bound socket, made before anything is printed, so a port in use (a
    second ``fairq serve``) is one clear ``InvalidOption`` and not a banner followed by
    uvicorn's exit."""
    try:
        infos = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE | socket.AI_NUMERICSERV
        )
    except socket.gaierror as exc:
        raise InvalidOption(f"cannot listen on {host!r}: {exc.strerror}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
        sock.bind(address)
    except OSError as exc:
        sock.close()
        shown = f"[{host}]" if ":" in host else host
        if exc.errno == errno.EADDRINUSE:
            raise InvalidOption(
                f"{shown}:{port} is in use (another fairq serve?); choose a port with --port"
            ) from None
        raise InvalidOption(f"cannot listen on {shown}:{port}: {exc.strerror}") from None
    sock.set_inheritable(True)
    return sock


def serve(options: ServeOptions, sock: socket.socket | None = None) -> None:
    """Serve until SIGINT/SIGTERM, on ``sock`` (from :func:`listen`) or on a socket bound
    here to ``options.host`` and ``options.port``."""
    import uvicorn

    from .app import create_app

    keys = prepare(options)
    if sock is None:
        sock = listen(options.host, options.port)
    app = create_app(
        url=options.url,
        keys=keys,
        limits=Limits(
            max_batch=options.max_batch, max_wait=options.max_wait, max_body=options.max_body
        ),
        sample_interval=options.sample_interval,
        max_sampled_queues=options.max_queues,
        workers=options.workers,
        reconcile_interval=options.reconcile_interval,
        allowed_hosts=options.allowed_hosts,
        session_secret=options.session_secret,
        session_ttl=options.session_ttl,
        max_waiting=options.max_waiting,
        room_secrets=parse_room_secrets(options.room_secrets),
    )
    config = uvicorn.Config(
        app,
        host=options.host,
        port=options.port,
        log_level=options.log_level.lower(),
        access_log=options.access_log,
        timeout_graceful_shutdown=3,
        server_header=False,
        forwarded_allow_ips=options.forwarded_allow_ips,
    )

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            app.state.stop_waiting()  # long polls and blocked sends answer 503 now
            super().handle_exit(sig, frame)

    with sock:
        Server(config).run(sockets=[sock])
