"""The services the engine backends need, for every test folder (``tests/`` is on the
import path): is a service up, skip or fail when it is not, each backend's test URL in a
namespace of the test's own (a Redis key prefix, a PostgreSQL schema in this process's
test database, a RabbitMQ vhost) and how to remove it afterwards.

A test that needs a service skips when the service is down, unless
FAIRQ_REQUIRE_SERVICES=1 (CI), where it fails.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

import pytest

BACKENDS = ["memory", "sqlite", "redis", "redis-cluster", "postgres", "amqp"]
SERVICES: dict[str, tuple[str, int]] = {  # backend -> (host, port) it needs
    "redis": ("127.0.0.1", 6379),
    "postgres": ("127.0.0.1", 5432),
    "amqp": ("127.0.0.1", 5672),
}
#: the URL scheme of a backend whose test name is not its scheme
SCHEMES = {"redis-cluster": "redis+cluster"}
REDIS_URL = "redis://127.0.0.1:6379/0"
RABBIT_MANAGEMENT = ("127.0.0.1", 15672)


def service_up(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def require(backend: str) -> None:
    if backend == "redis-cluster":  # the test session starts its own Cluster
        from redis_servers import available

        if not available():
            if os.environ.get("FAIRQ_REQUIRE_SERVICES") == "1":
                pytest.fail("redis-server is not installed and FAIRQ_REQUIRE_SERVICES=1")
            pytest.skip("redis-server is not installed (the test Cluster needs it)")
        return
    need = SERVICES.get(backend)
    if need and not service_up(*need):
        if os.environ.get("FAIRQ_REQUIRE_SERVICES") == "1":
            pytest.fail(f"{backend} at {need[0]}:{need[1]} is down and FAIRQ_REQUIRE_SERVICES=1")
        pytest.skip(f"{backend} at {need[0]}:{need[1]} is not reachable")


def rabbit_management() -> Any:
    """The management API of the shared RabbitMQ, its plugin enabled if it was not (the
    one change the tests make to that broker; enabling is idempotent)."""
    from fairq.backends.amqp.management import Management

    if not service_up(*RABBIT_MANAGEMENT):
        tool = shutil.which("rabbitmq-plugins")
        if tool is None:
            pytest.fail("the RabbitMQ management API is down and rabbitmq-plugins is missing")
        subprocess.run([tool, "enable", "rabbitmq_management"], check=True, capture_output=True)
        deadline = time.monotonic() + 60
        while not service_up(*RABBIT_MANAGEMENT):
            if time.monotonic() > deadline:
                pytest.fail("the RabbitMQ management API did not come up")
            time.sleep(0.5)
    return Management(f"http://{RABBIT_MANAGEMENT[0]}:{RABBIT_MANAGEMENT[1]}", "guest", "guest")


@contextlib.contextmanager
def rabbit_vhost() -> Iterator[str]:
    """A vhost of the caller's own on the shared RabbitMQ (guest may use it), deleted after."""
    require("amqp")
    api = rabbit_management()
    name = f"fairq-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:  # a vhost made whose permissions call failed (a busy broker) goes too
        api.add_vhost(name, "guest")
        yield name
    finally:
        api.delete_vhost(name)


def backend_url(backend: str, tmp_path: Path, namespace: str) -> str:
    if backend == "memory":
        return "memory://"
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'fairq.db'}"
    if backend == "redis":  # a key prefix of the test's own on the shared Redis
        return f"{REDIS_URL}?prefix=t-{namespace}:"
    if backend == "redis-cluster":  # the same on the test process's own Cluster
        from redis_servers import session_cluster

        return f"{session_cluster()}?prefix=t-{namespace}:"
    if backend == "postgres":  # a schema of the test's own in this process's database
        return pg_url(re.sub(r"[^a-z0-9_]", "_", f"t_{namespace}".lower()))
    if backend == "amqp":  # a vhost of the test's own; its store a key prefix on Redis
        # (FAIRQ_AMQP_STORE=sqlite|postgres runs the suite with another store)
        store = os.environ.get("FAIRQ_AMQP_STORE", "redis")
        store_url = backend_url(store, tmp_path, namespace)
        return f"amqp://guest:guest@127.0.0.1:5672/{namespace}?store={quote(store_url, safe='')}"
    raise AssertionError(f"no URL for backend {backend}")


def drop_namespace(url: str) -> None:
    """Remove what a test left in its namespace: a Redis key prefix, a PostgreSQL schema
    (the embedded backends' files go with the test's temporary directory)."""
    if url.startswith("amqp"):  # the vhost goes with the namespace fixture; the store here
        store = parse_qs(urlsplit(url).query).get("store")
        if store:
            drop_namespace(store[0])
    elif url.startswith("redis"):
        from redis_servers import drop_prefix

        drop_prefix(url)
    elif url.startswith("postgresql://"):
        import psycopg

        parts = urlsplit(url)
        schema = parse_qs(parts.query).get("schema", ["fairq"])[0]
        with psycopg.connect(f"{PG_SERVER}{parts.path}", autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


# -- PostgreSQL: one database per test process (so parallel workers and other sessions never
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


def drop_pg_database() -> None:
    """Drop this process's test database, if it made one."""
    global _pg_database
    if _pg_database is not None:
        import psycopg

        with psycopg.connect(f"{PG_SERVER}/postgres", autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{_pg_database}" WITH (FORCE)')
        _pg_database = None


def pg_connections() -> int:
    """How many connections this process's test database has now (the tests of one
    process run one at a time, so: the running test's, plus any an earlier test left)."""
    import psycopg

    with psycopg.connect(f"{PG_SERVER}/postgres", autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (pg_database(),)
        ).fetchone()
    assert row is not None
    return int(row[0])


def pg_url(schema: str | None = None, **options: str) -> str:
    """A URL on this process's test database, in a new schema unless one is named."""
    schema = schema or f"t_{secrets.token_hex(6)}"
    extra = "".join(f"&{k}={v}" for k, v in options.items())
    return f"{PG_SERVER}/{pg_database()}?schema={schema}{extra}"
