"""Delays on RabbitMQ walk down a wheel of TTL queues (``backends/amqp/topology.py``). The
durable wheel's hops are at-least-once dead-letterings, which a refusing target would have
retried without end; a bounded queue with ``overflow="reject"`` therefore takes the classic
wheel, and a full one holds up no other queue's delayed messages."""

from __future__ import annotations

import asyncio

import pytest

import fairq
from fairq.backends.amqp import topology
from fairq.model.queues import QueueConfig


def test_only_a_rejecting_bounded_queue_takes_the_classic_wheel() -> None:
    assert topology.wheel_for(QueueConfig()) == topology.DURABLE
    assert topology.wheel_for(QueueConfig(max_length=5, overflow="drop_oldest")) == topology.DURABLE
    assert topology.wheel_for(QueueConfig(max_length=5)) == topology.CLASSIC
    durable = {queue: args for _, queue, args, _ in topology.wheel(topology.DURABLE)}
    assert len(durable) == topology.LEVELS
    for queue, args in durable.items():
        assert queue.startswith("fairq/wheel/")
        assert args["x-queue-type"] == "quorum"
        assert args["x-dead-letter-strategy"] == "at-least-once"
    assert topology.hop_queues() >= set(durable) | {
        q for _, q, _, _ in topology.wheel(topology.CLASSIC)
    }


def test_a_delay_enters_the_wheel_at_its_highest_level() -> None:
    """Straight to the level of the delay's highest bit (the levels above would only pass
    the message on); the routing key still spells every level's bit."""
    assert topology.delay_route(0.5, "q") == (
        topology.level_exchange(5),  # 50 units of 10 ms: 0b110010
        ".".join(format(50, f"0{topology.LEVELS}b")) + ".q",
    )
    assert topology.delay_route(0.01, "q", topology.CLASSIC)[0] == topology.level_exchange(
        0, topology.CLASSIC
    )


async def _five_delays_arrive(q: fairq.Queue, delay: float) -> None:
    """Five messages sent to ``q`` with ``delay`` all arrive, none waiting 5 s for the next."""
    await q.send_batch([fairq.Outgoing(f"due {i}".encode(), delay=delay) for i in range(5)])
    got: list[fairq.Received] = []
    while len(got) < 5:
        msgs = await q.receive(max_messages=10, wait=5)
        assert msgs, f"only {len(got)} of 5 delayed messages reached {q.name!r}"
        got += msgs
    assert sorted(m.body for m in got) == sorted(f"due {i}".encode() for i in range(5))


async def test_a_full_bounded_queue_holds_up_no_other_delays(broker: fairq.Broker) -> None:
    full = await broker.declare_queue("full", max_length=1)
    other = await broker.declare_queue("other")
    await full.send(b"room taken")
    for i in range(40):  # more than the broker retries at once, had they taken that wheel
        await full.send(f"late {i}".encode(), delay=0.1)
    await _five_delays_arrive(other, 0.3)


async def test_a_broker_before_3_10_delays_through_the_classic_wheel(
    broker: fairq.Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RabbitMQ before 3.10 has neither quorum TTL nor at-least-once dead-lettering: its
    delays take the classic wheel, as every delay did in fairq's earlier versions."""
    backend = broker.backend
    monkeypatch.setattr(backend.link, "server_version", lambda: (3, 9, 29))  # type: ignore[attr-defined]
    q = await broker.declare_queue("old-broker")
    await q.send(b"later", delay=0.2)
    (m,) = await q.receive(wait=5)
    assert m.body == b"later"
    assert backend._wheels == {topology.CLASSIC}  # type: ignore[attr-defined]


async def test_a_queue_declared_again_as_rejecting_holds_up_no_delays(
    broker: fairq.Broker,
) -> None:
    """Delays sent to a queue that is then deleted and declared again, bounded with
    ``overflow="reject"`` and full, end in ``fairq/due/void``: the new queue is not bound
    where the durable wheel ends, so its refusals cannot hold up that wheel's level (the
    broker retries a refused at-least-once dead letter only every few minutes)."""
    flip = await broker.declare_queue("flip")
    # 1.5 s = 150 units (0b10010110): the last hop leaves level 1, as a 0.02 s delay's does
    await flip.send_batch([fairq.Outgoing(b"sent before", delay=1.5) for _ in range(40)])
    await broker.delete_queue("flip")
    flip = await broker.declare_queue("flip", max_length=1)
    await flip.send(b"room taken")
    other = await broker.declare_queue("other")
    await asyncio.sleep(2.0)  # the 40 came due meanwhile
    await _five_delays_arrive(other, 0.02)
    (kept,) = await flip.receive(max_messages=10, wait=0.5)
    assert kept.body == b"room taken"


async def test_a_delay_too_short_to_count_is_none(broker: fairq.Broker) -> None:
    q = await broker.declare_queue("tiny")
    await q.send(b"at once", delay=1e-12)
    (m,) = await q.receive(wait=5)
    assert m.body == b"at once"
