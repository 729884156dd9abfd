"""The RabbitMQ backend keeps the end of each lease in a heap (``backends/amqp/leases.py``);
an acked lease leaves its entry behind. Those entries must not pile up for a whole
visibility timeout under a consumer that never runs out of work: the heap is compacted
whenever it doubles (``backends/heaps.py``), and leases still end on time."""

from __future__ import annotations

import fairq
from fairq.backends.heaps import COMPACT_MIN


def _heap(broker: fairq.Broker) -> list[tuple[float, str]]:
    return broker.backend._deadlines  # type: ignore[attr-defined,no-any-return]


async def _take_and_ack(q: fairq.Queue, n: int) -> None:
    got = 0
    while got < n:
        msgs = await q.receive(max_messages=100, wait=5)
        assert msgs, f"{got} of {n}"
        await q.ack_batch([m.receipt for m in msgs])
        got += len(msgs)


async def test_acked_leases_do_not_pile_up(broker: fairq.Broker) -> None:
    q = await broker.declare_queue("jobs", visibility_timeout=600)
    for _ in range(6):  # 3,000 leases taken and acked, each ending in 10 minutes
        await q.send_batch([fairq.Outgoing(b"x") for _ in range(500)])
        await _take_and_ack(q, 500)
        assert len(_heap(broker)) <= 2 * COMPACT_MIN
    assert (await q.stats()).acked == 3000


async def test_a_lease_still_ends_after_compactions(url: str, clock: fairq.ManualClock) -> None:
    # on the manual clock: 2,500 receives and acks on a loaded host may take longer than
    # any short visibility timeout, and the held lease must not end before they are done
    b = await fairq.connect(url, clock=clock)
    try:
        q = await b.declare_queue("jobs", visibility_timeout=600)
        await q.send(b"held")
        (held,) = await q.receive(wait=5, visibility_timeout=2)
        await q.send_batch([fairq.Outgoing(b"churn") for _ in range(2500)])
        await _take_and_ack(q, 2500)
        assert len(_heap(b)) < COMPACT_MIN
        clock.advance(2.5)  # the held lease ends: delivered again
        (again,) = await q.receive(wait=5)
        assert (again.id, again.attempt) == (held.id, 2)
    finally:
        await b.close()
