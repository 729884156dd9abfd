"""Attributes travel as AMQP headers, in one content-header frame that RabbitMQ will not
take above its ``frame_max``: it closes the whole connection instead, and every lease on it
is lost. fairq refuses such a message before anything is sent: past 64 KiB of attributes on
every engine (``MAX_ATTRIBUTE_BYTES``), and past the frame on a broker whose frame is
smaller than that."""

from __future__ import annotations

import pytest

import fairq

TOO_BIG = r"at most 65536 bytes|frame_max"


async def test_attributes_larger_than_a_frame_are_refused_and_leases_live_on(
    broker: fairq.Broker,
) -> None:
    q = await broker.declare_queue("jobs")
    await q.send_batch([fairq.Outgoing(b"held") for _ in range(3)])
    held = await q.receive(max_messages=3, wait=5)
    assert len(held) == 3
    big = "v" * 100_000
    with pytest.raises(fairq.InvalidMessage, match=TOO_BIG):
        await q.send(b"x", attributes={"a": big, "b": big})
    with pytest.raises(fairq.InvalidMessage, match=TOO_BIG):  # a batch: none is sent
        await q.send_batch([fairq.Outgoing(b"ok"), fairq.Outgoing(b"x", {"a": big, "b": big})])
    topic = await broker.declare_topic("events")
    await topic.subscribe("all")
    with pytest.raises(fairq.InvalidMessage, match=TOO_BIG):
        await topic.publish(b"x", attributes={"a": big, "b": big})
    await q.ack_batch([m.receipt for m in held])  # the connection and its leases live on
    fits = "v" * 60_000
    await q.send(b"fits", attributes={"a": fits})  # 60 KB of attributes fit in a frame
    (got,) = await q.receive(wait=5)
    assert got.body == b"fits" and got.attributes["a"] == fits
    stats = await q.stats()
    assert (stats.acked, stats.sent) == (3, 4)
