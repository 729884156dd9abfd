"""The memory backend keeps each delayed or leased message's due time in one heap; an entry
goes stale when its message moves on (an ack, a nack, an extension). Stale entries must
not pile up under a busy consumer — each holds its message, body included, until the lease
would have ended — so the heap is compacted whenever it doubles; what is due still comes
due on time."""

from __future__ import annotations

import fairq
from fairq.backends.heaps import COMPACT_MIN


def _heap(broker: fairq.Broker) -> list[object]:
    return broker.backend._waiting  # type: ignore[attr-defined]


async def test_acked_messages_do_not_pile_up_in_the_heap() -> None:
    clock = fairq.ManualClock()
    broker = await fairq.connect("memory://", clock=clock)
    try:
        q = await broker.declare_queue("jobs", visibility_timeout=30)
        body = b"x" * 1000
        for _ in range(20):  # 20,000 messages received and acked within one lease length
            await q.send_batch([fairq.Outgoing(body) for _ in range(1000)])
            for _ in range(10):
                msgs = await q.receive(max_messages=100)
                assert len(msgs) == 100
                await q.ack_batch([m.receipt for m in msgs])
            assert len(_heap(broker)) <= 2 * COMPACT_MIN
        assert (await q.stats()).acked == 20_000
    finally:
        await broker.close()


async def test_leases_and_delays_still_come_due_after_a_compaction() -> None:
    clock = fairq.ManualClock()
    broker = await fairq.connect("memory://", clock=clock)
    try:
        q = await broker.declare_queue("jobs", visibility_timeout=30)
        await q.send(b"delayed", delay=50)
        await q.send(b"held")
        (held,) = await q.receive()
        for _ in range(3):  # enough stale entries for several compactions
            await q.send_batch([fairq.Outgoing(b"churn") for _ in range(1000)])
            while msgs := await q.receive(max_messages=100):
                await q.ack_batch([m.receipt for m in msgs])
        assert len(_heap(broker)) < COMPACT_MIN
        clock.advance(31)  # the held lease ends: delivered again
        (again,) = await q.receive()
        assert (again.id, again.attempt) == (held.id, 2)
        await again.ack()
        assert await q.receive() == []
        clock.advance(20)  # the delay ends
        (late,) = await q.receive()
        assert late.body == b"delayed"
    finally:
        await broker.close()
