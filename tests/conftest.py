"""Shared fixtures: one broker per backend, so every conformance test runs on each.

A new backend plugs in by adding its name to BACKENDS and a branch to ``_url``. A
backend that needs a service skips when the service is down, unless
FAIRQ_REQUIRE_SERVICES=1 (CI), where it fails.

Capabilities: a test that needs something a backend's capability table
(``Backend.missing``) lists is marked ``@pytest.mark.requires("name", ...)``; on that
backend it is skipped, naming the capability and what the backend does instead. That
table is the only source of such skips.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

import fairq
from fairq.backends.open import backend_class

BACKENDS = ["memory", "sqlite", "amqp"]
SERVICES: dict[str, tuple[str, int]] = {  # backend -> (host, port) it needs
    "amqp": ("127.0.0.1", 5672),
}
RABBIT_MANAGEMENT = ("127.0.0.1", 15672)


def service_up(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def _url(backend: str, tmp_path: Path, namespace: str) -> str:
    if backend == "memory":
        return "memory://"
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'fairq.db'}"
    if backend == "amqp":
        return (
            f"amqp://guest:guest@127.0.0.1:5672/{namespace}?store=sqlite:///{tmp_path / 'store.db'}"
        )
    raise AssertionError(f"no URL for backend {backend}")


def rabbit_management() -> object:
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


@pytest.fixture
def namespace(backend_name: str) -> Iterator[str]:
    """This test's own namespace on a shared engine (a RabbitMQ vhost), removed afterwards."""
    name = f"fairq-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    if backend_name != "amqp":
        yield name
        return
    api = rabbit_management()
    api.add_vhost(name, "guest")  # type: ignore[attr-defined]
    try:
        yield name
    finally:
        api.delete_vhost(name)  # type: ignore[attr-defined]


def missing_capabilities(backend: str, node: pytest.Item) -> list[tuple[str, str]]:
    """The capabilities the test ``node`` requires that ``backend`` lists as missing."""
    missing = backend_class(backend).missing
    needed = [c for m in node.iter_markers("requires") for c in m.args]
    return [(c, missing[c]) for c in needed if c in missing]


def _require(backend: str) -> None:
    need = SERVICES.get(backend)
    if need and not service_up(*need):
        if os.environ.get("FAIRQ_REQUIRE_SERVICES") == "1":
            pytest.fail(f"{backend} at {need[0]}:{need[1]} is down and FAIRQ_REQUIRE_SERVICES=1")
        pytest.skip(f"{backend} at {need[0]}:{need[1]} is not reachable")


@pytest.fixture(params=BACKENDS)
def backend_name(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    lacking = missing_capabilities(name, request.node)
    if lacking:
        pytest.skip("; ".join(f"{name} lacks capability {c!r}: {why}" for c, why in lacking))
    _require(name)
    return name


@pytest.fixture
def url(backend_name: str, tmp_path: Path, namespace: str) -> str:
    return _url(backend_name, tmp_path, namespace)


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
