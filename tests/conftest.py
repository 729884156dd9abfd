"""Shared fixtures: one broker per backend, so every conformance test runs on each.

A new backend plugs in by adding its name to BACKENDS and a branch to ``_url``. A
backend that needs a service skips when the service is down, unless
FAIRQ_REQUIRE_SERVICES=1 (CI), where it fails.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

import fairq
from services import (  # noqa: F401 - re-exported for the tests that import them from here
    PG_SERVER,
    SERVICES,
    drop_namespace,
    drop_pg_database,
    pg_database,
    pg_url,
    require,
    service_up,
)

BACKENDS = ["memory", "sqlite", "postgres"]
_require = require  # the name the conformance suite imports


@pytest.fixture(scope="session", autouse=True)
def _drop_pg_database() -> Iterator[None]:
    yield
    drop_pg_database()


def _url(backend: str, tmp_path: Path) -> str:
    if backend == "memory":
        return "memory://"
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'fairq.db'}"
    if backend == "postgres":
        return pg_url()
    raise AssertionError(f"no URL for backend {backend}")


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
