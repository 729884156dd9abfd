"""Where ``bench/attention.py`` runs its strategies: SQLite, Redis, PostgreSQL or RabbitMQ,
with a fresh namespace for every run and the engine's own count of what an idle worker costs.

* ``sqlite``: a new database file in a temporary directory per run.
* ``redis``: a private ``redis-server`` (no persistence) that the bench starts on a free
  loopback port of 16450-16499 and stops at the end; every run uses a key prefix of its
  own and the server is flushed (``FLUSHALL``) after it. With ``--url redis://...`` the
  bench uses that server instead and deletes only its own prefixes' keys (never a flush).
* ``postgres``: a schema of its own per run (``?schema=``) on ``--url`` (default: the
  shared server, ``postgresql://postgres@127.0.0.1:5432/postgres``), dropped afterwards.
* ``amqp``: a RabbitMQ vhost of its own per run on ``--url`` (default the shared broker,
  ``amqp://guest:guest@127.0.0.1:5672``), made and deleted through the management API
  (its plugin enabled first if it is off, as the test suite does; no other vhost is
  touched), with its ``?store=`` a key prefix on a private ``redis-server`` started as for
  ``redis`` (flushed after every strategy).

:class:`IdleProbe` counts, over the idle window of a strategy, what the engine itself saw
besides the backend calls the bench counts in Python: on Redis the commands it ran
(``INFO commandstats``, scripts' inner commands included) and, from ``MONITOR``, how many
of them named a per-store key; on PostgreSQL the statements the broker sent (counted at
psycopg's cursor) and how many of them carried a per-store queue's name; on RabbitMQ the
store's Redis as above (the tickets' queues are ``fairq:store-N``), every AMQP method the
broker's channels sent (aiormq's ``Channel`` methods wrapped for the window) and those that
name a per-store queue, and the vhost's message counters from the management API.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlsplit

from fairq.backends.base import Backend

ROOT = Path(__file__).resolve().parents[1]
ENGINES = ("sqlite", "redis", "postgres", "amqp")
PG_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
AMQP_URL = "amqp://guest:guest@127.0.0.1:5672"
REDIS_PORTS = range(16450, 16500)  # this bench's share of the tests' 16400-16499
REDIS_CLI = shutil.which("redis-cli") or "/usr/bin/redis-cli"


@dataclass(frozen=True)
class Engine:
    """An engine as the bench's processes pass it on: ``backend``, the server's URL (Redis:
    ``redis://127.0.0.1:PORT/0``; PostgreSQL: the database; RabbitMQ: the broker without a
    vhost), RabbitMQ's store (the Redis server's URL) and whether the bench started the
    Redis server itself (then it may flush it)."""

    backend: str = "sqlite"
    url: str = ""
    private: bool = False
    store: str = ""

    def args(self) -> list[str]:
        """The command-line options that give a child process this engine."""
        out = ["--backend", self.backend]
        if self.url:
            out += ["--url", self.url]
        if self.store:
            out += ["--store", self.store]
        if self.private:
            out.append("--private-server")
        return out

    @property
    def redis_url(self) -> str:
        """The Redis server the engine keeps its data in (RabbitMQ: its store's)."""
        return self.store if self.backend == "amqp" else self.url

    @property
    def redis_port(self) -> int:
        m = re.match(r"redis://(?:[^@/]*@)?[^:/]+:(\d+)", self.redis_url)
        return int(m.group(1)) if m else 6379

    def flush(self) -> None:
        """Between strategies: empty the private Redis server (nothing elsewhere)."""
        if self.backend in ("redis", "amqp") and self.private:
            import redis

            with redis.Redis(port=self.redis_port) as r:
                r.flushall()


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@contextlib.contextmanager
def started(backend: str, url: str | None) -> Iterator[Engine]:
    """The engine for a whole bench run: a private redis-server started (and stopped at
    the end) unless ``url`` names a server; PostgreSQL's database URL; RabbitMQ's broker
    (its management API up) with a private redis-server as its store."""
    if backend == "sqlite":
        yield Engine("sqlite")
        return
    if backend == "postgres":
        yield Engine("postgres", url or PG_URL)
        return
    if backend == "amqp":
        broker = (url or AMQP_URL).split("?", 1)[0].rstrip("/")
        management(broker)
        with private_redis() as store:
            yield Engine("amqp", broker, private=True, store=store)
        return
    if backend != "redis":
        raise ValueError(f"unknown backend {backend!r}: one of {', '.join(ENGINES)}")
    if url:
        yield Engine("redis", url)
        return
    with private_redis() as server_url:
        yield Engine("redis", server_url, private=True)


@contextlib.contextmanager
def private_redis() -> Iterator[str]:
    """A redis-server of the bench's own (no persistence) on a free port of 16450-16499,
    stopped when the block ends; its URL."""
    sys.path.insert(0, str(ROOT / "tests"))
    from redis_servers import RedisServer

    port = next((p for p in REDIS_PORTS if _free(p)), None)
    if port is None:
        raise RuntimeError("no free port in 16450-16499 for the bench's redis-server")
    with tempfile.TemporaryDirectory(prefix="fairq-attbench-") as work:
        server = RedisServer(Path(work), port, "--appendonly", "no").start()
        try:
            yield server.url
        finally:
            server.stop()


def management(broker: str) -> Any:
    """The management API of ``broker``'s RabbitMQ (a ``Management`` client as its user),
    the ``rabbitmq_management`` plugin enabled first if the API is down — the one change the
    test suite makes to the shared broker too (enabling is idempotent)."""
    from fairq.backends.amqp.link import parse_url
    from fairq.backends.amqp.management import Management

    parsed = parse_url(f"{broker}/?store=memory://")
    if parsed.management is None:
        raise RuntimeError("the amqp bench needs RabbitMQ's management API")
    m = re.match(r"https?://([^:/]+):(\d+)", parsed.management)
    host, port = (m.group(1), int(m.group(2))) if m else (parsed.host, 15672)
    if not _listening(host, port):
        tool = shutil.which("rabbitmq-plugins")
        if tool is None:
            raise RuntimeError("RabbitMQ's management API is down and rabbitmq-plugins is missing")
        subprocess.run([tool, "enable", "rabbitmq_management"], check=True, capture_output=True)
        deadline = time.monotonic() + 60
        while not _listening(host, port):
            if time.monotonic() > deadline:
                raise RuntimeError("RabbitMQ's management API did not come up")
            time.sleep(0.5)
    return Management(parsed.management, parsed.user, parsed.password, timeout=120.0)


def _listening(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


@contextlib.asynccontextmanager
async def fresh(engine: Engine, label: str) -> AsyncIterator[str]:
    """A broker URL whose namespace is new and is removed when the block ends."""
    tag = re.sub(r"[^a-z0-9]", "_", label.lower())
    if engine.backend == "sqlite":
        with tempfile.TemporaryDirectory(prefix="fairq-attbench-") as tmp:
            yield f"sqlite:///{tmp}/{tag}.db"
        return
    if engine.backend == "redis":
        prefix = f"att-{tag}-{os.getpid()}:"
        try:
            yield f"{engine.url}?prefix={prefix}"
        finally:
            await asyncio.to_thread(_drop_redis, engine, prefix)
        return
    if engine.backend == "amqp":
        prefix = f"att-{tag}-{os.getpid()}:"
        store = f"{engine.store}?prefix={prefix}"
        api = await asyncio.to_thread(management, engine.url)
        vhost = f"fairq-attbench-{tag}-{os.getpid()}-{secrets.token_hex(3)}"
        try:  # a vhost whose permissions call failed (a busy broker) goes too
            await asyncio.to_thread(api.add_vhost, vhost, _user(engine.url))
            yield f"{engine.url}/{vhost}?timeout=60&store={quote(store, safe='')}"
        finally:
            await asyncio.to_thread(api.delete_vhost, vhost)
            await asyncio.to_thread(_drop_redis, engine, prefix)
        return
    schema = f"bench_att_{tag}_{os.getpid()}_{int(time.time())}"
    sep = "&" if "?" in engine.url else "?"
    try:
        yield f"{engine.url}{sep}schema={schema}"
    finally:
        import psycopg

        base = engine.url.split("?", 1)[0]
        async with await psycopg.AsyncConnection.connect(base, autocommit=True) as c:
            await c.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def _user(broker: str) -> str:
    from fairq.backends.amqp.link import parse_url

    return parse_url(f"{broker}/?store=memory://").user


def _drop_redis(engine: Engine, prefix: str) -> None:
    import redis

    with redis.Redis.from_url(engine.redis_url) as r:
        if engine.private:
            r.flushall()
            return
        keys = list(r.scan_iter(match=f"{prefix}*", count=1000))
        for i in range(0, len(keys), 1000):
            r.delete(*keys[i : i + 1000])


PER_STORE = re.compile(r"store-\d+")
# the probe's own commands (its INFO, its connections' hand-shakes, MONITOR itself)
_PROBE = ("info", "client", "hello", "monitor", "command")


def _probe_command(stat: str) -> bool:
    name = stat.removeprefix("cmdstat_").split("|")[0].lower()
    return name in _PROBE


def _probe_line(line: str) -> bool:
    m = re.search(r'\] "([^"]+)"', line)
    return m is not None and m.group(1).lower() in _PROBE


class IdleProbe:
    """What the engine did over an idle window, seen from the engine's side.

    Redis (and RabbitMQ's store): ``INFO commandstats`` before and after (``info`` itself
    left out) — every command the server ran, those inside scripts included — and a
    ``redis-cli MONITOR`` over the window, whose lines naming a per-store queue
    (``store-N``; the tickets' ``fairq:store-N`` on RabbitMQ) are counted.
    PostgreSQL: every statement the broker's connections executed (psycopg's
    ``AsyncCursor.execute`` wrapped for the window), and those whose parameters name a
    per-store queue. RabbitMQ: every AMQP method the broker's channels sent (aiormq's
    ``Channel`` methods wrapped for the window: ``basic_get``, ``basic_publish``,
    ``queue_declare`` ...), those naming a per-store queue apart, and the management API's
    message counters of the run's vhost (``basic.get`` asked, empty or not; publishes)
    and of its per-store queues, before and after — RabbitMQ samples those every 5 s
    (``collect_statistics_interval``), so the probe waits 6 s before its first read (the
    counters then hold all that came before) and the window's last seconds may be missed.
    SQLite: nothing beyond the backend calls the bench counts itself.
    """

    def __init__(self, engine: Engine, url: str = "") -> None:
        self.engine = engine
        self.vhost = unquote(urlsplit(url).path.lstrip("/")) if engine.backend == "amqp" else ""
        self._monitor: asyncio.subprocess.Process | None = None
        self._lines: list[str] = []
        self._reader: asyncio.Task[None] | None = None
        self._before = 0
        self._rabbit_before: dict[str, int] = {}
        self._statements = 0
        self._per_store = 0
        self._methods: Counter[str] = Counter()
        self._undo: Any = None
        self._t0 = 0.0
        self.sample: list[str] = []  # Redis: the first MONITOR lines of the window

    async def start(self) -> None:
        if self.engine.backend == "amqp":
            # RabbitMQ's counters are as of its last sample: wait one sampling interval so
            # that the "before" holds everything done before the window
            await asyncio.sleep(RABBIT_STATS_INTERVAL + 1.0)
            self._rabbit_before = await asyncio.to_thread(self._rabbit_counts)
        if self.engine.backend in ("redis", "amqp"):
            self._before = await asyncio.to_thread(self._commands)
            self._monitor = await asyncio.create_subprocess_exec(
                REDIS_CLI,
                "-u",
                self.engine.redis_url,
                "monitor",
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.DEVNULL,
            )
            self._reader = asyncio.create_task(self._read(self._monitor))
        if self.engine.backend == "postgres":
            self._patch_psycopg()
        elif self.engine.backend == "amqp":
            self._patch_aiormq()
        self._t0 = time.monotonic()

    async def stop(self) -> dict[str, float]:
        seconds = time.monotonic() - self._t0
        out: dict[str, float] = {"seconds": seconds}
        if self._undo is not None:
            self._undo()
        if self.engine.backend in ("redis", "amqp"):
            assert self._monitor is not None and self._reader is not None
            self._monitor.terminate()
            await self._monitor.wait()
            await self._reader
            after = await asyncio.to_thread(self._commands)
            lines = [ln for ln in self._lines if ln[:1].isdigit() and not _probe_line(ln)]
            self.sample = lines[:40]
            per_store = sum(1 for ln in lines if PER_STORE.search(ln))
            out["redis_commands_per_s"] = (after - self._before) / seconds
            out["redis_monitor_per_s"] = len(lines) / seconds
            out["redis_per_store_commands_per_s"] = per_store / seconds
        if self.engine.backend == "postgres":
            out["pg_statements_per_s"] = self._statements / seconds
            out["pg_per_store_statements_per_s"] = self._per_store / seconds
        if self.engine.backend == "amqp":
            rabbit = await asyncio.to_thread(self._rabbit_counts)
            out["amqp_methods_per_s"] = sum(self._methods.values()) / seconds
            out["amqp_per_store_methods_per_s"] = self._per_store / seconds
            for k, v in rabbit.items():
                out[f"rabbitmq_{k}_per_s"] = (v - self._rabbit_before.get(k, 0)) / seconds
            self.sample += [f"amqp {name}: {n}" for name, n in self._methods.most_common()]
        return out

    async def _read(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        async for line in proc.stdout:
            self._lines.append(line.decode(errors="replace"))

    def _commands(self) -> int:
        import redis

        with redis.Redis.from_url(self.engine.redis_url) as r:
            stats = r.info("commandstats")
        return sum(int(v["calls"]) for k, v in stats.items() if k not in ("cmdstat_info", "info"))

    def _rabbit_counts(self) -> dict[str, int]:
        """The vhost's cumulative message counters as RabbitMQ last sampled them: gets
        (``basic.get``, empty answers included), publishes, and the operations on the
        per-store queues (gets, deliveries, publishes into them)."""
        api = management(self.engine.url)
        v = quote(self.vhost, safe="")
        stats = (api.call("GET", f"/vhosts/{v}") or {}).get("message_stats") or {}
        out = {
            "gets": sum(int(stats.get(k, 0)) for k in ("get", "get_no_ack", "get_empty")),
            "publishes": int(stats.get("publish", 0)),
            "per_store_ops": 0,
        }
        page = 1
        while True:  # the per-store queues' own counters, one paged listing
            query = (
                f"page={page}&page_size=500&use_regex=true&name={quote('^store-', safe='')}"
                "&columns=name,message_stats"
            )
            got = api.call("GET", f"/queues/{v}?{query}") or {}
            for q in got.get("items", []):
                ms = q.get("message_stats") or {}
                out["per_store_ops"] += sum(int(ms.get(k, 0)) for k in _RABBIT_OPS)
            if page >= int(got.get("page_count") or 1):
                return out
            page += 1

    def _patch_psycopg(self) -> None:
        import psycopg

        cls = psycopg.AsyncCursor
        original = cls.execute
        probe = self

        async def execute(cur: Any, query: Any, params: Any = None, **kw: Any) -> Any:
            probe._statements += 1
            if params is not None and PER_STORE.search(repr(params)):
                probe._per_store += 1
            return await original(cur, query, params, **kw)

        cls.execute = execute  # type: ignore[assignment,method-assign]

        def undo() -> None:
            cls.execute = original  # type: ignore[method-assign]

        self._undo = undo

    def _patch_aiormq(self) -> None:
        import aiormq

        cls = aiormq.Channel
        originals = {name: getattr(cls, name) for name in AMQP_METHODS if hasattr(cls, name)}
        probe = self

        def counted(name: str, fn: Callable[..., Awaitable[Any]]) -> Any:
            async def method(ch: Any, *args: Any, **kw: Any) -> Any:
                probe._methods[name] += 1
                named = [a for a in (*args, *kw.values()) if isinstance(a, str)]
                if any(PER_STORE.search(a) for a in named):
                    probe._per_store += 1
                return await fn(ch, *args, **kw)

            return method

        for name, fn in originals.items():
            setattr(cls, name, counted(name, fn))

        def undo() -> None:
            for name, fn in originals.items():
                setattr(cls, name, fn)

        self._undo = undo


#: RabbitMQ's collect_statistics_interval (its default, 5 s; the shared broker's)
RABBIT_STATS_INTERVAL = 5.0
#: the AMQP methods a client sends that the RabbitMQ probe counts (aiormq.Channel's)
AMQP_METHODS = (
    "basic_get",
    "basic_publish",
    "basic_ack",
    "basic_nack",
    "basic_reject",
    "basic_consume",
    "basic_cancel",
    "basic_qos",
    "basic_recover",
    "queue_declare",
    "queue_bind",
    "queue_unbind",
    "queue_purge",
    "queue_delete",
    "exchange_declare",
    "exchange_bind",
    "exchange_delete",
    "confirm_delivery",
)
#: a queue's message counters the probe sums for the per-store queues
_RABBIT_OPS = ("get", "get_no_ack", "get_empty", "deliver", "deliver_no_ack", "publish")


class Counting:
    """Counts calls to the backend's methods (wraps them in place)."""

    def __init__(self, backend: Any) -> None:
        self.calls: Counter[str] = Counter()
        for name in dir(Backend):  # the seam's operations (not an engine's own helpers)
            if name.startswith("_") or name in ("wakeups", "clock", "poll_interval"):
                continue
            fn = getattr(backend, name)
            if asyncio.iscoroutinefunction(fn):
                setattr(backend, name, self._wrap(name, fn))

    def _wrap(self, name: str, fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            return await fn(*args, **kwargs)

        return counted
