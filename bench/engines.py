"""Where ``bench/attention.py`` runs its strategies: SQLite, Redis or PostgreSQL, with a
fresh namespace for every run and the engine's own count of what an idle worker costs.

* ``sqlite``: a new database file in a temporary directory per run.
* ``redis``: a private ``redis-server`` (no persistence) that the bench starts on a free
  loopback port of 16450-16499 and stops at the end; every run uses a key prefix of its
  own and the server is flushed (``FLUSHALL``) after it. With ``--url redis://...`` the
  bench uses that server instead and deletes only its own prefixes' keys (never a flush).
* ``postgres``: a schema of its own per run (``?schema=``) on ``--url`` (default: the
  shared server, ``postgresql://postgres@127.0.0.1:5432/postgres``), dropped afterwards.

:class:`IdleProbe` counts, over the idle window of a strategy, what the engine itself saw
besides the backend calls the bench counts in Python: on Redis the commands it ran
(``INFO commandstats``, scripts' inner commands included) and, from ``MONITOR``, how many
of them named a per-store key; on PostgreSQL the statements the broker sent (counted at
psycopg's cursor) and how many of them carried a per-store queue's name.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import socket
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fairq.backends.base import Backend

ROOT = Path(__file__).resolve().parents[1]
ENGINES = ("sqlite", "redis", "postgres")
PG_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
REDIS_PORTS = range(16450, 16500)  # this bench's share of the tests' 16400-16499
REDIS_CLI = shutil.which("redis-cli") or "/usr/bin/redis-cli"


@dataclass(frozen=True)
class Engine:
    """An engine as the bench's processes pass it on: ``backend``, the server's URL (Redis:
    ``redis://127.0.0.1:PORT/0``; PostgreSQL: the database) and whether the bench started
    the Redis server itself (then it may flush it)."""

    backend: str = "sqlite"
    url: str = ""
    private: bool = False

    def args(self) -> list[str]:
        """The command-line options that give a child process this engine."""
        out = ["--backend", self.backend]
        if self.url:
            out += ["--url", self.url]
        if self.private:
            out.append("--private-server")
        return out

    @property
    def redis_port(self) -> int:
        m = re.match(r"redis://(?:[^@/]*@)?[^:/]+:(\d+)", self.url)
        return int(m.group(1)) if m else 6379

    def flush(self) -> None:
        """Between strategies: empty the private Redis server (nothing elsewhere)."""
        if self.backend == "redis" and self.private:
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
    the end) unless ``url`` names a server; PostgreSQL's database URL."""
    if backend == "sqlite":
        yield Engine("sqlite")
        return
    if backend == "postgres":
        yield Engine("postgres", url or PG_URL)
        return
    if backend != "redis":
        raise ValueError(f"unknown backend {backend!r}: one of {', '.join(ENGINES)}")
    if url:
        yield Engine("redis", url)
        return
    sys.path.insert(0, str(ROOT / "tests"))
    from redis_servers import RedisServer

    port = next((p for p in REDIS_PORTS if _free(p)), None)
    if port is None:
        raise RuntimeError("no free port in 16450-16499 for the bench's redis-server")
    with tempfile.TemporaryDirectory(prefix="fairq-attbench-") as work:
        server = RedisServer(Path(work), port, "--appendonly", "no").start()
        try:
            yield Engine("redis", server.url, private=True)
        finally:
            server.stop()


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
    schema = f"bench_att_{tag}_{os.getpid()}_{int(time.time())}"
    sep = "&" if "?" in engine.url else "?"
    try:
        yield f"{engine.url}{sep}schema={schema}"
    finally:
        import psycopg

        base = engine.url.split("?", 1)[0]
        async with await psycopg.AsyncConnection.connect(base, autocommit=True) as c:
            await c.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def _drop_redis(engine: Engine, prefix: str) -> None:
    import redis

    with redis.Redis.from_url(engine.url) as r:
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

    Redis: ``INFO commandstats`` before and after (``info`` itself left out) — every
    command the server ran, those inside scripts included — and a ``redis-cli MONITOR``
    over the window, whose lines naming a per-store queue (``store-N``) are counted.
    PostgreSQL: every statement the broker's connections executed (psycopg's
    ``AsyncCursor.execute`` wrapped for the window), and those whose parameters name a
    per-store queue. SQLite: nothing beyond the backend calls the bench counts itself.
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._monitor: asyncio.subprocess.Process | None = None
        self._lines: list[str] = []
        self._reader: asyncio.Task[None] | None = None
        self._before = 0
        self._statements = 0
        self._per_store = 0
        self._undo: Any = None
        self._t0 = 0.0
        self.sample: list[str] = []  # Redis: the first MONITOR lines of the window

    async def start(self) -> None:
        self._t0 = time.monotonic()
        if self.engine.backend == "redis":
            self._before = await asyncio.to_thread(self._commands)
            self._monitor = await asyncio.create_subprocess_exec(
                REDIS_CLI,
                "-u",
                self.engine.url,
                "monitor",
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.DEVNULL,
            )
            self._reader = asyncio.create_task(self._read(self._monitor))
        elif self.engine.backend == "postgres":
            self._patch_psycopg()

    async def stop(self) -> dict[str, float]:
        seconds = time.monotonic() - self._t0
        if self.engine.backend == "redis":
            assert self._monitor is not None and self._reader is not None
            self._monitor.terminate()
            await self._monitor.wait()
            await self._reader
            after = await asyncio.to_thread(self._commands)
            lines = [ln for ln in self._lines if ln[:1].isdigit() and not _probe_line(ln)]
            self.sample = lines[:40]
            per_store = sum(1 for ln in lines if PER_STORE.search(ln))
            return {
                "seconds": seconds,
                "redis_commands_per_s": (after - self._before) / seconds,
                "redis_monitor_per_s": len(lines) / seconds,
                "redis_per_store_commands_per_s": per_store / seconds,
            }
        if self.engine.backend == "postgres":
            self._undo()
            return {
                "seconds": seconds,
                "pg_statements_per_s": self._statements / seconds,
                "pg_per_store_statements_per_s": self._per_store / seconds,
            }
        return {"seconds": seconds}

    async def _read(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        async for line in proc.stdout:
            self._lines.append(line.decode(errors="replace"))

    def _commands(self) -> int:
        import redis

        with redis.Redis.from_url(self.engine.url) as r:
            stats = r.info("commandstats")
        return sum(int(v["calls"]) for k, v in stats.items() if k not in ("cmdstat_info", "info"))

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
