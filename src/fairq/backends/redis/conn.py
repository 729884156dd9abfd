"""The Redis backend's connection: URL options, the redis-py client (one Redis or a
Cluster), the Lua scripts (loaded once, called by SHA, reloaded after ``NOSCRIPT``) and
the mapping of driver errors onto fairq errors.

redis-py is imported here and in the modules beside this one only.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, NoReturn
from urllib.parse import parse_qsl, unquote, urlsplit

from ...errors import BackendError, ConnectionError, InvalidOption

try:
    import redis
    import redis.asyncio as aioredis
    from redis import exceptions as rex
    from redis.asyncio.cluster import ClusterNode, RedisCluster
    from redis.asyncio.retry import Retry
    from redis.backoff import ExponentialBackoff
except ImportError as exc:  # pragma: no cover - the extra is part of the test install
    raise ConnectionError("the redis backend needs redis-py: pip install 'fairq[redis]'") from exc

__all__ = ["RedisOptions", "Scripts", "driver_error", "family", "mask", "parse_url", "rex"]

#: the scripts' error replies start with this, then a code and tab-separated values
ERROR_PREFIX = "FQ:"


def mask(url: str) -> str:
    """``url`` with any password replaced by ``***``."""
    return re.sub(r"(//[^:/@]*:)[^@/]*@", r"\1***@", url)


def family(name: str) -> str:
    """The family of a queue, topic or domain name: its first dot-separated word. A
    family's keys share one hash tag, so they live in one Cluster slot."""
    return name.split(".", 1)[0]


@dataclass(slots=True)
class RedisOptions:
    """What a ``redis://``, ``rediss://`` or ``redis+cluster://`` URL says."""

    url: str  # masked
    cluster: bool
    host: str  # the first (or only) host
    port: int
    db: int
    username: str | None
    password: str | None
    ssl: bool
    prefix: str
    server_clock: bool
    timeout: float
    connect_timeout: float
    max_connections: int
    safety_poll: float
    #: every host of the URL (a Cluster's seed nodes), the first one first
    seeds: list[tuple[str, int]] = field(default_factory=list)


def _number(
    options: dict[str, str], key: str, default: float, url: str, unit: str = "seconds"
) -> float:
    raw = options.pop(key, None)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0 or (unit != "seconds" and not value.is_integer()):
        kind = "number of seconds" if unit == "seconds" else f"whole number of {unit}"
        raise InvalidOption(f"{key} must be a positive {kind} in {mask(url)!r}, got {raw!r}")
    return value


def parse_url(url: str) -> RedisOptions:
    """Parse a Redis URL (``redis://[user:password@]host:port/db?prefix=...``; a Cluster's
    ``redis+cluster://host:port,host:port,...`` names one or more seed nodes).

    Query options: ``prefix`` (of every key, default ``fairq:``), ``clock`` (``client``:
    scripts use the broker's clock, the default; ``server``: Redis's ``TIME``),
    ``timeout`` (seconds a command may take, default 5), ``connect_timeout`` (default 2),
    ``max_connections`` (default 1024), ``safety_poll`` (seconds between the long polls'
    safety checks, default 5).
    """
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    cluster = scheme == "redis+cluster"
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    masked = mask(url)
    options = dict(pairs)
    repeated = sorted({k for k, _ in pairs if sum(1 for j, _ in pairs if j == k) > 1})
    if repeated:
        raise InvalidOption(f"option(s) given twice in {masked!r}: {', '.join(repeated)}")
    # redis+cluster://h1:p1,h2:p2: several seed nodes, so a process can start while one
    # of them is down (the first one that answers gives the cluster's layout)
    hosts = parts.netloc.rpartition("@")[2].split(",")
    if len(hosts) > 1 and not cluster:
        raise ConnectionError(f"cannot open {masked!r}: several hosts need redis+cluster://")
    seeds: list[tuple[str, int]] = []
    for host in hosts:
        if not host and (cluster or len(hosts) > 1):  # "h1:7000,": a seed left out
            raise ConnectionError(f"cannot open {masked!r}: an empty host in the host list")
        try:
            where = urlsplit(f"//{host}")
            seeds.append((where.hostname or "127.0.0.1", where.port or 6379))
        except ValueError as exc:
            raise ConnectionError(f"cannot open {masked!r}: bad port") from exc
    db_text = parts.path.strip("/") or "0"
    if not db_text.isdigit():
        raise ConnectionError(f"cannot open {masked!r}: the database must be a number")
    db = int(db_text)
    if cluster and db:
        raise ConnectionError(f"cannot open {masked!r}: Redis Cluster has only database 0")
    prefix = options.pop("prefix", "fairq:")
    if not prefix:  # an empty prefix would share every key name with other applications
        raise InvalidOption(f"prefix cannot be empty in {masked!r} (default fairq:)")
    if "{" in prefix or "}" in prefix:
        raise InvalidOption("the key prefix cannot contain { or } (they mark hash tags)")
    clock = options.pop("clock", "client").lower()
    if clock not in ("client", "server"):
        raise InvalidOption(f"clock must be client or server, got {clock!r}")
    timeout = _number(options, "timeout", 5.0, url)
    connect_timeout = _number(options, "connect_timeout", 2.0, url)
    max_connections = int(_number(options, "max_connections", 1024, url, "connections"))
    safety_poll = _number(options, "safety_poll", 5.0, url)
    if options:
        raise InvalidOption(f"unknown redis URL options: {', '.join(sorted(options))}")
    return RedisOptions(
        url=masked,
        cluster=cluster,
        host=seeds[0][0],
        port=seeds[0][1],
        seeds=seeds,
        db=db,
        username=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password else None,
        ssl=scheme == "rediss",
        prefix=prefix,
        server_clock=clock == "server",
        timeout=timeout,
        connect_timeout=connect_timeout,
        max_connections=max_connections,
        safety_poll=safety_poll,
    )


Client = Any  # redis.asyncio.Redis or RedisCluster (both untyped enough to need Any)


def make_client(opts: RedisOptions) -> Client:
    """The redis-py client for ``opts``: one connection pool (per node on Cluster)."""
    common: dict[str, Any] = {
        "username": opts.username,
        "password": opts.password,
        "socket_timeout": opts.timeout,
        "socket_connect_timeout": opts.connect_timeout,
        # one quick retry on a fresh connection: a pooled connection to a restarted Redis
        # fails once; the retry either succeeds or fails fast
        "retry": Retry(ExponentialBackoff(cap=0.2, base=0.05), 1),
        "retry_on_error": [rex.ConnectionError, rex.TimeoutError],
        "health_check_interval": 15,
    }
    if opts.cluster:
        return RedisCluster(
            startup_nodes=[ClusterNode(h, p) for h, p in opts.seeds or [(opts.host, opts.port)]],
            ssl=opts.ssl,
            max_connections=opts.max_connections,
            **common,
        )
    return aioredis.Redis(
        host=opts.host,
        port=opts.port,
        db=opts.db,
        ssl=opts.ssl,
        max_connections=opts.max_connections,
        **common,
    )


def make_pubsub_client(opts: RedisOptions, host: str, port: int) -> Any:
    """A plain client for pub/sub (on Cluster, to one node: PUBLISH reaches every node)."""
    return aioredis.Redis(
        host=host,
        port=port,
        db=opts.db,
        ssl=opts.ssl,
        username=opts.username,
        password=opts.password,
        socket_connect_timeout=opts.connect_timeout,
        socket_keepalive=True,
        health_check_interval=10,
    )


def driver_error(exc: BaseException, url: str) -> NoReturn:
    """Raise the fairq error for a driver error (``raise ... from exc``). A task being
    cancelled gets its cancellation back: the driver may report a command cut short by
    the cancel as a connection error, and a retrying caller would then never stop."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError() from exc
    if isinstance(exc, rex.AuthenticationError | rex.AuthorizationError):
        raise ConnectionError(f"redis at {url!r} refused the credentials: {exc}") from exc
    cluster = url.startswith("redis+cluster")
    if isinstance(exc, rex.ConnectionError | rex.TimeoutError | OSError):
        if cluster:  # the URL names the seed node; redis-py's text names the one that failed
            raise ConnectionError(
                f"redis cluster at {url!r}: a node is not reachable: {exc}"
            ) from exc
        raise ConnectionError(f"redis at {url!r} is not reachable: {exc}") from exc
    if isinstance(exc, rex.ResponseError) and "NOAUTH" in str(exc):
        raise ConnectionError(f"redis at {url!r} needs a password: {exc}") from exc
    if isinstance(exc, rex.ClusterError | rex.TryAgainError):
        # CLUSTERDOWN / MASTERDOWN / TRYAGAIN: a node failed and the cluster has not
        # settled yet (every node answers so until a replica took over or the node is
        # back) — an outage like any other: retried by a Worker, not a fatal error
        raise ConnectionError(f"redis cluster at {url!r} is not serving now: {exc}") from exc
    if isinstance(exc, rex.ReadOnlyError) and cluster:  # a primary demoted under us
        raise ConnectionError(f"redis cluster at {url!r} answered from a replica: {exc}") from exc
    if isinstance(exc, rex.RedisClusterException):
        raise ConnectionError(f"redis cluster at {url!r}: {exc}") from exc
    raise BackendError(f"redis at {url!r}: {exc}") from exc


def lua_string(text: str) -> str:
    """``text`` as a Lua long-bracket string literal."""
    level = 0
    while f"]{'=' * level}]" in text:
        level += 1
    eq = "=" * level
    return f"[{eq}[{text}]{eq}]"


class Script:
    """One operation's script: the library prepended, its SHA, called by EVALSHA."""

    __slots__ = ("name", "sha", "source")

    def __init__(self, name: str, source: str) -> None:
        import hashlib

        self.name = name
        self.source = source
        self.sha = hashlib.sha1(source.encode("utf-8")).hexdigest()


class ScriptError(Exception):
    """A script's own error reply (``FQ:<code>``), with its values."""

    def __init__(self, code: str, values: Sequence[str]) -> None:
        super().__init__(code, *values)
        self.code = code
        self.values = list(values)


class Scripts:
    """Every script of ``scripts/``, each with the ``scripts/lib/*.lua`` it uses (and the
    constants from ``constants``) prepended, so one place holds each rule.

    A library is prepended only if the script, or a library prepended after it, names one
    of its top-level locals: Lua runs a script's whole chunk on every call, and making the
    closures and tables of every library cost ~55 µs per call, more than many operations
    themselves. ``core`` always comes first; a library only uses those before it."""

    LIBS = ("core", "queue", "topic", "claim", "attention", "room")
    _DEFINED = re.compile(r"^local\s+(?:function\s+)?([\w\s,]+?)\s*(?:=|\()", re.M)

    def __init__(self, constants: dict[str, str]) -> None:
        root = resources.files(__package__).joinpath("scripts")
        head = "".join(f"local {k} = {lua_string(v)}\n" for k, v in constants.items())
        libs: list[tuple[str, set[str]]] = []
        for lib in self.LIBS:
            path = root.joinpath("lib", f"{lib}.lua")
            if path.is_file():
                text = path.read_text("utf-8")
                names = {n.strip() for m in self._DEFINED.findall(text) for n in m.split(",")}
                libs.append((text, {n for n in names if n}))
        self.by_name: dict[str, Script] = {}
        for entry in root.iterdir():
            if entry.name.endswith(".lua"):
                name = entry.name[:-4]
                body = entry.read_text("utf-8")
                self.by_name[name] = Script(name, head + self._with_libs(libs, body))

    @staticmethod
    def _with_libs(libs: list[tuple[str, set[str]]], body: str) -> str:
        def words_of(text: str) -> set[str]:  # the names a chunk's code uses
            code = re.sub(r"--[^\n]*", "", text)  # not its comments or short strings
            return set(re.findall(r"\w+", re.sub(r"'[^'\n]*'|\"[^\"\n]*\"", "", code)))

        words = words_of(body)
        chosen: list[str] = []
        for i, (text, names) in reversed(list(enumerate(libs))):
            if i == 0 or names & words:
                chosen.append(text)
                words |= words_of(text)
        return "\n".join(reversed(chosen)) + "\n" + body

    def __getitem__(self, name: str) -> Script:
        return self.by_name[name]


async def run_script(
    client: Client, script: Script, keys: Sequence[str], args: Sequence[Any]
) -> Any:
    """EVALSHA ``script``; after ``NOSCRIPT`` (a restarted or failed-over Redis, another
    Cluster node) EVAL its source once, which also caches it again."""
    try:
        got = await client.evalsha(script.sha, len(keys), *keys, *args)
    except rex.NoScriptError:
        got = await client.eval(script.source, len(keys), *keys, *args)
    raise_if_cancelled()
    return got


def raise_if_cancelled() -> None:
    """Raise ``CancelledError`` if the running task was asked to stop. redis-py finishes
    a command it is cancelled in (it must read the reply to keep the connection usable)
    and returns the reply as if nothing happened, so the cancel would be lost and a loop
    such as ``run_admitter`` would never stop; every call through this module checks."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError()


def script_error(exc: rex.ResponseError) -> ScriptError | None:
    """The script's own error in a ``ResponseError``, if it is one."""
    text = str(exc)
    at = text.find(ERROR_PREFIX)
    if at < 0:
        return None
    body = text[at + len(ERROR_PREFIX) :]
    # Redis may append " script: ..., on @user_script:..." to errors raised by scripts
    body = re.sub(r" script: \w+, on @user_script:\d+\.$", "", body)
    code, *values = body.split("\t")
    return ScriptError(code, values)


# RedisClusterException is not a RedisError (a node that is not a cluster, a lost slot map)
DriverErrors: tuple[type[BaseException], ...] = (rex.RedisError, rex.RedisClusterException, OSError)


def torn_connection(exc: AttributeError) -> bool:
    """Whether ``exc`` was raised inside redis-py itself: its asyncio connection, closed by
    a failover while a command was being sent, has no stream left ('NoneType' object has
    no attribute 'writelines', redis-py 5.3 on a Redis Cluster). An engine out of reach
    like any other, not a fault of fairq's."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and tb.tb_frame.f_code.co_filename.startswith(_REDIS_PY)


def torn_error(exc: AttributeError, url: str) -> NoReturn:
    """Raise an ``AttributeError`` caught around a command: as the engine out of reach
    (:func:`driver_error`) if redis-py raised it itself (:func:`torn_connection`), else as
    it is (a fault of fairq's)."""
    if not torn_connection(exc):
        raise exc
    driver_error(rex.ConnectionError(f"connection closed while in use: {exc}"), url)


_REDIS_PY = os.path.dirname(redis.__file__) + os.sep  # redis-py's own files


Callback = Callable[[str], None]
