"""What only RabbitMQ's attention domains have (``backends/amqp/attention.py``): the work in
RabbitMQ, one ticket per message in the store's queue ``fairq:<work queue>``, the store's
own attention machinery over the tickets. Each test has a vhost of its own; the store is a
key prefix on the shared Redis."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import fairq
from fairq.attention import Slice
from fairq.backends.amqp.tickets import MISSES, tickets_of
from fairq.model.queues import Envelope


async def tickets(broker: fairq.Broker, queue: str) -> fairq.QueueStats:
    """The store's ticket queue of ``queue`` (the store is the amqp backend's own)."""
    store = broker.backend.store  # type: ignore[attr-defined]
    return await store.stats(tickets_of(queue))  # type: ignore[no-any-return]


async def serve(a: fairq.Attention, n: int = 10, s: Slice | None = None) -> list[bytes]:
    s = s or await a._take(0)
    assert s is not None
    msgs, retry_at = await a._receive(s, n, None)
    for m in msgs:
        await m.ack()
    await a._end(s, len(msgs), retry_at)
    return [m.body for m in msgs]


async def test_a_ticket_per_message_follows_it(broker: fairq.Broker) -> None:
    a = await broker.declare_attention("market", plans={"basic": fairq.Plan(1, 10, 20.0)})
    await a.publish_batch("k", [fairq.Outgoing(str(i)) for i in range(3)])
    queue = (await a.queue("k")).name
    assert (await tickets(broker, queue)).visible == 3
    assert (await broker.queue(queue).stats()).visible == 3, "the messages are in RabbitMQ"
    s = await a._take(0)
    assert s is not None and s.queue == queue
    msgs, _ = await a._receive(s, 2, None)
    assert [m.body for m in msgs] == [b"0", b"1"]
    t = await tickets(broker, queue)
    assert (t.visible, t.in_flight) == (1, 2), "two tickets leased with their messages"
    await msgs[0].ack()
    await msgs[1].nack()  # back now: so is its ticket
    await a._end(s, 1, None)
    t = await tickets(broker, queue)
    assert (t.visible, t.in_flight) == (2, 0)
    assert sorted(await serve(a)) == [b"1", b"2"]
    t = await tickets(broker, queue)
    assert (t.visible, t.delayed, t.in_flight) == (0, 0, 0)


async def test_ticket_queues_are_reserved_and_hidden(broker: fairq.Broker) -> None:
    a = await broker.declare_attention("market")
    await a.publish("k", b"x")
    assert await broker.list_queues() == ["process.market.k.work", "process.market.k.work.dlq"]
    with pytest.raises(fairq.InvalidName, match="fairq:"):
        await broker.declare_queue("fairq:mine")
    with pytest.raises(fairq.InvalidOption, match="room"):
        await broker.declare_attention("d", work_queue="x" * 96 + ".{key}")  # 197 > 194


async def test_a_refused_publish_takes_its_tickets_back(broker: fairq.Broker) -> None:
    a = await broker.declare_attention("bounded", queue_options={"max_length": 2})
    await a.publish_batch("k", [fairq.Outgoing(b"1"), fairq.Outgoing(b"2")])
    queue = (await a.queue("k")).name
    with pytest.raises(fairq.QueueFull):
        await a.publish("k", b"3")
    assert (await tickets(broker, queue)).visible == 2
    assert await serve(a) == [b"1", b"2"]


async def test_a_plain_send_and_a_redrive_bring_tickets(broker: fairq.Broker) -> None:
    a = await broker.declare_attention("market", queue_options={"max_attempts": 1})
    await a.publish("k", b"poison")
    s = await a._take(0)
    assert s is not None
    (m,), _ = await a._receive(s, 10, None)
    await m.nack()  # its only attempt: dead-lettered, its ticket gone
    await a._end(s, 0, None)
    queue = (await a.queue("k")).name
    assert (await tickets(broker, queue)).visible == 0
    assert await broker.redrive(f"{queue}.dlq") == 1
    await broker.queue(queue).send(b"plain")
    assert (await tickets(broker, queue)).visible == 2
    assert await a._take(0) is None, "no signal: work that came past Attention.publish"
    assert await a.reconcile() == 1
    assert sorted(await serve(a)) == [b"plain", b"poison"]


async def test_a_ticket_without_its_message_is_dropped(broker: fairq.Broker) -> None:
    """A publisher that died between its two steps left a ticket and a signal: slices look
    for its message ``MISSES`` times, ever more rarely, then drop the ticket."""
    a = await broker.declare_attention("market")
    await a.publish("k", b"real")
    queue = (await a.queue("k")).name
    store = broker.backend.store  # type: ignore[attr-defined]
    await store.send(tickets_of(queue), [Envelope(b"0", {})])  # due long ago
    assert await serve(a) == [b"real"]
    looks = 0
    for _ in range(200):
        t = await tickets(broker, queue)
        if t.visible + t.delayed + t.in_flight == 0:
            break
        s = await a._take(0)
        if s is None:
            await asyncio.sleep(0.05)
            continue
        looks += 1
        assert await serve(a, s=s) == []
    assert looks == MISSES - 1, "the slice that handled 'real' looked once already"
    st = await a.stats()
    assert (st.signals_pending, st.slices, st.processed) == (0, 0, 1)


@pytest.mark.parametrize("kind", ["classic", "quorum"])
async def test_work_queues_are_classic_unless_asked(url: str, kind: str) -> None:
    from services import rabbit_management

    option = "" if kind == "classic" else "&attention_queues=quorum"
    async with await fairq.connect(url + option) as broker:
        a = await broker.declare_attention("market", queue_options={"max_attempts": 2})
        await a.publish("k", b"x")
        await broker.declare_queue("plain")
        vhost = url.split("/")[3].split("?")[0]
        api = rabbit_management()
        types = {
            q["name"]: q["type"]
            for q in api.call("GET", f"/queues/{vhost}?columns=name,type")
            if not q["name"].startswith("fairq/")
        }
        assert types == {
            "process.market.k.work": kind,
            "process.market.k.work.dlq": kind,
            "plain": "quorum",
            "plain.dlq": "quorum",
        }
        # attempts count on either: a nack brings the message back as attempt 2, then the
        # dead-letter queue takes it
        for attempt in (1, 2):
            s = await a._take(0)
            assert s is not None
            (m,), _ = await a._receive(s, 1, None)
            assert m.attempt == attempt
            await m.nack()
            await a._end(s, 0, None)
        assert (await broker.queue("process.market.k.work.dlq").stats()).visible == 1
        assert await a._take(0) is None


async def test_a_domain_of_shards(broker: fairq.Broker) -> None:
    """Work queues named with their shard; the store's domain has the same shards, over
    the ticket queues (``fairq:market-<shard>.<key>.work``)."""
    a = await broker.declare_attention("market", shards=4)
    keys = [f"store-{i}" for i in range(8)]
    for key in keys:
        await a.publish(key, key)
    names = {(await a.queue(key)).name for key in keys}
    assert all(n.startswith("market-") and n.endswith(".work") for n in names)
    assert len({n.split(".")[0] for n in names}) > 1, "keys spread over shards"
    for name in names:
        assert (await tickets(broker, name)).visible == 1
    served = []
    while (s := await a._take(0)) is not None:
        served += await serve(a, s=s)
    assert sorted(served) == sorted(k.encode() for k in keys)


class _Rpcs:
    """Counts the AMQP methods the broker's channels send, by name (aiormq's Channel
    wrapped for the test)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import aiormq.channel

        self.calls: dict[str, int] = {}
        for name in ("basic_get", "basic_consume", "basic_cancel", "basic_qos"):
            original = getattr(aiormq.channel.Channel, name)
            monkeypatch.setattr(aiormq.channel.Channel, name, self._counted(name, original))

    def _counted(self, name: str, original: Any) -> Any:
        async def counted(ch: Any, *args: Any, **kwargs: Any) -> Any:
            self.calls[name] = self.calls.get(name, 0) + 1
            return await original(ch, *args, **kwargs)

        return counted

    def reset(self) -> None:
        self.calls.clear()


@pytest.mark.parametrize("kind", ["classic", "quorum"])
async def test_a_slice_takes_its_messages_in_one_go(
    url: str, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slice's receive of n tickets takes their n messages with one short-lived consumer
    (qos, consume, cancel; the qos only when the lane's last one asked another count), not
    n basic.gets, in the queue's order, each leased with its ticket; and RabbitMQ delivers
    nothing more after the consumer's end."""
    option = "" if kind == "classic" else "&attention_queues=quorum"
    rpcs = _Rpcs(monkeypatch)
    async with await fairq.connect(url + option) as broker:
        a = await broker.declare_attention("market", plans={"basic": fairq.Plan(1, 100, 20.0)})
        await a.publish_batch("k", [fairq.Outgoing(str(i)) for i in range(50)])
        queue = (await a.queue("k")).name
        s = await a._take(0)
        assert s is not None
        rpcs.reset()
        msgs, _ = await a._receive(s, 20, None)
        assert [m.body for m in msgs] == [str(i).encode() for i in range(20)]
        assert rpcs.calls == {"basic_qos": 1, "basic_consume": 1, "basic_cancel": 1}
        t = await tickets(broker, queue)
        assert (t.visible, t.in_flight) == (30, 20), "a ticket leased per message"
        assert (await broker.queue(queue).stats()).visible == 30, "it took no more than 20"
        rpcs.reset()
        more, _ = await a._receive(s, 20, None)
        assert [m.body for m in more] == [str(i).encode() for i in range(20, 40)]
        assert rpcs.calls == {"basic_consume": 1, "basic_cancel": 1}, "the same prefetch"
        await asyncio.sleep(0.1)  # nothing arrives late for the cancelled consumers
        assert (await broker.queue(queue).stats()).visible == 10
        msgs += more
        for m in msgs[:39]:
            await m.ack()
        await msgs[39].nack()  # back at the tail, with its ticket
        await a._end(s, 39, None)
        t = await tickets(broker, queue)
        assert (t.visible, t.in_flight) == (11, 0)
        served = await serve(a, 20)
        assert served == [str(i).encode() for i in (*range(40, 50), 39)]
        t = await tickets(broker, queue)
        assert (t.visible, t.delayed, t.in_flight) == (0, 0, 0)


async def test_tickets_beyond_the_messages_look_one_by_one(
    broker: fairq.Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More tickets than messages (a publisher died between its two steps): the consumer
    takes what is there, the tickets left look with basic.get and go back as misses."""
    a = await broker.declare_attention("market")
    await a.publish_batch("k", [fairq.Outgoing(str(i)) for i in range(3)])
    queue = (await a.queue("k")).name
    store = broker.backend.store  # type: ignore[attr-defined]
    await store.send(tickets_of(queue), [Envelope(b"0", {}), Envelope(b"0", {})])
    rpcs = _Rpcs(monkeypatch)
    s = await a._take(0)
    assert s is not None
    msgs, _ = await a._receive(s, 10, None)
    assert [m.body for m in msgs] == [b"0", b"1", b"2"]
    assert rpcs.calls["basic_consume"] == 1
    assert rpcs.calls["basic_get"] == 1, "the first ticket left finds the queue empty"
    t = await tickets(broker, queue)
    assert (t.in_flight, t.visible + t.delayed) == (3, 2), "the two missed tickets are back"
    for m in msgs:
        await m.ack()
    await a._end(s, 3, None)


async def test_a_cancelled_receive_gives_its_messages_back(
    broker: fairq.Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slice cancelled while its consumer runs: what the consumer took goes back to the
    queue (nacked on the lane), the tickets' leases run out as for any lost slice."""
    import aiormq.channel

    a = await broker.declare_attention("market")
    await a.publish_batch("k", [fairq.Outgoing(str(i)) for i in range(10)])
    queue = (await a.queue("k")).name
    consuming = asyncio.Event()
    consume = aiormq.channel.Channel.basic_consume

    async def basic_consume(ch: Any, *args: Any, **kwargs: Any) -> Any:
        consuming.set()
        return await consume(ch, *args, **kwargs)

    monkeypatch.setattr(aiormq.channel.Channel, "basic_consume", basic_consume)
    s = await a._take(0)
    assert s is not None
    task = asyncio.create_task(a._receive(s, 10, None))
    await consuming.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for _ in range(100):
        st = await broker.queue(queue).stats()
        if st.visible == 10:
            break
        await asyncio.sleep(0.02)
    assert st.visible == 10
