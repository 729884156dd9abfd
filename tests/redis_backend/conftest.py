"""Fixtures of the Redis-only tests: the shared Redis under a prefix of its own, the
session's 3-master test Cluster, and a private redis-server."""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

import fairq
from redis_servers import RedisServer, available, drop_prefix, service_up

SHARED = ("127.0.0.1", 6379)


def _need_shared() -> None:
    if not service_up(*SHARED):
        if os.environ.get("FAIRQ_REQUIRE_SERVICES") == "1":
            pytest.fail("redis at 127.0.0.1:6379 is down and FAIRQ_REQUIRE_SERVICES=1")
        pytest.skip("redis at 127.0.0.1:6379 is not reachable")


@pytest.fixture
def shared_url() -> Iterator[str]:
    """The shared Redis, every key under a prefix of this test's own (removed after)."""
    _need_shared()
    url = f"redis://127.0.0.1:6379/0?prefix=t-{secrets.token_hex(6)}:"
    yield url
    drop_prefix(url)


@pytest.fixture
def cluster_url() -> Iterator[str]:
    """The session's test Cluster, under a prefix of this test's own (removed after)."""
    if not available():
        pytest.skip("redis-server is not installed")
    from redis_servers import session_cluster

    url = f"{session_cluster()}?prefix=t-{secrets.token_hex(6)}:"
    yield url
    drop_prefix(url)


@pytest.fixture
async def cluster_broker(cluster_url: str) -> AsyncIterator[fairq.Broker]:
    b = await fairq.connect(cluster_url)
    try:
        yield b
    finally:
        await b.close()


@pytest.fixture
def private(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of this test's own (its INFO counts only what the test did)."""
    if not available():
        pytest.skip("redis-server is not installed")
    server = RedisServer(tmp_path, None).start()
    try:
        yield server
    finally:
        server.stop()
