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

import pytest

import fairq
from redis_servers import drop_prefix

BACKENDS = ["memory", "sqlite", "redis", "redis-cluster"]
SERVICES: dict[str, tuple[str, int]] = {  # backend -> (host, port) it needs
    "redis": ("127.0.0.1", 6379),
}
REDIS_URL = "redis://127.0.0.1:6379/0"


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
    if backend == "redis":
        # each test its own key prefix on the shared Redis, removed after the test
        return f"{REDIS_URL}?prefix=t-{secrets.token_hex(6)}:"
    raise AssertionError(f"no URL for backend {backend}")


def _require(backend: str) -> None:
    if backend == "redis-cluster":
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


@pytest.fixture(params=BACKENDS)
def backend_name(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    _require(name)
    return name


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A 3-master Redis Cluster of this test session (its own redis-servers on loopback
    ports 16400-16499), stopped at the end."""
    from redis_servers import RedisCluster

    cluster = RedisCluster(tmp_path_factory.mktemp("cluster")).start()
    try:
        yield cluster.url
    finally:
        cluster.stop()


@pytest.fixture
def url(backend_name: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    if backend_name == "redis-cluster":
        base = request.getfixturevalue("redis_cluster")
        u = f"{base}?prefix=t-{secrets.token_hex(6)}:"
    else:
        u = _url(backend_name, tmp_path)
    yield u
    if backend_name.startswith("redis"):
        drop_prefix(u)


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
