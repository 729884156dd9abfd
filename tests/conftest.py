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

BACKENDS = ["memory", "sqlite", "redis"]
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


def drop_prefix(url: str) -> int:
    """Delete every key under the test URL's prefix (Redis); return how many there were."""
    from urllib.parse import parse_qsl, urlsplit

    import redis

    parts = urlsplit(url)
    prefix = dict(parse_qsl(parts.query)).get("prefix")
    if not prefix or not prefix.startswith("t-"):
        return 0
    client = redis.Redis(host=parts.hostname or "127.0.0.1", port=parts.port or 6379)
    try:
        keys = list(client.scan_iter(match=prefix + "*", count=1000))
        for i in range(0, len(keys), 500):
            client.unlink(*keys[i : i + 500])
        return len(keys)
    finally:
        client.close()


@pytest.fixture
def url(backend_name: str, tmp_path: Path) -> Iterator[str]:
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
