"""A process that receives a few messages and closes (a CLI ``fairq receive``, a cron job)
on RabbitMQ: its consumer had prefetched more than it took. Those deliveries go back
without an attempt counted, every one of them (also those still on their way when the
process closed), and a new consumer's first receive returns the queue's first message."""

from __future__ import annotations

import fairq


async def test_short_lived_receivers_count_no_attempt_of_what_they_did_not_take(
    broker: fairq.Broker, url: str
) -> None:
    q = await broker.declare_queue("drain", max_attempts=3)
    await q.send_batch([fairq.Outgoing(str(i).encode()) for i in range(300)])
    taken: list[int] = []
    for _ in range(6):  # twice the attempts: any counted return would dead-letter some
        async with await fairq.connect(url) as short:
            got = await short.queue("drain").receive(max_messages=3, wait=5)
            assert [m.attempt for m in got] == [1, 1, 1]
            taken += [int(m.body) for m in got]
            await short.queue("drain").ack_batch([m.receipt for m in got])
    rest: list[fairq.Received] = []
    while len(rest) < 300 - len(taken):
        more = await q.receive(max_messages=100, wait=5)
        assert more, f"{len(rest)} of {300 - len(taken)}"
        rest += more
    assert {m.attempt for m in rest} == {1}
    assert sorted(taken + [int(m.body) for m in rest]) == list(range(300))
    assert (await broker.queue("drain.dlq").stats()).depth == 0


async def test_a_new_consumer_receives_in_send_order(broker: fairq.Broker) -> None:
    q = await broker.declare_queue("ordered")
    for start in range(0, 300, 100):
        await q.send_batch([fairq.Outgoing(str(i).encode()) for i in range(start, start + 100)])
    got: list[int] = []
    while len(got) < 300:
        msgs = await q.receive(max_messages=10, wait=5)
        assert msgs, f"{len(got)} of 300"
        got += [int(m.body) for m in msgs]
        await q.ack_batch([m.receipt for m in msgs])
    assert got == list(range(300))
