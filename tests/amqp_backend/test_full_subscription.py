"""A publish to a topic where one bounded ``reject`` subscription is full: RabbitMQ routes the
copy to every other subscription and nacks the publish without saying which queue refused.
fairq names the bounded queue, and counts the copies that were stored.

RabbitMQ nacks as soon as the full queue refuses, which can be a moment before the other
queues have taken their copies: their depths are waited for (bounded), never assumed."""

from __future__ import annotations

import asyncio

import pytest

import fairq


async def test_the_full_subscription_is_named_and_the_stored_copies_counted(
    broker: fairq.Broker,
) -> None:
    t = await broker.declare_topic("sales")
    wide = await t.subscribe("audit")
    await t.subscribe("mailer", max_length=1, overflow="reject")
    await t.publish(b"first")
    with pytest.raises(fairq.QueueFull) as caught:
        await t.publish(b"second")
    assert caught.value.name == "sales.mailer"
    assert caught.value.max_length == 1
    assert "audit" not in str(caught.value).split("may be full")[0]
    s = await wide.stats()
    for _ in range(100):  # at most ~2 s for RabbitMQ's queue to count the copy it routed
        if s.visible == 2:
            break
        await asyncio.sleep(0.02)
        s = await wide.stats()
    assert (s.visible, s.sent) == (2, 2), "audit got both copies and counts both"
    full = await broker.queue("sales.mailer").stats()
    assert (full.visible, full.sent) == (1, 1)
    # the topic counts what went out: the refused publish reached audit
    ts = await t.stats()
    assert (ts.published, ts.copies) == (2, 3)
