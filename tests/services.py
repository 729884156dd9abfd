"""The services the tests need and how to reach them, importable from any test folder
(``tests/`` is on the import path through the root conftest): which backend needs which
server, the skip-or-fail rule, and PostgreSQL's per-process test database and schemas."""

from __future__ import annotations

import os
import secrets
import socket
from urllib.parse import parse_qs, urlsplit

import pytest

SERVICES: dict[str, tuple[str, int]] = {  # backend -> (host, port) it needs
    "postgres": ("127.0.0.1", 5432),
}

# PostgreSQL: one database per test process (so parallel workers and other sessions never
# share one), made on first use and dropped at the end; each test gets its own schema in it.
PG_SERVER = "postgresql://postgres@127.0.0.1:5432"
_pg_database: str | None = None


def service_up(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def require(backend: str) -> None:
    """Skip when the backend's service is down; fail instead with FAIRQ_REQUIRE_SERVICES=1."""
    need = SERVICES.get(backend)
    if need and not service_up(*need):
        if os.environ.get("FAIRQ_REQUIRE_SERVICES") == "1":
            pytest.fail(f"{backend} at {need[0]}:{need[1]} is down and FAIRQ_REQUIRE_SERVICES=1")
        pytest.skip(f"{backend} at {need[0]}:{need[1]} is not reachable")


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


def drop_pg_database() -> None:
    """Drop this process's test database, if it made one."""
    global _pg_database
    if _pg_database is not None:
        import psycopg

        with psycopg.connect(f"{PG_SERVER}/postgres", autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{_pg_database}" WITH (FORCE)')
        _pg_database = None


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
