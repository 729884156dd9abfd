"""The connection to RabbitMQ: URL parsing, aio-pika's robust connection, fairq's channels,
and the one place driver errors become fairq errors.

aio-pika's ``RobustConnection`` reconnects by itself (with backoff) after a broker restart or
a dropped connection. fairq opens its channels on the connection aio-pika currently holds
(aiormq channels: one publisher channel in confirm mode, one for declarations, one per
consumed queue) and opens them again on the new connection; each reconnect starts a new
*generation*, and deliveries of an older one can no longer be settled (``LeaseLost``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, NoReturn
from urllib.parse import parse_qsl, quote, unquote, urlsplit, urlunsplit

from ...errors import (
    BackendError,
    ConfigConflict,
    ConnectionError,
    FairqError,
    InvalidMessage,
    InvalidOption,
    QueueNotFound,
)
from ..open import mask_url

try:
    import aio_pika
    import aiormq
    import aiormq.abc
    import aiormq.exceptions
    from pamqp import commands as spec
    from pamqp import header as pamqp_header
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise ConnectionError("the RabbitMQ backend needs aio-pika: pip install 'fairq[amqp]'") from exc

__all__ = ["AmqpUrl", "DeliveryError", "Link", "driver_errors", "parse_url", "spec"]

log = logging.getLogger("fairq.amqp")

Channel = aiormq.abc.AbstractChannel
DeliveryError = aiormq.exceptions.DeliveryError

#: what the driver raises when the broker is gone or refuses (anything else is a bug)
DRIVER_ERRORS: tuple[type[BaseException], ...] = (
    aiormq.exceptions.AMQPError,
    OSError,  # includes builtins.ConnectionError
    asyncio.TimeoutError,
    RuntimeError,  # aiormq: "... closed" on a channel whose connection went away
)

_FRAME_OVERHEAD = 8  # frame type, channel, size and end octet around a frame's payload
#: more than a content header's fixed fields, its other properties and the frame around it
_HEADER_ROOM = 1024


def _fits_surely(headers: dict[str, Any], frame_max: int) -> bool:
    """Whether ``headers`` of str and int values fit in a frame whatever their encoding:
    each entry at most its key and value in UTF-8 (4 bytes a character) and 9 bytes of
    lengths and type; False means "encode it and see"."""
    bound = _HEADER_ROOM
    for key, value in headers.items():
        if isinstance(value, str):
            bound += 9 + 4 * (len(key) + len(value))
        elif isinstance(value, int) and not isinstance(value, bool):
            bound += 9 + 4 * len(key) + 8
        else:
            return False  # a table or list: only the encoder knows
    return bound <= frame_max


_OPTIONS = ("store", "prefetch", "management", "timeout", "name", "attention_queues")
#: the heartbeat (seconds) fairq asks for unless the URL gives one (aiormq's default: 60).
#: Only the process holding a delivery can end its lease, so one that freezes (SIGSTOP, a
#: paused VM, an event loop blocked for good) keeps its deliveries until RabbitMQ drops the
#: connection, after two or three missed heartbeats: ~30 s with 10, ~3 minutes with 60
HEARTBEAT = 10
# the query options aiormq itself reads (TLS files, heartbeat, authentication)
_DRIVER_OPTIONS = (
    "cafile", "capath", "cadata", "keyfile", "certfile", "no_verify_ssl", "heartbeat", "auth",
)  # fmt: skip


class _OpeningFailures(logging.Filter):
    """Drops aiormq's own log line of a failed first connect ("error when creating
    transport") while a link opens: :meth:`Link.open` raises the same failure as a
    ``ConnectionError``, and a CLI user would read it twice. Reconnects still log."""

    def __init__(self) -> None:
        super().__init__()
        self.opening = 0

    def filter(self, record: logging.LogRecord) -> bool:
        return not (self.opening and record.getMessage().startswith("error when creating"))


_opening_failures = _OpeningFailures()
logging.getLogger("aiormq.connection").addFilter(_opening_failures)


class _Repeats(logging.Filter):
    """While RabbitMQ is away, aio-pika and aiormq log each reconnect attempt (every 0.5 s,
    at ERROR, WARNING and INFO, with tracebacks): a hundred lines a worker for a 16 s
    outage. Each of their messages is let through once per ``every`` seconds; fairq's own
    lines say when the broker went away and when it is back."""

    def __init__(self, every: float = 60.0) -> None:
        super().__init__()
        self.every = every
        self._last: dict[tuple[str, object], float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, record.msg)
        now = time.monotonic()
        if now - self._last.get(key, -self.every) < self.every:
            return False
        if len(self._last) > 1000:
            self._last.clear()
        self._last[key] = now
        return True


_REPEATS = _Repeats()
for _name in ("aio_pika.robust_connection", "aio_pika.connection", "aiormq.connection"):
    logging.getLogger(_name).addFilter(_REPEATS)


def _open_failed(url: AmqpUrl, exc: BaseException) -> ConnectionError:
    """What a failed first connect means, in words: a refused login, a vhost RabbitMQ will
    not open (it closes the connection without saying why in aiormq's error), or the
    driver's own message."""
    if isinstance(exc, aiormq.exceptions.ProbableAuthenticationError):
        why = f"RabbitMQ refused the login of user {url.user!r} (wrong user or password)"
    elif "Connection.Close" in str(exc):
        why = (
            f"RabbitMQ would not open vhost {url.vhost!r}: it does not exist, or user "
            f"{url.user!r} has no permission on it (rabbitmqctl add_vhost / set_permissions)"
        )
    elif isinstance(exc, DRIVER_ERRORS) and str(exc).strip():
        why = str(exc)
    else:  # some failures say nothing (a server that answers in another protocol)
        why = (
            f"{type(exc).__name__} {str(exc).strip()}".strip()
            + " (no AMQP handshake: is RabbitMQ listening on that port?)"
        )
    return ConnectionError(f"cannot connect to {url.masked!r}: {why}")


@dataclass(frozen=True, slots=True)
class AmqpUrl:
    """A parsed ``amqp://`` URL: the broker URL aio-pika gets, fairq's own options."""

    broker: str  # without fairq's query options
    masked: str  # the whole URL, passwords masked
    host: str
    port: int
    vhost: str
    user: str
    password: str
    tls: bool
    store: str | None
    prefetch: int
    management: str | None  # base URL of the management HTTP API, or None for "do not use"
    timeout: float
    name: str
    attention_queues: str = "classic"  # the type of attention work queues: classic | quorum


def parse_url(url: str) -> AmqpUrl:
    """Split ``amqp[s]://user:pass@host:port/vhost?store=...&prefetch=...``.

    Options: ``store`` (the URL of the backend that keeps what RabbitMQ cannot: required),
    ``prefetch`` (deliveries a consumer may hold, default 200), ``management``
    (``http://host:15672`` by default, ``off`` to never use the HTTP API), ``timeout``
    (seconds to connect, default 10), ``name`` (the connection name shown by RabbitMQ),
    ``attention_queues`` (``classic``, the default, or ``quorum``: the type of attention
    work queues). The driver's own (``heartbeat``, ``auth`` and the TLS files ``cafile``,
    ``capath``, ``cadata``, ``keyfile``, ``certfile``, ``no_verify_ssl``) are passed to it;
    any other is refused: an ``&`` inside an unencoded ``store=`` URL would otherwise give
    the store's options (``schema``, ``prefix`` ...) to RabbitMQ's client, unseen.
    """
    masked = mask_url(url)
    parts = urlsplit(url)
    tls = parts.scheme.lower() == "amqps"
    query = parse_qsl(parts.query, keep_blank_values=True)
    ours = {k: v for k, v in query if k in _OPTIONS}
    theirs = [(k, v) for k, v in query if k not in _OPTIONS]
    unknown = sorted({k for k, _ in theirs if k not in _DRIVER_OPTIONS})
    if unknown:
        hint = ""
        if "store" in ours:
            hint = (
                "; if they belong to the store's URL, percent-encode that URL in store= "
                "(urllib.parse.quote(store_url, safe=''))"
            )
        raise InvalidOption(
            f"unknown option(s) {', '.join(unknown)} in {masked!r}: a RabbitMQ URL takes "
            f"{', '.join(_OPTIONS)} and the driver's {', '.join(_DRIVER_OPTIONS)}{hint}"
        )
    try:
        port = parts.port or (5671 if tls else 5672)
    except ValueError as exc:
        raise ConnectionError(f"cannot open {masked!r}: bad port") from exc
    host = parts.hostname or "localhost"
    path = parts.path[1:] if parts.path.startswith("/") else parts.path
    vhost = unquote(path) if path else "/"
    try:
        prefetch = int(ours.get("prefetch", "200"))
        timeout = float(ours.get("timeout", "10"))
    except ValueError as exc:
        raise InvalidOption(f"bad prefetch or timeout in {masked!r}") from exc
    if not 1 <= prefetch <= 65535 or timeout <= 0:  # basic.qos's prefetch is 16 bits
        raise InvalidOption(f"prefetch must be 1-65535 and timeout > 0 in {masked!r}")
    attention_queues = ours.get("attention_queues", "classic")
    if attention_queues not in ("classic", "quorum"):
        raise InvalidOption(f"attention_queues must be classic or quorum in {masked!r}")
    management: str | None = ours.get("management", f"http://{host}:15672")
    if management in ("off", "none", ""):
        management = None
    if not any(k == "heartbeat" for k, _ in theirs):
        theirs.append(("heartbeat", str(HEARTBEAT)))
    query_rest = "&".join(f"{quote(k)}={quote(v)}" for k, v in theirs)
    broker = urlunsplit((parts.scheme, parts.netloc, parts.path or "/", query_rest, ""))
    return AmqpUrl(
        broker=broker,
        masked=masked,
        host=host,
        port=port,
        vhost=vhost,
        user=unquote(parts.username or "guest"),
        password=unquote(parts.password or "guest"),
        tls=tls,
        store=ours.get("store") or None,
        prefetch=prefetch,
        management=management,
        timeout=timeout,
        name=ours.get("name") or f"fairq {socket.gethostname()}:{os.getpid()}",
        attention_queues=attention_queues,
    )


def raise_driver_error(exc: BaseException, what: str, masked: str) -> NoReturn:
    """Raise the fairq error for a driver exception met while doing ``what``."""
    if isinstance(exc, FairqError):  # fairq's own (its ConnectionError is an OSError too)
        raise exc
    if isinstance(exc, aiormq.exceptions.ChannelNotFoundEntity):
        raise QueueNotFound(what) from exc
    if isinstance(exc, aiormq.exceptions.ChannelPreconditionFailed):
        raise ConfigConflict(f"RabbitMQ refused {what}: {exc}") from exc
    if isinstance(exc, aiormq.exceptions.ChannelAccessRefused):
        raise ConnectionError(f"RabbitMQ at {masked!r} refused {what}: {exc}") from exc
    if isinstance(exc, aiormq.exceptions.AMQPChannelError):
        raise BackendError(f"RabbitMQ failed {what}: {exc}") from exc
    raise ConnectionError(f"RabbitMQ at {masked!r} is unreachable ({what}): {exc!r}") from exc


@contextlib.contextmanager
def driver_errors(what: str, masked: str) -> Iterator[None]:
    """Turn driver exceptions inside the block into fairq errors."""
    try:
        yield
    except DRIVER_ERRORS as exc:
        raise_driver_error(exc, what, masked)


class Link:
    """One robust connection and fairq's channels on it."""

    def __init__(self, url: AmqpUrl) -> None:
        self.url = url
        self.generation = 0
        self._conn: aio_pika.abc.AbstractRobustConnection | None = None
        self._channels: dict[str, tuple[int, Channel]] = {}
        self._lock = asyncio.Lock()
        self.on_reconnect: list[Callable[[], None]] = []

    async def open(self) -> None:
        _opening_failures.opening += 1
        try:
            self._conn = await aio_pika.connect_robust(
                self.url.broker,
                timeout=self.url.timeout,
                client_properties={"connection_name": self.url.name},
                reconnect_interval=0.5,
                fail_fast=True,
            )
        except Exception as exc:  # aio-pika raises its own errors for bad credentials
            raise _open_failed(self.url, exc) from exc
        finally:
            _opening_failures.opening -= 1
        self._conn.reconnect_callbacks.add(self._reconnected)

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        self._channels.clear()
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()

    def _reconnected(self, *_: Any) -> None:
        self.generation += 1
        self._channels.clear()
        log.warning("reconnected to %s (generation %d)", self.url.masked, self.generation)
        for hook in self.on_reconnect:
            hook()

    def _raw(self) -> aiormq.abc.AbstractConnection:
        conn = self._conn
        if conn is None:
            raise ConnectionError(f"the connection to {self.url.masked!r} is closed")
        transport = conn.transport
        if transport is None or transport.connection.is_closed:
            raise ConnectionError(f"RabbitMQ at {self.url.masked!r} is unreachable (reconnecting)")
        return transport.connection

    def check_header(self, properties: spec.Basic.Properties, what: str) -> None:
        """``InvalidMessage`` if a message's properties (its attributes, as headers) would
        not fit in one frame: AMQP cannot split a content header, and RabbitMQ answers an
        oversized one by closing the whole connection (every lease on it lost)."""
        frame_max = int(self._raw().connection_tune.frame_max or 0)
        if not frame_max:
            return  # no limit negotiated
        if _fits_surely(properties.headers or {}, frame_max):
            return  # the common case, without encoding the header on the send's path
        size = len(pamqp_header.ContentHeader(0, 0, properties).marshal()) + _FRAME_OVERHEAD
        if size > frame_max:
            raise InvalidMessage(
                f"{what}: the message's attributes take {size:,} bytes in its AMQP header "
                f"frame; RabbitMQ's frame_max is {frame_max:,} bytes (attributes must fit in "
                "one frame: keep large data in the body)"
            )

    def server_version(self) -> tuple[int, ...] | None:
        """The broker's version (e.g. ``(3, 10, 8)``), None if it does not say."""
        raw = self._raw().server_properties.get("version")
        text = raw.decode() if isinstance(raw, bytes) else str(raw or "")
        parts = []
        for piece in text.split("."):
            digits = "".join(itertools.takewhile(str.isdigit, piece))
            if not digits:
                break
            parts.append(int(digits))
        return tuple(parts) or None

    def cached(self, key: str) -> Channel | None:
        """The open channel ``key`` of the current generation, if there is one."""
        got = self._channels.get(key)
        if got is not None and got[0] == self.generation and not got[1].is_closed:
            return got[1]
        return None

    async def channel(self, key: str, confirms: bool = False, prefetch: int = 0) -> Channel:
        """Channel ``key`` of the current connection, opened (again) if needed."""
        ch = self.cached(key)
        if ch is not None:
            return ch
        async with self._lock:
            ch = self.cached(key)
            if ch is not None:
                return ch
            with driver_errors("opening a channel", self.url.masked):
                ch = await self._raw().channel(publisher_confirms=confirms)
                if prefetch:
                    await ch.basic_qos(prefetch_count=prefetch)
            self._channels[key] = (self.generation, ch)
            return ch

    def forget(self, key: str) -> Channel | None:
        got = self._channels.pop(key, None)
        return got[1] if got is not None else None
