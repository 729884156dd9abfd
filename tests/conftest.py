"""Shared fixtures: one broker per backend, so every conformance test runs on each.

A new backend plugs in by adding its name to BACKENDS and a branch to ``backend_url``
(both in services.py). A
backend that needs a service skips when the service is down, unless
FAIRQ_REQUIRE_SERVICES=1 (CI), where it fails.

Capabilities: a test that needs something a backend's capability table
(``Backend.missing``) lists is marked ``@pytest.mark.requires("name", ...)``; on that
backend it is skipped, naming the capability and what the backend does instead. That
table is the only source of such skips.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

import fairq
from fairq.backends.open import backend_class
from services import (
    BACKENDS,
    SCHEMES,
    backend_url,
    drop_namespace,
    drop_pg_database,
    rabbit_vhost,
    require,
)


@pytest.fixture(scope="session", autouse=True)
def _drop_pg_database() -> Iterator[None]:
    """This test process's PostgreSQL database (made on first use) goes at the end."""
    yield
    drop_pg_database()


@pytest.fixture
def namespace(backend_name: str) -> Iterator[str]:
    """This test's own namespace on a shared engine (a RabbitMQ vhost), removed afterwards."""
    if backend_name != "amqp":
        yield f"fairq-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        return
    with rabbit_vhost() as vhost:
        yield vhost


def missing_capabilities(backend: str, node: pytest.Item) -> list[tuple[str, str]]:
    """The capabilities the test ``node`` requires that ``backend`` lists as missing."""
    missing = backend_class(SCHEMES.get(backend, backend)).missing
    needed = [c for m in node.iter_markers("requires") for c in m.args]
    return [(c, missing[c]) for c in needed if c in missing]


@pytest.fixture(params=BACKENDS)
def backend_name(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    lacking = missing_capabilities(name, request.node)
    if lacking:
        pytest.skip("; ".join(f"{name} lacks capability {c!r}: {why}" for c, why in lacking))
    require(name)
    return name


@pytest.fixture
def url(backend_name: str, tmp_path: Path, namespace: str) -> Iterator[str]:
    u = backend_url(backend_name, tmp_path, namespace)
    yield u
    drop_namespace(u)  # a test's keys or schema are its own: nothing is left behind


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
