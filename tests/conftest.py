"""Shared fixtures: one broker per backend, so every conformance test runs on each.

A new backend plugs in by adding its name to BACKENDS and a branch to ``_url``. A
backend that needs a service skips when the service is down, unless
FAIRQ_REQUIRE_SERVICES=1 (CI), where it fails.
"""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

import fairq

BACKENDS = ["memory", "sqlite", "postgres"]
SERVICES: dict[str, tuple[str, int]] = {  # backend -> (host, port) it needs
    "postgres": ("127.0.0.1", 5432),
}

# PostgreSQL: one database per test process (so parallel workers and other sessions never
# share one), made on first use and dropped at the end; each test gets its own schema in it.
PG_SERVER = "postgresql://postgres@127.0.0.1:5432"
_pg_database: str | None = None


def pg_database() -> str:
    """This test process's PostgreSQL database (created on first use)."""
    global _pg_database
    if _pg_database is None:
        import psycopg

        name = f"fairq_test_{os.getpid()}"
        with psycopg.connect(f"{PG_SERVER}/postgres", autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"')
        _pg_database = name
    return _pg_database


def pg_url(schema: str | None = None, **options: str) -> str:
    """A URL on this process's test database, in a new schema unless one is named."""
    schema = schema or f"t_{secrets.token_hex(6)}"
    extra = "".join(f"&{k}={v}" for k, v in options.items())
    return f"{PG_SERVER}/{pg_database()}?schema={schema}{extra}"


def drop_namespace(url: str) -> None:
    """Remove what a test left in its namespace (a PostgreSQL schema); no-op for the rest."""
    if not url.startswith("postgresql://"):
        return
    import psycopg

    parts = urlsplit(url)
    schema = parse_qs(parts.query).get("schema", ["fairq"])[0]
    with psycopg.connect(f"{PG_SERVER}{parts.path}", autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture(scope="session", autouse=True)
def _drop_pg_database() -> Iterator[None]:
    yield
    if _pg_database is not None:
        import psycopg

        with psycopg.connect(f"{PG_SERVER}/postgres", autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{_pg_database}" WITH (FORCE)')


def service_up(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def _url(backend: str, tmp_path: Path) -> str:
    if backend == "memory":
        return "memory://"
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'fairq.db'}"
    if backend == "postgres":
        return pg_url()
    raise AssertionError(f"no URL for backend {backend}")


def _require(backend: str) -> None:
    need = SERVICES.get(backend)
    if need and not service_up(*need):
        if os.environ.get("FAIRQ_REQUIRE_SERVICES") == "1":
            pytest.fail(f"{backend} at {need[0]}:{need[1]} is down and FAIRQ_REQUIRE_SERVICES=1")
        pytest.skip(f"{backend} at {need[0]}:{need[1]} is not reachable")


@pytest.fixture(params=BACKENDS)
def backend_name(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    _require(name)
    return name


@pytest.fixture
def url(backend_name: str, tmp_path: Path) -> Iterator[str]:
    made = _url(backend_name, tmp_path)
    yield made
    drop_namespace(made)


@pytest.fixture
def clock() -> fairq.ManualClock:
    return fairq.ManualClock()


@pytest.fixture
async def broker(url: str, clock: fairq.ManualClock) -> AsyncIterator[fairq.Broker]:
    """A broker on a manual clock: tests move time with ``clock.advance``."""
    b = await fairq.connect(url, clock=clock)
    try:
        yield b
    finally:
        await b.close()


@pytest.fixture
async def live_broker(url: str) -> AsyncIterator[fairq.Broker]:
    """A broker on the real clock, for tests of waiting (long polls, blocked sends)."""
    b = await fairq.connect(url)
    try:
        yield b
    finally:
        await b.close()
