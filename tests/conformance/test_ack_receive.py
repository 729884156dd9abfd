"""``Backend.ack_receive`` on every backend: what a worker's consumer sends when its slots
free up (the acks of the handlers that freed them, and a receive for the slots). It acks as
``ack`` does (the receipts not current come back) and then receives as ``receive`` does; on
SQLite both are one transaction (``acks_with_receive``), elsewhere two steps."""

from __future__ import annotations

import fairq


async def test_ack_receive_acks_then_receives(broker: fairq.Broker) -> None:
    q = await broker.declare_queue("ar")
    await q.send_batch([fairq.Outgoing(f"m{i}") for i in range(6)])
    first = await q.receive(max_messages=3)
    assert len(first) == 3
    stale = first[0].receipt
    await q.release_batch([stale])  # its lease ends: this receipt is no longer current
    lost, got = await broker.backend.ack_receive("ar", [m.receipt for m in first], 10, None)
    assert lost == [stale]
    for _ in range(5):  # (a message given back may take a moment on RabbitMQ)
        if len(got) >= 4:
            break
        got += await q.receive(max_messages=10, wait=1)
    assert sorted(m.body for m in got) == [b"m0", b"m3", b"m4", b"m5"]
    assert all(m.queue == "ar" for m in got)
    await q.ack_batch([m.receipt for m in got])  # (the messages are the queue's own)
    assert (await q.stats()).acked == 6
