"""Named counters a backend keeps for another engine (RabbitMQ's ``?store=`` keeps its
queues' counters there): added to atomically, read whole, dropped per scope."""

from __future__ import annotations

import asyncio

import pytest

import fairq

pytestmark = pytest.mark.requires("store.counts")


async def test_counts_add_read_and_drop(broker: fairq.Broker) -> None:
    b = broker.backend
    assert await b.read_counts("q:orders") == {}
    await b.add_counts("q:orders", {"sent": 3, "acked": 0})
    await b.add_counts("q:orders", {"sent": 2, "acked": 1, "expired": 4})
    await b.add_counts("q:other", {"sent": 7})
    assert await b.read_counts("q:orders") == {"sent": 5, "acked": 1, "expired": 4}
    await b.drop_counts("q:orders")
    assert await b.read_counts("q:orders") == {}
    assert await b.read_counts("q:other") == {"sent": 7}, "scopes are apart"


async def test_concurrent_adds_are_not_lost(broker: fairq.Broker) -> None:
    b = broker.backend
    await asyncio.gather(
        *(b.add_counts("t:events", {"published": 1, "copies": 2}) for _ in range(50))
    )
    assert await b.read_counts("t:events") == {"published": 50, "copies": 100}
