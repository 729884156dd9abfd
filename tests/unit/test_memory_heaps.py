"""The memory backend keeps each delayed or leased message's due time in one heap, and each
queue's ready messages in another; an entry goes stale when its message moves on (an ack,
a nack, an extension; a drop from a full queue). Stale entries must not pile up — each
holds its message, body included — under a consumer that never waits or a producer that
fills a bounded queue nobody reads: the heaps are compacted whenever they double
(``backends/heaps.py``), and what is due still comes due on time."""

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


async def test_messages_dropped_from_a_full_queue_do_not_pile_up() -> None:
    broker = await fairq.connect("memory://")
    try:
        q = await broker.declare_queue("latest", max_length=10, overflow="drop_oldest")
        for _ in range(500):  # 5,000 sends into a queue of 10 that nobody reads
            await q.send_batch([fairq.Outgoing(b"x" * 100) for _ in range(10)])
        ready = broker.backend._queues["latest"].ready  # type: ignore[attr-defined]
        assert len(ready) <= 2 * COMPACT_MIN
        assert (await q.stats()).dead_lettered == 4990
        got = await q.receive(max_messages=20)
        assert len(got) == 10  # the newest ten, still in order
        assert got == sorted(got, key=lambda m: m.id)
    finally:
        await broker.close()


async def test_ended_slices_do_not_pile_up() -> None:
    broker = await fairq.connect("memory://", clock=fairq.ManualClock())
    try:
        a = await broker.declare_attention("market", plans={"basic": fairq.Plan(1, 5, 60.0)})
        for i in range(3000):  # 3,000 slices taken and ended, each leased for a minute
            await a.publish(f"k{i}", b"x")
            s = await a._take(0)
            assert s is not None
            msgs, retry_at = await a._receive(s, 5, None)
            for m in msgs:
                await m.ack()
            await a._end(s, len(msgs), retry_at)
        domain = broker.backend._domains["market"]  # type: ignore[attr-defined]
        assert len(domain.leases) <= 2 * COMPACT_MIN
    finally:
        await broker.close()
