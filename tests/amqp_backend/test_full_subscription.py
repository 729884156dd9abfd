"""A publish to a topic where one bounded ``reject`` subscription is full: RabbitMQ routes the
copy to every other subscription and nacks the publish without saying which queue refused.
fairq names the bounded queue, and counts the copies that were stored."""

from __future__ import annotations

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
    assert (s.visible, s.sent) == (2, 2), "audit got both copies and counts both"
    full = await broker.queue("sales.mailer").stats()
    assert (full.visible, full.sent) == (1, 1)
