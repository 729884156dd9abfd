"""What a :class:`~fairq.backends.postgres.PostgresBackend` is connected with: its URL
options, the connection pool, the caller's own connection (the outbox and inbox), and the
translation of driver errors into fairq errors.

psycopg is imported here and in the modules beside this one, nowhere else in fairq.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

try:
    import psycopg
    from psycopg import errors as pg_errors
    from psycopg.pq import ConnStatus, TransactionStatus
    from psycopg.rows import tuple_row
    from psycopg_pool import AsyncConnectionPool, PoolTimeout
except ImportError as exc:  # pragma: no cover - depends on the extras installed
    from ...errors import ConnectionError as _ConnectionError

    raise _ConnectionError(
        "the postgresql backend needs psycopg and psycopg-pool: pip install 'fairq[postgres]'"
    ) from exc

import orjson

from ...errors import (
    AttentionNotFound,
    BackendError,
    ConfigConflict,
    ConnectionError,
    FairqError,
    InvalidOption,
    LeaseLost,
    QueueFull,
    QueueNotFound,
    RoomNotFound,
    TopicNotFound,
    Unsupported,
)

__all__ = ["Options", "Pool", "parse_url", "translate"]

log = logging.getLogger("fairq.postgres")
T = TypeVar("T")

_SCHEMA = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
#: SQLSTATEs that mean "run the transaction again": serialization failure, deadlock
RETRYABLE = ("40001", "40P01")
_RETRIES = 8


def mask(url: str) -> str:
    """``url`` with its password replaced by ``***`` (also a ``password=`` option)."""
    url = re.sub(r"(//[^:/@]*:)[^@/]*@", r"\1***@", url)
    return re.sub(r"(?i)(password=)[^&\s]*", r"\1***", url)


@dataclass(frozen=True, slots=True)
class Options:
    """The fairq options of a ``postgresql://`` URL (the rest goes to libpq)."""

    conninfo: str  # what psycopg connects with: the URL without fairq's options
    masked: str  # the URL as errors show it
    schema: str = "fairq"
    pool_min: int = 1
    pool_max: int = 10
    timeout: float = 30.0  # seconds an operation (connection wait included) may take
    connect_timeout: float = 10.0
    listen: bool = True  # LISTEN/NOTIFY wake-ups; off behind a transaction-mode pooler
    poll: float = 0.25  # seconds between checks for changes when listen is off
    prepare: bool = True  # server-side prepared statements; off behind PgBouncer
    clock: str = "auto"  # auto: the server's clock unless a clock was injected
    migrate: bool = True  # apply missing migrations on connect
    durable_leases: bool = False  # leases wait for the WAL flush too (sends and acks always do)

    @property
    def channel(self) -> str:
        return f"fairq_{self.schema}"[:63]


def _number(options: dict[str, str], name: str, default: float, minimum: float) -> float:
    raw = options.pop(name, None)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise InvalidOption(f"{name} must be a number, got {raw!r}") from None
    if value < minimum:
        raise InvalidOption(f"{name} must be >= {minimum:g}, got {raw!r}")
    return value


def _flag(options: dict[str, str], name: str, default: bool) -> bool:
    raw = options.pop(name, None)
    if raw is None:
        return default
    if raw.lower() in ("1", "on", "true", "yes"):
        return True
    if raw.lower() in ("0", "off", "false", "no"):
        return False
    raise InvalidOption(f"{name} must be on or off, got {raw!r}")


_FAIRQ_OPTIONS = (
    "schema",
    "pool_min",
    "pool_max",
    "timeout",
    "listen",
    "poll",
    "prepare",
    "clock",
    "migrate",
    "durable_leases",
)


def parse_url(url: str) -> Options:
    """Split a ``postgresql://`` (or ``postgres://``) URL into libpq's part and fairq's
    options: ``schema`` (default ``fairq``), ``pool_min``/``pool_max`` (1/10),
    ``timeout`` (seconds, 30), ``listen`` (on), ``poll`` (0.25 s, with listen off),
    ``prepare`` (on), ``clock`` (``auto``/``server``/``client``), ``migrate`` (on).
    Everything else (``sslmode``, ``application_name``, ``connect_timeout`` ...) is
    passed to libpq as it is."""
    masked = mask(url)
    parts = urlsplit(url)
    options = dict(parse_qsl(parts.query, keep_blank_values=True))
    mine = {k: options.pop(k) for k in _FAIRQ_OPTIONS if k in options}
    schema = mine.pop("schema", "fairq")
    if _SCHEMA.fullmatch(schema) is None:
        raise InvalidOption(
            f"schema must be 1-63 letters, digits or _ (not starting with a digit), got {schema!r}"
        )
    pool_min = int(_number(mine, "pool_min", 1, 0))
    pool_max = int(_number(mine, "pool_max", 10, 1))
    if pool_max < max(pool_min, 1):
        raise InvalidOption(f"pool_max ({pool_max}) must be >= pool_min ({pool_min}) and >= 1")
    timeout = _number(mine, "timeout", 30.0, 0.001)
    listen = _flag(mine, "listen", True)
    poll = _number(mine, "poll", 0.25, 0.001)
    prepare = _flag(mine, "prepare", True)
    migrate = _flag(mine, "migrate", True)
    durable_leases = _flag(mine, "durable_leases", False)
    clock = mine.pop("clock", "auto").lower()
    if clock not in ("auto", "server", "client"):
        raise InvalidOption(f"clock must be auto, server or client, got {clock!r}")
    # libpq's own option, read here too (the pool waits as long): left in the URL
    connect_timeout = _number(dict(options), "connect_timeout", 10.0, 0.0) or 10.0
    options.setdefault("connect_timeout", str(int(max(1, connect_timeout))))
    scheme = "postgresql"
    # percent-encoded, not '+' for a space: libpq decodes %20 but keeps a '+' as it is
    query = urlencode(options, quote_via=quote)
    conninfo = urlunsplit((scheme, parts.netloc, parts.path, query, ""))
    return Options(
        conninfo=conninfo,
        masked=masked,
        schema=schema,
        pool_min=pool_min,
        pool_max=pool_max,
        timeout=timeout,
        connect_timeout=connect_timeout,
        listen=listen,
        poll=poll,
        prepare=prepare,
        clock=clock,
        migrate=migrate,
        durable_leases=durable_leases,
    )


# -- errors --------------------------------------------------------------------------------
def _detail(exc: psycopg.Error) -> dict[str, Any]:
    raw = exc.diag.message_detail
    if not raw:
        return {}
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return {}
    return data if isinstance(data, dict) else {}


def translate(exc: BaseException, masked: str) -> BaseException:
    """The fairq error for a driver error (fairq's own SQLSTATEs ``FQxxx`` included)."""
    if isinstance(exc, FairqError | asyncio.CancelledError):
        return exc
    if isinstance(exc, PoolTimeout):
        err: BaseException = ConnectionError(
            f"postgresql at {masked}: no connection within the timeout ({exc})"
        )
    elif isinstance(exc, psycopg.Error):
        state = exc.sqlstate or ""
        primary = exc.diag.message_primary or ""
        if state == "FQ404":
            err = QueueNotFound(primary)
        elif state == "FQ405":
            err = TopicNotFound(primary)
        elif state == "FQ406":
            err = AttentionNotFound(primary)
        elif state == "FQ407":
            err = RoomNotFound(primary)
        elif state == "FQ410":
            err = LeaseLost(_detail(exc).get("lost", []), _detail(exc).get("detail", ""))
        elif state == "FQ429":
            d = _detail(exc)
            err = QueueFull(
                primary, int(d.get("max_length", 0)), d.get("detail", ""), d.get("overflow", "")
            )
        elif state == "FQ422":
            err = InvalidOption(primary)
        elif state == "FQ409":
            err = ConfigConflict(primary)
        elif state == "FQ501":
            err = Unsupported(primary)
        elif state == "57014" and "statement timeout" in primary:
            err = ConnectionError(f"postgresql at {masked}: {primary} (the server's own limit)")
        elif isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError) or state.startswith(
            ("08", "57P")
        ):
            err = ConnectionError(f"postgresql at {masked}: {str(exc).strip()}")
        else:
            err = BackendError(f"postgresql: {str(exc).strip()}")
    else:
        return exc
    err.__cause__ = exc
    return err


# -- connections ---------------------------------------------------------------------------
async def driver_connection(obj: object) -> psycopg.AsyncConnection[Any]:
    """The psycopg ``AsyncConnection`` behind what a caller passed as ``connection=``: a
    psycopg ``AsyncConnection`` itself, or a SQLAlchemy ``AsyncConnection`` or
    ``AsyncSession`` over psycopg (its current transaction's connection)."""
    if isinstance(obj, psycopg.AsyncConnection):
        return obj
    if isinstance(obj, psycopg.Connection):
        raise InvalidOption(
            "connection= takes psycopg's AsyncConnection (fairq is async); got a blocking "
            "psycopg.Connection"
        )
    # SQLAlchemy, duck-typed (no dependency): AsyncSession.connection() -> AsyncConnection,
    # AsyncConnection.get_raw_connection() -> a pool entry whose driver_connection is psycopg's
    if hasattr(obj, "get_raw_connection"):
        if hasattr(obj, "in_transaction") and not obj.in_transaction():
            await getattr(obj, "exec_driver_sql")("SELECT 1")  # noqa: B009 - SQLAlchemy autobegin
        raw = await obj.get_raw_connection()
        inner = getattr(raw, "driver_connection", None)
        if isinstance(inner, psycopg.AsyncConnection):
            return inner
    elif hasattr(obj, "connection") and hasattr(obj, "execute") and hasattr(obj, "commit"):
        sa_conn = await obj.connection()
        return await driver_connection(sa_conn)
    raise InvalidOption(
        "connection= takes a psycopg AsyncConnection, or a SQLAlchemy AsyncConnection or "
        f"AsyncSession over psycopg; got {type(obj).__name__}"
    )


Cursor = psycopg.AsyncCursor[tuple[Any, ...]]

#: seconds a statement on the caller's connection is given, once the deadline has passed,
#: to end by the server's cancel (its savepoint rolls back) before its socket is given up
CANCEL_GRACE = 0.5
#: seconds during which pooled connections are checked before use, after trouble was seen
SUSPECT_FOR = 30.0
#: seconds the pool retries one failed connection (its delays double from 1 s) before it
#: gives that chain up; a new one starts when an operation next needs a connection
RECONNECT_CHAIN = 5.0
#: seconds of one request for a pooled connection (see ``Pool._getconn``)
GETCONN_SLICE = 1.0
#: seconds a health check's own connection (``Pool.probe``) may take at most
PROBE_TIMEOUT = 3.0


class _QuietPoolRetries(logging.Filter):
    """psycopg_pool warns of every failed connection attempt of a pool, in two lines, and
    of every retry chain it gives up: a flood while the server is down. fairq's operations
    raise ``ConnectionError`` meanwhile and its worker says once that the engine is away and
    when it is back, so these records of fairq's own pools (named ``fairq:``) are dropped."""

    _NOISE = ("error connecting in %r: %s", "reconnection attempt in pool %r failed after %s sec")

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        return not (
            record.msg in self._NOISE
            and isinstance(args, tuple)
            and bool(args)
            and str(args[0]).startswith("fairq:")
        )


_QUIET_POOL_RETRIES = _QuietPoolRetries()
#: seconds after giving up a socket before the operation is cancelled outright (a wait
#: on a socket that was shut down fails at once; this only catches the unforeseen)
_BACKSTOP = 1.0


def abandon(conn: psycopg.AsyncConnection[Any]) -> None:
    """Give up ``conn`` at once: shut its socket down, so whatever waits on it fails now
    ("server closed the connection") and the connection is BAD (a pool replaces it).

    Not ``close()``: on a socket that does not answer, psycopg would first try to cancel
    the statement and wait for its end (up to 10 s). Not ``pgconn.finish()`` either: that
    closes the descriptor while the event loop may still watch its number, and a socket
    opened meanwhile could get the same number. ``shutdown`` leaves the descriptor to its
    owner and ends the connection for everyone holding it."""
    try:
        fd = conn.pgconn.socket
    except psycopg.Error:
        return  # already closed
    with contextlib.suppress(OSError), socket.socket(fileno=os.dup(fd)) as sock:
        sock.shutdown(socket.SHUT_RDWR)


class Deadline:
    """The time limit of one operation (SPEC §10: every operation raises
    ``ConnectionError`` within its timeout while the engine is down or unreachable).

    ``asyncio.timeout`` alone is not enough: cancelling a task in the middle of a
    statement makes psycopg send a cancel request and wait for the statement's end (up to
    5 + 5 s), and the pool's cleanup (a ROLLBACK) waits with no limit at all, so on a
    socket that stopped answering (a partition, a hung server) an operation could hang
    long past its timeout. At the deadline, therefore:

    - waiting for a pooled connection, or between statements: the operation is cancelled;
    - a statement in flight on a pooled connection: its socket is given up
      (:func:`abandon`), so the statement fails at once; the pool opens a fresh one;
    - a statement in flight on the caller's connection (``connection=``): the server is
      asked to cancel it (the savepoint rolls back, the caller's transaction stays
      usable); if it has not ended within :data:`CANCEL_GRACE` seconds, its socket is
      given up too (a server that does not answer a cancel has no transaction left to
      keep).

    ``expired`` tells the caller to report the timeout, whatever error it caused.
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.expired = False
        self.conn: psycopg.AsyncConnection[Any] | None = None
        self.own = True  # conn is fairq's (pooled or dedicated), not the caller's
        self._timeout = asyncio.timeout(None)
        self._handles: list[asyncio.TimerHandle] = []
        self._cancelled = False
        self._canceller: asyncio.Task[None] | None = None
        #: connections given up on: never to be pooled again (the statement may have ended
        #: before libpq read the end of the socket, so the connection can still look fine)
        self.abandoned: list[psycopg.AsyncConnection[Any]] = []

    async def __aenter__(self) -> Deadline:
        await self._timeout.__aenter__()
        self._loop = asyncio.get_running_loop()
        self._handles.append(self._loop.call_later(self.seconds, self._expire))
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        for handle in self._handles:
            handle.cancel()
        await self._timeout.__aexit__(*exc_info)  # a cancel of its own: TimeoutError

    @contextlib.contextmanager
    def using(self, conn: psycopg.AsyncConnection[Any], own: bool = True) -> Iterator[None]:
        """While the block runs, ``conn`` is the connection the operation waits on."""
        self.conn, self.own = conn, own
        if self.expired:  # the deadline passed while the connection was being handed out
            self._expire()
        try:
            yield
        finally:
            self.conn = None

    def _cancel(self, after: float = 0.0) -> None:
        if not self._cancelled:
            self._cancelled = True
            self._timeout.reschedule(self._loop.time() + after)

    def _expire(self) -> None:
        self.expired = True
        conn = self.conn
        if conn is None or conn.pgconn.status == ConnStatus.BAD:
            self._cancel()
        elif self.own:
            active = conn.pgconn.transaction_status == TransactionStatus.ACTIVE
            self._abandon(conn)
            self._cancel(_BACKSTOP if active else 0.0)
        elif conn.pgconn.transaction_status == TransactionStatus.ACTIVE:
            cancel = getattr(conn, "cancel_safe", None)  # psycopg >= 3.2
            if cancel is not None:
                self._canceller = asyncio.ensure_future(self._ask_cancel(cancel))
            self._handles.append(self._loop.call_later(CANCEL_GRACE, self._give_up))
        else:
            self._cancel()
            self._handles.append(self._loop.call_later(CANCEL_GRACE, self._give_up))

    @staticmethod
    async def _ask_cancel(cancel: Callable[..., Awaitable[None]]) -> None:
        with contextlib.suppress(Exception):
            await cancel(timeout=CANCEL_GRACE)

    def _give_up(self) -> None:
        if self.conn is not None:
            self._abandon(self.conn)
            self._cancel(_BACKSTOP)

    def _abandon(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self.abandoned.append(conn)
        abandon(conn)

    async def discard(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Close ``conn`` if it was given up on (before handing it back to its pool)."""
        if any(c is conn for c in self.abandoned):
            with contextlib.suppress(Exception):
                await conn.close()


class Pool:
    """The backend's connection pool and the way every operation runs: on a pooled
    connection (autocommit, so a one-statement operation costs one round trip), or in a
    transaction, or on the caller's connection inside the caller's transaction; each
    within the ``timeout`` option (:class:`Deadline`)."""

    def __init__(self, options: Options) -> None:
        self.options = options
        kwargs: dict[str, Any] = {"autocommit": True}
        if not options.prepare:
            kwargs["prepare_threshold"] = None
        # fairq's own connections defer their NOTIFYs past the write's commit (see wake()
        # in 0001_queues.sql); a caller's connection keeps them in its transaction.
        # The server's own limits back the client's: a statement fairq gave up on (its
        # client gone) does not run on, and a transaction whose client vanished does not
        # hold its locks, or the xmin horizon, for long.
        settings = [
            "-c fairq.defer_wakes=on",
            f"-c statement_timeout={int(options.timeout * 1000)}",
            f"-c idle_in_transaction_session_timeout={int(max(60, 2 * options.timeout) * 1000)}",
        ]
        if options.durable_leases:
            settings.append("-c fairq.durable_leases=on")
        kwargs["options"] = " ".join(settings)
        schema = '"' + options.schema.replace('"', '""') + '"'
        self._flush_wakes = f"SELECT {schema}.flush_wakes()"
        self._flushes: set[asyncio.Future[None]] = set()
        self._closing = False
        self._suspect_until = 0.0
        #: why the pool's last attempt to connect failed; None once one succeeded
        self.refused: str | None = None
        self._kwargs = kwargs
        logging.getLogger("psycopg.pool").addFilter(_QUIET_POOL_RETRIES)  # once: same object
        self.pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]] = AsyncConnectionPool(
            options.conninfo,
            min_size=options.pool_min,
            max_size=options.pool_max,
            kwargs=kwargs,
            open=False,
            timeout=options.timeout,
            name=f"fairq:{options.schema}",
            check=self._check,
            connection_class=_recording(self),
            # psycopg_pool retries a failed connection with a doubling delay (1, 2, 4, ...
            # s) for reconnect_timeout seconds: with its default of 5 minutes, after an
            # outage of a minute the next attempt came up to a minute after the server was
            # back. A chain given up after RECONNECT_CHAIN seconds ends; the next operation
            # that needs a connection starts a new one at once.
            reconnect_timeout=RECONNECT_CHAIN,
        )

    def suspect(self) -> None:
        """Connection trouble was seen (an operation met a dead connection, the LISTEN
        connection dropped): for the next :data:`SUSPECT_FOR` seconds each pooled connection
        is checked (one empty statement) before it is handed out, so connections the server
        ended meanwhile (a restart) are replaced instead of failing the next operations."""
        self._suspect_until = time.monotonic() + SUSPECT_FOR

    async def _check(self, conn: psycopg.AsyncConnection[Any]) -> None:
        if time.monotonic() >= self._suspect_until:
            return  # the common case: no round trip
        limit = Deadline(min(self.options.timeout, self.options.connect_timeout))
        try:
            async with limit:
                with limit.using(conn):
                    await conn.execute("")
        finally:
            await limit.discard(conn)
        if conn.closed:
            raise ConnectionError("the connection did not answer its check")

    async def open(self) -> None:
        try:
            await self.pool.open(
                wait=self.options.pool_min > 0, timeout=self.options.connect_timeout
            )
            if self.options.pool_min == 0:
                async with self.pool.connection(timeout=self.options.connect_timeout) as conn:
                    await conn.execute("SELECT 1")
        except Exception as exc:
            with contextlib.suppress(Exception):
                await self.pool.close(timeout=0)
            raise ConnectionError(
                f"cannot connect to {self.options.masked}: {_reason(exc)}"
            ) from exc

    async def close(self) -> None:
        self._closing = True
        if self._flushes:  # the last wake-ups go out before the pool closes
            await asyncio.wait(list(self._flushes), timeout=self.options.timeout)
        await self.pool.close(timeout=1.0)

    async def check(self) -> None:
        """Drop idle connections that died (after the server came back); within the
        timeout, so a server that stopped answering again cannot hold the caller."""
        with contextlib.suppress(Exception):
            async with asyncio.timeout(self.options.timeout):
                await self.pool.check()

    def error(self, exc: BaseException) -> BaseException:
        return translate(exc, self.options.masked)

    @contextlib.asynccontextmanager
    async def cursor(
        self,
        transaction: bool = False,
        wakes: bool | Callable[[], bool] = True,
        deadline: Deadline | None = None,
    ) -> AsyncIterator[Cursor]:
        """A cursor on a pooled connection, in a transaction if asked. The wake-ups the work
        noted (``wake()`` in 0001_queues.sql) are NOTIFYed once it has committed, by
        :meth:`_flush_then_return`, after the caller has its answer: the NOTIFY's round
        trip is not part of the operation's. ``wakes`` False: the work notes none; a
        callable: asked once the work is done (an operation that reports whether it noted
        any, so the common case costs no second round trip)."""
        conn = await self._getconn()
        flushing = False
        try:
            with deadline.using(conn) if deadline is not None else contextlib.nullcontext():
                cur = conn.cursor(row_factory=tuple_row)
                if transaction:
                    async with conn.transaction():
                        yield cur
                else:
                    yield cur
            if (wakes() if callable(wakes) else wakes) and not self._closing:
                flushing = True
                task = asyncio.ensure_future(self._flush_then_return(conn))
                self._flushes.add(task)
                task.add_done_callback(self._flushes.discard)
        finally:
            if not flushing:
                if deadline is not None:
                    await deadline.discard(conn)
                await self.pool.putconn(conn)

    async def _getconn(self) -> psycopg.AsyncConnection[Any]:
        """A pooled connection within the ``timeout`` option. After connection trouble
        (:meth:`suspect`) it is asked for in slices of :data:`GETCONN_SLICE`: the pool starts
        a connection for a request that has to wait, and retries it for
        :data:`RECONNECT_CHAIN` seconds, but a request already waiting when that chain gave
        up starts no other. One long wait through an outage of more than 5 s so waited its
        whole timeout (30 s) however soon the server was back; each new slice starts a new
        chain. Otherwise one wait: a slice that ends goes to the back of the pool's line, so
        on a merely busy pool older requests could be overtaken for their whole timeout."""
        if time.monotonic() >= self._suspect_until:
            return await self.pool.getconn(timeout=self.options.timeout)
        loop = asyncio.get_running_loop()
        end = loop.time() + self.options.timeout
        while True:
            remaining = end - loop.time()
            try:
                return await self.pool.getconn(timeout=max(0.001, min(remaining, GETCONN_SLICE)))
            except PoolTimeout:
                if remaining <= GETCONN_SLICE:
                    raise

    async def _flush_then_return(self, conn: psycopg.AsyncConnection[Any]) -> None:
        limit = Deadline(self.options.timeout)
        try:
            async with limit:
                with limit.using(conn):
                    await conn.execute(self._flush_wakes)
        except Exception:
            # the waiters' safety poll finds what this would have woken
            log.debug("wake-ups not sent", exc_info=True)
        finally:
            await limit.discard(conn)
            await self.pool.putconn(conn)

    def timed_out(self, exc: BaseException | None = None) -> ConnectionError:
        text = f"postgresql at {self.options.masked}: no answer within {self.options.timeout:g} s"
        if self.refused is not None:  # the server refuses: say so, not only that time ran out
            text += f" (the last connection attempt: {self.refused})"
        err = ConnectionError(text)
        err.__cause__ = exc
        return err

    @property
    def troubled(self) -> bool:
        """Whether connection trouble was seen lately: a failed connection attempt not
        followed by a good one, or an operation that met a dead connection."""
        return self.refused is not None or time.monotonic() < self._suspect_until

    async def probe(self) -> None:
        """One new connection and one statement, not the pool's: whether the server
        answers now. A health check while the pool is in trouble asks this, so a server
        that refuses connections gives its answer at once, where a pooled operation waits
        for the pool's reconnection up to its whole ``timeout``."""
        limit = min(self.options.connect_timeout, PROBE_TIMEOUT)
        kwargs = {**self._kwargs, "connect_timeout": max(1, int(limit))}
        try:
            async with asyncio.timeout(limit):
                conn = await psycopg.AsyncConnection.connect(self.options.conninfo, **kwargs)
                try:
                    await conn.execute("SELECT 1")
                finally:
                    await conn.close()
        except TimeoutError as exc:
            raise ConnectionError(
                f"postgresql at {self.options.masked}: no answer within {limit:g} s"
            ) from exc
        except psycopg.Error as exc:
            raise ConnectionError(f"postgresql at {self.options.masked}: {_line(exc)}") from exc

    async def run(
        self,
        fn: Callable[[Cursor], Awaitable[T]],
        *,
        transaction: bool = False,
        connection: object | None = None,
        wakes: bool | Callable[[T], bool] = True,
    ) -> T:
        """Run ``fn(cursor)`` as one atomic step: in one statement (autocommit) or one
        transaction, retried on serialization failures and deadlocks; with ``connection``,
        inside the caller's transaction (a savepoint of it, so a failure here leaves the
        caller's own work alone), never retried there: the caller's transaction decides.
        Past the ``timeout`` option: ``ConnectionError`` (see :class:`Deadline`).
        ``wakes``: whether the work noted wake-ups to send after it (see :meth:`cursor`);
        a callable is given the result."""
        deadline = Deadline(self.options.timeout)
        try:
            async with deadline:
                if connection is not None:
                    conn = await driver_connection(connection)
                    if conn.closed or conn.broken:
                        raise InvalidOption("connection= is closed")
                    status = conn.info.transaction_status
                    if status == TransactionStatus.INERROR:
                        raise InvalidOption(
                            "connection= is in a failed transaction: roll it back first"
                        )
                    with deadline.using(conn, own=False):
                        if status == TransactionStatus.IDLE and not conn.autocommit:
                            # the caller's implicit transaction (psycopg's default): begin
                            # it here, so the caller's commit() or rollback() decides
                            await conn.execute("SELECT 1")
                        async with conn.transaction():
                            return await fn(conn.cursor(row_factory=tuple_row))
                done: list[T] = []
                noted: bool | Callable[[], bool] = (
                    (lambda: bool(done) and wakes(done[0])) if callable(wakes) else wakes
                )
                for attempt in range(_RETRIES):
                    try:
                        async with self.cursor(transaction, noted, deadline) as cur:
                            done.append(await fn(cur))
                            return done[0]
                    except psycopg.Error as exc:
                        if exc.sqlstate not in RETRYABLE or attempt == _RETRIES - 1:
                            raise
                        await asyncio.sleep(0.001 * 2**attempt)
                raise AssertionError("unreachable")
        except TimeoutError as exc:
            self.suspect()
            raise self.timed_out(exc) from exc
        except Exception as exc:
            if deadline.expired and not isinstance(exc, FairqError):
                self.suspect()
                raise self.timed_out(exc) from exc
            err = self.error(exc)
            if isinstance(err, ConnectionError) and connection is None:
                self.suspect()
            raise err from exc


def _reason(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    cause = exc.__cause__ or exc.__context__
    if isinstance(exc, PoolTimeout) and cause is not None:
        text = str(cause).strip() or text
    return mask(text)


def _line(exc: BaseException) -> str:
    """libpq's words on one line (it breaks them with a newline and a tab)."""
    return " ".join(_reason(exc).split())


def _recording(pool: Pool) -> type[psycopg.AsyncConnection[Any]]:
    """The connection class of ``pool``'s connections: psycopg's, noting in
    ``pool.refused`` why the last attempt to connect failed (libpq's words, on one line),
    and clearing it when one succeeds."""

    class Recording(psycopg.AsyncConnection[Any]):
        @classmethod
        async def connect(cls, *args: Any, **kwargs: Any) -> Any:
            try:
                conn = await super().connect(*args, **kwargs)
            except psycopg.Error as exc:
                pool.refused = _line(exc)
                raise
            pool.refused = None
            return conn

    # psycopg's pool names the class in its logs: keep psycopg's name there
    Recording.__module__, Recording.__qualname__ = "psycopg", "AsyncConnection"
    return Recording


__all__ += ["Cursor", "Deadline", "abandon", "driver_connection", "mask", "pg_errors"]
