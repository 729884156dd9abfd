"""Fixtures of the RabbitMQ-only tests: each test has a vhost of its own; the store is a key
prefix on the shared Redis."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import fairq
from services import backend_url, drop_namespace, rabbit_vhost


@pytest.fixture
def url(tmp_path: Path) -> Iterator[str]:
    with rabbit_vhost() as vhost:
        store = backend_url("redis", tmp_path, vhost)
        yield f"amqp://guest:guest@127.0.0.1:5672/{vhost}?store={store}"
        drop_namespace(store)


@pytest.fixture
def broker(live_broker: fairq.Broker) -> fairq.Broker:
    """The suite's real-clock broker (tests/conftest.py), on this vhost."""
    return live_broker
