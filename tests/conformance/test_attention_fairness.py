"""SPEC §5 rule 4 in worker time, on every backend that has the scheduler (capability
``worker_time_fairness``): tenants share the time their slices hold a worker (or, with
``charge="messages"``, the messages they handle), over their plans' weights; the scheduler
is work-conserving; idleness earns no credit; several takes at once spread over tenants.
Slices are driven the way the worker does on a manual clock, which each slice advances
by the time its messages "take"; and the per-tenant stats of the last minute."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

import fairq
from fairq.attention import Slice

pytestmark = pytest.mark.requires("attention", "worker_time_fairness")

Plan = fairq.Plan


async def serve(
    a: fairq.Attention,
    clock: fairq.ManualClock,
    s: Slice,
    per_message: float = 1.0,
) -> int:
    """Run a slice like a worker whose handler takes ``per_message`` seconds."""
    msgs, retry_at = await a._receive(s, s.plan.max_messages, None)
    clock.advance(per_message * len(msgs))
    for m in msgs:
        await m.ack()
    await a._end(s, len(msgs), retry_at)
    return len(msgs)


def tenant_of(key: str) -> str:
    return key.split("-")[0]


async def two_tenants(a: fairq.Attention, deep: int = 1000, shallow_keys: int = 200) -> None:
    """Tenant A: one deep key. Tenant B: many keys of one message each."""
    await a.set_resource("A-0", tenant="A")
    await a.publish_batch("A-0", [fairq.Outgoing(b"a") for _ in range(deep)])
    for i in range(shallow_keys):
        await a.set_resource(f"B-{i}", tenant="B")
        await a.publish(f"B-{i}", b"b")


async def run_sequentially(
    a: fairq.Attention, clock: fairq.ManualClock, slices: int, per_message: float = 1.0
) -> tuple[Counter[str], Counter[str]]:
    """One worker: ``slices`` slices; the seconds and messages each tenant got."""
    seconds: Counter[str] = Counter()
    messages: Counter[str] = Counter()
    for _ in range(slices):
        s = await a._take(0)
        assert s is not None
        n = await serve(a, clock, s, per_message)
        seconds[tenant_of(s.key)] += n * per_message
        messages[tenant_of(s.key)] += n
    return seconds, messages


async def test_shares_are_of_worker_time_not_of_slices(
    broker: fairq.Broker, clock: fairq.ManualClock
) -> None:
    a = await broker.declare_attention("fair", plans={"basic": Plan(1, 5, 60.0)})
    await two_tenants(a)
    seconds, messages = await run_sequentially(a, clock, 60)
    # A's slices are 5 messages long, B's 1: counted in slices B would get a sixth
    assert seconds["B"] / seconds["A"] == pytest.approx(1.0, abs=0.2), seconds
    assert messages["B"] > 3 * (messages["A"] / 5), "B gets more (shorter) slices"


async def test_charge_messages_shares_messages(
    broker: fairq.Broker, clock: fairq.ManualClock
) -> None:
    a = await broker.declare_attention("fair", plans={"basic": Plan(1, 5, 60.0)}, charge="messages")
    await two_tenants(a)
    # A's messages take 3 s each, B's 1 s: in worker time A would get a quarter; counted in
    # messages each gets half
    messages: Counter[str] = Counter()
    for _ in range(60):
        s = await a._take(0)
        assert s is not None
        messages[tenant_of(s.key)] += await serve(a, clock, s, 3.0 if s.key == "A-0" else 1.0)
    assert messages["B"] / messages["A"] == pytest.approx(1.0, abs=0.2), messages


async def test_weights_set_the_shares(broker: fairq.Broker, clock: fairq.ManualClock) -> None:
    a = await broker.declare_attention(
        "fair", plans={"basic": Plan(1, 5, 60.0), "double": Plan(1, 5, 60.0, weight=2.0)}
    )
    for tenant, plan in (("A", "double"), ("B", "basic")):
        for i in range(20):
            await a.set_resource(f"{tenant}-{i}", tenant=tenant, plan=plan)
            await a.publish_batch(f"{tenant}-{i}", [fairq.Outgoing(b"x") for _ in range(20)])
    seconds, _ = await run_sequentially(a, clock, 90)
    assert seconds["A"] / seconds["B"] == pytest.approx(2.0, rel=0.15), seconds
    assert (await a.config()).plans["double"].weight == 2.0


async def test_takes_at_once_spread_over_tenants(
    broker: fairq.Broker, clock: fairq.ManualClock
) -> None:
    """Each take charges an estimate (the tenant's measured slice cost), so workers that
    take at the same moment do not all land on the tenant that is behind."""
    a = await broker.declare_attention("fair", plans={"basic": Plan(4, 5, 60.0)})
    for t in ("A", "B"):
        await a.set_resource(f"{t}-0", tenant=t)
        await a.publish_batch(f"{t}-0", [fairq.Outgoing(b"x") for _ in range(200)])
    s = await a._take(0)
    assert s is not None and s.key == "A-0"
    await serve(a, clock, s, 2.0)  # A: 10 s of work
    s = await a._take(0)
    assert s is not None and s.key == "B-0"
    await serve(a, clock, s, 3.0)  # B: 15 s, so A is 5 s behind
    taken = [await a._take(0) for _ in range(4)]
    keys = [s.key if s is not None else None for s in taken]
    assert keys == ["A-0", "B-0", "A-0", "B-0"], "without the estimate: A four times"


async def test_a_capped_tenant_leaves_the_workers_to_others(
    broker: fairq.Broker, clock: fairq.ManualClock
) -> None:
    """Work-conserving: a tenant whose keys all run max_concurrency slices has no signal to
    take; three workers taking at once get one slice of it and two of the other."""
    a = await broker.declare_attention("fair", plans={"basic": Plan(1, 5, 60.0)})
    await two_tenants(a)
    taken = [await a._take(0) for _ in range(3)]
    assert sorted(tenant_of(s.key) for s in taken if s is not None) == ["A", "B", "B"]
    stats = {t.tenant: t for t in await a.tenant_stats()}
    assert stats["A"].at_cap and not stats["B"].at_cap
    assert (stats["A"].backlog, stats["A"].keys) == (1000, 1)
    assert stats["B"].backlog == 200, "taking a slice leases nothing yet"
    for s in taken:
        assert s is not None
        await serve(a, clock, s)
    assert not {t.tenant: t for t in await a.tenant_stats()}["A"].at_cap


async def test_idleness_earns_no_credit(broker: fairq.Broker, clock: fairq.ManualClock) -> None:
    a = await broker.declare_attention("fair", plans={"basic": Plan(1, 1, 60.0)})
    for t in ("A", "B"):
        for i in range(5):
            await a.set_resource(f"{t}-{i}", tenant=t)
            await a.publish_batch(f"{t}-{i}", [fairq.Outgoing(b"x") for _ in range(40)])
    await run_sequentially(a, clock, 40)  # A and B work 20 s each; C is idle all along
    await a.set_resource("C-0", tenant="C")
    await a.publish_batch("C-0", [fairq.Outgoing(b"x") for _ in range(100)])
    _, got = await run_sequentially(a, clock, 12)
    assert got["C"] <= 5, f"C takes its third of the turns, not a burst of them: {got}"
    assert got["A"] >= 3 and got["B"] >= 3, got


async def test_tenant_stats_cover_the_last_minute(
    broker: fairq.Broker, clock: fairq.ManualClock
) -> None:
    a = await broker.declare_attention("fair", plans={"basic": Plan(1, 5, 60.0)})
    await two_tenants(a, deep=10, shallow_keys=3)
    for _ in range(5):
        s = await a._take(0)
        assert s is not None
        await serve(a, clock, s, 2.0)
    stats = {t.tenant: t for t in await a.tenant_stats()}
    assert (stats["A"].slices, stats["A"].messages) == (2, 10)
    assert (stats["B"].slices, stats["B"].messages) == (3, 3)
    assert stats["A"].busy == pytest.approx(20.0) and stats["B"].busy == pytest.approx(6.0)
    assert stats["A"].share == pytest.approx(20 / 26) and stats["B"].share == pytest.approx(6 / 26)
    assert [t.tenant for t in await a.tenant_stats(top=1)] == ["A"], "by share"
    assert (stats["A"].backlog, stats["B"].backlog, stats["A"].at_cap) == (0, 0, False)
    clock.advance(61)
    assert await a.tenant_stats() == [], "nothing in the last minute, no backlog"
    with pytest.raises(fairq.InvalidOption):
        await a.tenant_stats(top=0)


async def test_a_dead_slice_keeps_its_estimate(
    broker: fairq.Broker, clock: fairq.ManualClock
) -> None:
    """A slice whose worker died is not charged the time its token lease ran on."""
    a = await broker.declare_attention("fair", plans={"basic": Plan(1, 5, 60.0)}, slice_lease=30.0)
    await two_tenants(a, deep=100, shallow_keys=100)
    s = await a._take(0)
    assert s is not None and s.key == "A-0"
    await a._receive(s, 5, None)  # the worker dies here
    clock.advance(31)
    seconds, _ = await run_sequentially(a, clock, 8)
    assert seconds["A"] >= 5, "A was not charged 31 s for the dead slice"
    assert not any(t.tenant == "A" and t.busy > 30 for t in await a.tenant_stats())


async def test_a_slow_handler_is_charged_the_time_it_held_the_worker(
    live_broker: fairq.Broker,
) -> None:
    """On the real clock, with a worker: A's key is 100 ms per message, B's keys 20 ms; both
    get about half of the worker time. (A slice's own round trips count as worker time:
    B's slices of 4 x 20 ms keep them a small part even on RabbitMQ, where each message
    costs two — the store's and RabbitMQ's — on a loaded machine.)"""
    a = await live_broker.declare_attention("live", plans={"basic": Plan(1, 4, 60.0)})
    await a.set_resource("A-0", tenant="A")
    await a.publish_batch("A-0", [fairq.Outgoing(b"a") for _ in range(200)])
    for i in range(200):
        await a.set_resource(f"B-{i}", tenant="B")
        await a.publish_batch(f"B-{i}", [fairq.Outgoing(b"b") for _ in range(4)])
    busy: Counter[str] = Counter()
    worker = fairq.Worker(live_broker, concurrency=1, handle_signals=False, poll_wait=0.2)

    @worker.attention("live")
    async def handle(msg: fairq.Received) -> None:
        assert msg.key is not None
        loop = asyncio.get_running_loop()
        started = loop.time()
        await asyncio.sleep(0.1 if msg.key == "A-0" else 0.02)
        busy[tenant_of(msg.key)] += loop.time() - started

    task = asyncio.create_task(worker.run())
    try:
        await asyncio.sleep(4.0)
    finally:
        worker.stop()
        await asyncio.wait_for(task, 10)
    assert 0.6 <= busy["B"] / busy["A"] <= 1.6, busy
    shares = {t.tenant: t.share for t in await a.tenant_stats()}
    assert 0.35 <= shares["A"] <= 0.65, shares
