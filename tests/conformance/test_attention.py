"""SPEC §5 (attention queues) on every backend. Most tests drive the slice cycle the way
the worker does (take a signal, receive under its token, end the slice) on a manual
clock; the last ones run real workers."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
from collections import Counter
from typing import Any

import pytest

import fairq
import held
from fairq.attention import Slice
from fairq.model.attention import shard_of
from races import extensions_after_acks

pytestmark = pytest.mark.requires("attention")

Plan = fairq.Plan
PLANS = {"basic": Plan(1, 2, 20.0), "wide": Plan(3, 2, 20.0), "pro": Plan(2, 5, 20.0)}


async def domain(broker: fairq.Broker, **kw: object) -> fairq.Attention:
    return await broker.declare_attention("market", plans=kw.pop("plans", PLANS), **kw)  # type: ignore[arg-type]


async def run_slice(a: fairq.Attention, s: Slice, n: int | None = None) -> list[bytes]:
    """Handle a slice like a worker: receive up to the plan's max_messages, ack, end."""
    want = s.plan.max_messages if n is None else n
    msgs, retry_at = await a._receive(s, want, None)
    for m in msgs:
        assert m.key == s.key
        await m.ack()
    await a._end(s, len(msgs), retry_at)
    return [m.body for m in msgs]


async def drain_keys(a: fairq.Attention, rounds: int = 1000) -> list[str]:
    """Serve slices one at a time until no signal is left; return the keys in order."""
    order = []
    for _ in range(rounds):
        s = await a._take(0)
        if s is None:
            return order
        order.append(s.key)
        await run_slice(a, s)
    raise AssertionError("signals never ran out")


# -- declaring -----------------------------------------------------------------------------
async def test_declare_and_options(broker: fairq.Broker) -> None:
    a = await broker.declare_attention("marketplace")
    assert a.queue_name == "attention.marketplace.work"
    config = await a.config()
    assert set(config.plans) == {"basic", "pro", "enterprise"}
    assert config.plans["pro"] == Plan(3, 200, 20.0)
    assert (await a.queue("store-873")).name == "process.marketplace.store-873.work"
    assert await broker.list_attention() == ["marketplace"]
    for bad in (
        {"plans": {}},
        {"plans": {"basic": "fast"}},
        {"plans": {"basic": Plan(0, 1, 1.0)}},
        {"plans": {"basic": Plan(1, 1, 1.0, rate=-1)}},
        {"default_plan": "gold"},
        {"work_queue": "process.no-key"},
        {"work_queue": "process.{nope}.{key}"},
        {"queue_options": {"max_attempts": 0}},
        {"queue_options": {"colour": "blue"}},
    ):
        with pytest.raises(fairq.InvalidOption):
            await broker.declare_attention("bad", **bad)  # type: ignore[arg-type]
    with pytest.raises(fairq.AttentionNotFound):
        await broker.attention("never").publish("k", b"x")


async def test_a_domain_of_shards_names_each_queue_by_its_keys_shard(
    broker: fairq.Broker,
) -> None:
    """``shards`` splits a domain (on Redis Cluster: over slots); everywhere a key's queue
    is named with ``shard_of(key, shards)``, every message is served once, and the counts
    add up over the shards."""
    a = await broker.declare_attention("market", plans=PLANS, shards=4)
    config = await a.config()
    assert (config.shards, config.work_queue) == (4, "{domain}-{shard}.{key}.work")
    keys = [f"store-{i}" for i in range(12)]
    for k in keys:
        assert (await a.queue(k)).name == f"market-{shard_of(k, 4)}.{k}.work"
        await a.publish_batch(k, [fairq.Outgoing(f"{k}/{j}") for j in range(3)])
    assert len({shard_of(k, 4) for k in keys}) == 4
    got: list[bytes] = []
    while (s := await a._take(0)) is not None:
        got.extend(await run_slice(a, s))
    assert sorted(got) == sorted(f"{k}/{j}".encode() for k in keys for j in range(3))
    st = await a.stats()
    assert (st.keys, st.processed, st.signals_pending, st.slices) == (12, 36, 0, 0)
    with pytest.raises(fairq.ConfigConflict):
        await broker.declare_attention("market", plans=PLANS, shards=2)
    for bad in (
        {"shards": 0},
        {"shards": True},
        {"shards": 2, "work_queue": "process.{domain}.{key}.work"},  # no {shard}
        {"shards": 2, "work_queue": "{domain}-{shard:x>9}.{key}"},
    ):
        with pytest.raises(fairq.InvalidOption):
            await broker.declare_attention("bad", **bad)  # type: ignore[arg-type]


async def test_work_queue_cannot_change_once_keys_exist(broker: fairq.Broker) -> None:
    await broker.declare_attention("wq", work_queue="a.{key}")
    await broker.declare_attention("wq", work_queue="b.{key}")  # no keys yet: fine
    att = broker.attention("wq")
    await att.publish("k", b"one")
    with pytest.raises(fairq.ConfigConflict, match="work_queue"):
        await broker.declare_attention("wq", work_queue="c.{key}")
    await broker.declare_attention("wq", work_queue="b.{key}", slice_lease=10.0)  # others may
    assert (await att.queue("k")).name == "b.k"
    s = await att._take(0)
    assert s is not None and s.queue == "b.k"
    (msg,) = await broker.queue(s.queue).receive(10)
    assert msg.body == b"one"


async def test_work_queue_gets_the_queue_options(broker: fairq.Broker) -> None:
    a = await domain(broker, queue_options={"max_attempts": 2, "visibility_timeout": 7})
    await a.publish("store-1", b"x")
    config = await (await a.queue("store-1")).config()
    assert (config.max_attempts, config.visibility_timeout) == (2, 7)


# -- rule 1: publish stores work and a signal atomically ---------------------------------------
async def test_rule1_publish_stores_work_and_signal(broker: fairq.Broker) -> None:
    a = await domain(broker)
    mid = await a.publish("store-873", {"sku": 1})
    s = await a.stats()
    assert (s.signals_pending, s.keys) == (1, 1)
    assert (await (await a.queue("store-873")).stats()).visible == 1
    sl = await a._take(0)  # the signal leads to the work
    assert sl is not None and sl.key == "store-873"
    (m,), _ = await a._receive(sl, 10, None)
    assert m.id == mid and m.json() == {"sku": 1}


async def test_rule1_nothing_when_the_work_cannot_be_stored(broker: fairq.Broker) -> None:
    a = await domain(broker, queue_options={"max_length": 1})
    await a.publish("k", b"1")
    s = await a._take(0)
    assert s is not None
    with pytest.raises(fairq.QueueFull):
        await a.publish("k", b"2")  # the slice holds the key: no signal may appear either
    assert (await a.stats()).signals_pending == 0
    with pytest.raises(fairq.MessageTooLarge):
        await a.publish("k", b"x" * 300_000)
    assert (await a.stats()).signals_pending == 0


# -- rule 2: coalescing ----------------------------------------------------------------------
async def test_rule2_many_publishes_few_signals(broker: fairq.Broker) -> None:
    a = await domain(broker)
    await a.set_resource("wide-one", plan="wide")
    for i in range(0, 10_000, 500):
        await a.publish_batch("big", [fairq.Outgoing(str(j)) for j in range(i, i + 500)])
    for i in range(50):
        await a.publish("wide-one", str(i))
    keys = {k.key: k for k in await a.key_stats()}
    assert keys["big"].pending == 1, "10,000 publishes, max_concurrency 1: one signal"
    assert keys["wide-one"].pending == 1
    assert (await a.stats()).signals_pending == 2


async def test_rule2_publish_while_busy_adds_no_signal_and_the_end_resignals(
    broker: fairq.Broker,
) -> None:
    a = await domain(broker)
    await a.publish("k", b"1")
    s = await a._take(0)
    assert s is not None
    await a.publish("k", b"2")  # its only slice is running
    assert (await a.stats()).signals_pending == 0
    msgs, _ = await a._receive(s, 1, None)
    await msgs[0].ack()
    await a._end(s, 1, None)
    st = await a.stats()
    assert (st.signals_pending, st.republished, st.processed) == (1, 1, 1)
    s2 = await a._take(0)
    assert s2 is not None and await run_slice(a, s2) == [b"2"]
    assert (await a.stats()).signals_pending == 0


# -- rule 3: the slice algorithm -------------------------------------------------------------
async def test_rule3a_disabled_and_removed_keys_are_dropped(broker: fairq.Broker) -> None:
    a = await domain(broker)
    for key in ("d1", "d2", "r1"):
        await a.publish(key, b"x")
    await a.set_resource("d1", state="disabled")
    await a.set_resource("d2", state="disabled")
    await a.remove("r1")
    assert await a._take(0) is None
    s = await a.stats()
    assert s.discarded == {"disabled": 2, "removed": 1}
    assert (await (await a.queue("d1")).stats()).visible == 1, "the work stays"
    with pytest.raises(fairq.InvalidOption):
        await a.publish("r1", b"y")
    await a.remove("d1", purge=True)
    assert (await (await a.queue("d1")).stats()).visible == 0


async def test_rule3a_paused_keys_are_parked_and_resumed(broker: fairq.Broker) -> None:
    a = await domain(broker)
    await a.publish("p", b"1")
    await a.set_resource("p", state="maintenance")
    assert await a._take(0) is None
    st = await a.stats()
    assert (st.parked, st.signals_pending) == (1, 0)
    for i in range(2, 12):  # parked: these publishes add no signal (the resume does)
        await a.publish("p", str(i).encode())
    st = await a.stats()
    assert (st.parked, st.signals_pending) == (1, 0)
    assert await a._take(0) is None
    await a.set_resource("p", state="active")
    s = await a._take(0)
    assert s is not None and s.key == "p"
    got = await run_slice(a, s)
    assert got == [b"1", b"2"], "max_messages 2"
    while (s := await a._take(0)) is not None:
        got += await run_slice(a, s)
    assert got == [str(i).encode() for i in range(1, 12)]
    assert (await a.stats()).parked == 1


async def test_rule3b_blocked_when_no_token_is_free(broker: fairq.Broker) -> None:
    a = await domain(broker)
    await a.set_resource("k", plan="wide")
    await a.publish_batch("k", [fairq.Outgoing(str(i)) for i in range(10)])
    s1 = await a._take(0)  # backlog 10 > max_messages 2: fans out
    s2 = await a._take(0)
    assert s1 is not None and s2 is not None and s1.token != s2.token
    await a.set_resource("k", plan="basic")  # now only one token: the pending signal is blocked
    assert await a._take(0) is None
    st = await a.stats()
    assert st.blocked == 1 and st.slices == 2


async def test_rule3c_empty_queue_is_not_an_error(broker: fairq.Broker) -> None:
    a = await domain(broker)
    await a.publish("k", b"1")
    await (await a.queue("k")).purge()
    assert await a._take(0) is None
    st = await a.stats()
    assert (st.empty, st.slices, st.signals_pending) == (1, 0, 0)


async def test_rule3d_fan_out_up_to_max_concurrency(broker: fairq.Broker) -> None:
    a = await domain(broker)
    await a.set_resource("k", plan="wide")  # 3 slices of 2
    await a.publish_batch("k", [fairq.Outgoing(str(i)) for i in range(20)])
    slices = [await a._take(0) for _ in range(4)]
    assert [s is not None for s in slices] == [True, True, True, False]
    keys = {k.key: k for k in await a.key_stats()}
    assert (keys["k"].active, keys["k"].pending) == (3, 0)


async def test_rule3e_slice_is_bounded_by_max_messages(broker: fairq.Broker) -> None:
    a = await domain(broker)
    await a.publish_batch("k", [fairq.Outgoing(str(i)) for i in range(5)])
    order = []
    while (s := await a._take(0)) is not None:
        order.append(await run_slice(a, s))
    assert order == [[b"0", b"1"], [b"2", b"3"], [b"4"]]
    st = await a.stats()
    assert (st.processed, st.republished, st.signals_pending) == (5, 2, 0)


@pytest.mark.requires("clock.delays")  # the message waits on RabbitMQ's clock
async def test_delayed_work_gets_a_delayed_signal(
    broker: fairq.Broker, clock: fairq.ManualClock
) -> None:
    a = await domain(broker)
    await a.publish("k", b"later", delay=30)
    assert await a._take(0) is None
    clock.advance(31)
    s = await a._take(0)
    assert s is not None and await run_slice(a, s) == [b"later"]


async def test_immediate_work_is_not_held_behind_a_delayed_signal(
    broker: fairq.Broker, clock: fairq.ManualClock
) -> None:
    a = await domain(broker)
    await a.publish("k", b"later", delay=300)
    await a.publish("k", b"now")
    s = await a._take(0)
    assert s is not None and await run_slice(a, s) == [b"now"]


@pytest.mark.requires("clock.delays")  # the message waits on RabbitMQ's clock
async def test_retries_come_back_to_the_key(broker: fairq.Broker, clock: fairq.ManualClock) -> None:
    a = await domain(broker)
    await a.publish("k", b"flaky")
    s = await a._take(0)
    assert s is not None
    (m,), _ = await a._receive(s, 1, None)
    await m.nack(delay=10)  # the handler failed: retry in 10 s
    await a._end(s, 1, None)
    assert await a._take(0) is None
    clock.advance(11)
    s = await a._take(0)
    assert s is not None
    (m,), _ = await a._receive(s, 1, None)
    assert (m.body, m.attempt) == (b"flaky", 2)


# -- rule 4: fairness ------------------------------------------------------------------------
async def test_rule4_round_robin_over_keys(broker: fairq.Broker) -> None:
    a = await domain(broker)
    for key in ("a", "b", "c"):
        await a.publish_batch(key, [fairq.Outgoing(str(i)) for i in range(6)])  # 3 slices each
    assert await drain_keys(a) == ["a", "b", "c"] * 3


async def test_rule4_share_is_set_by_plan_not_backlog(broker: fairq.Broker) -> None:
    a = await domain(broker)
    await a.set_resource("pro-store", plan="pro")
    await a.publish_batch("huge", [fairq.Outgoing(str(i)) for i in range(1000)])
    await a.publish_batch("pro-store", [fairq.Outgoing(str(i)) for i in range(20)])
    served: Counter[str] = Counter()
    for _ in range(8):
        s = await a._take(0)
        assert s is not None
        served[s.key] += len(await run_slice(a, s))
    assert served == {"huge": 8, "pro-store": 20}, "huge gets 2 per turn, pro 5 per turn"


async def test_rule4_tenants_take_turns_first(broker: fairq.Broker) -> None:
    a = await domain(broker)
    for i in range(20):
        await a.set_resource(f"a{i}", tenant="tenant-a")
        await a.publish_batch(f"a{i}", [fairq.Outgoing(b"x") for _ in range(4)])
    await a.set_resource("b0", tenant="tenant-b")
    await a.publish_batch("b0", [fairq.Outgoing(b"x") for _ in range(40)])
    order = []
    for _ in range(20):
        s = await a._take(0)
        assert s is not None
        order.append("B" if s.key == "b0" else "A")
        await run_slice(a, s)
    assert order.count("B") == 10, "tenant B (one key) gets every other turn: " + "".join(order)
    assert "BB" not in "".join(order) and "AA" not in "".join(order)


async def test_moving_a_key_to_another_tenant_moves_its_signal(broker: fairq.Broker) -> None:
    a = await domain(broker)
    await a.publish("k", b"x")
    await a.set_resource("k", tenant="acme")
    s = await a._take(0)
    assert s is not None and s.key == "k"
    assert (await a.key_stats())[0].tenant == "acme"


# -- rule 6 / 7: no polling; the reconciler --------------------------------------------------
async def test_rule7_reconciler_finds_a_lost_signal(broker: fairq.Broker) -> None:
    a = await domain(broker)
    await a.publish("k", b"1")
    s = await a._take(0)
    assert s is not None
    await run_slice(a, s)
    # work that reached the queue without its signal (written past the attention API)
    await (await a.queue("k")).send(b"orphan")
    assert await a._take(0) is None
    assert await a.reconcile() == 1
    assert await a.reconcile() == 0, "a signal is pending now"
    s = await a._take(0)
    assert s is not None and await run_slice(a, s) == [b"orphan"]
    assert (await a.stats()).reconciled == 1


async def test_a_dead_slice_frees_its_token(broker: fairq.Broker, clock: fairq.ManualClock) -> None:
    a = await domain(broker, slice_lease=10, queue_options={"visibility_timeout": 5})
    await a.publish_batch("k", [fairq.Outgoing(str(i)) for i in range(2)])
    s = await a._take(0)
    assert s is not None
    await a._receive(s, 1, None)  # the worker dies here, holding a message and the token
    assert await a._take(0) is None
    clock.advance(11)  # the token's lease ran out; so did the message's
    s2 = await a._take(0)
    assert s2 is not None and s2.token != s.token
    bodies = await run_slice(a, s2)
    assert sorted(bodies) == [b"0", b"1"]
    with pytest.raises(fairq.LeaseLost):
        await a._receive(s, 1, None)
    assert await a._extend(s) is False


async def test_a_dead_slice_keeps_the_count_of_what_it_acked(
    broker: fairq.Broker, clock: fairq.ManualClock
) -> None:
    """A worker killed mid-slice has acked some messages (acked and counted in one step):
    they stay counted for the key and, once the slice's token expires, for the domain; the
    handled-but-unacked one comes back and counts once, in the slice that handles it."""
    plans = {"basic": Plan(1, 10, 20.0)}
    a = await domain(broker, plans=plans, slice_lease=10, queue_options={"visibility_timeout": 5})
    await a.publish_batch("k", [fairq.Outgoing(str(i)) for i in range(4)])
    s = await a._take(0)
    assert s is not None
    msgs, _ = await a._receive(s, 3, None)
    assert await a._progress(s, msgs[:2]) == []  # acked and counted; msgs[2] handled, not
    (key,) = await a.key_stats()
    assert key.processed == 2
    clock.advance(11)  # the worker died: its token and its last message's lease run out
    s2 = await a._take(0)
    assert s2 is not None
    assert sorted(await run_slice(a, s2)) == [b"2", b"3"]
    st = await a.stats()
    (key,) = await a.key_stats()
    assert (st.processed, key.processed) == (4, 4)


async def test_a_worker_killed_between_the_last_acks_and_the_end_leaves_them_counted(
    broker: fairq.Broker, clock: fairq.ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slice's end carries its last acks. Where the engine cannot do both in one step,
    the acks go first, acked and counted together as any batch of a slice's acks, so a
    worker killed before the end leaves them counted (they were acked: they never come
    back to count later). Before, PostgreSQL and SQLite acked them with a plain ack, and
    such a kill left them out of processed for good."""
    plans = {"basic": Plan(1, 10, 20.0)}
    a = await domain(broker, plans=plans, slice_lease=10, queue_options={"visibility_timeout": 60})
    await a.publish_batch("k", [fairq.Outgoing(str(i)) for i in range(3)])
    s = await a._take(0)
    assert s is not None
    msgs, _ = await a._receive(s, 3, None)
    assert await a._progress(s, msgs[:2]) == []

    async def killed(*args: object) -> None:
        raise RuntimeError("the worker was killed here")

    # an engine that does the acks and the end in one step (Redis) never calls
    # attention_end: it does both or neither, and here both
    monkeypatch.setattr(broker.backend, "attention_end", killed)
    with contextlib.suppress(RuntimeError):
        await a._end(s, 3, None, msgs[2:])
    monkeypatch.undo()
    clock.advance(11)  # the dead slice's token runs out; the next step sweeps it
    assert await a._take(0) is None
    st = await a.stats()
    (key,) = await a.key_stats()
    acked = (await (await a.queue("k")).stats()).acked
    assert (st.processed, key.processed, st.slices) == (acked, acked, 0), (st, key, acked)


async def test_acks_after_the_token_expired_count_for_the_key_and_the_domain(
    broker: fairq.Broker, clock: fairq.ManualClock
) -> None:
    """A slice whose token expired (the sweep ended it with what it had counted) may still
    ack what it leased: those acks count for the key and the domain alike, and its late
    end adds nothing (the worker sends a lost slice's last acks as progress)."""
    plans = {"basic": Plan(1, 10, 20.0)}
    a = await domain(broker, plans=plans, slice_lease=10, queue_options={"visibility_timeout": 60})
    await a.publish_batch("k", [fairq.Outgoing(str(i)) for i in range(4)])
    s = await a._take(0)
    assert s is not None
    msgs, _ = await a._receive(s, 4, None)
    await a._progress(s, msgs[:1])
    clock.advance(11)  # the token expires; the next step sweeps it
    await a._take(0)
    assert (await a.stats()).processed == 1, "the sweep took what the slice had counted"
    await a._progress(s, msgs[1:3])
    await a._progress(s, msgs[3:])
    await a._end(s, 4, None)
    st = await a.stats()
    (key,) = await a.key_stats()
    assert (st.processed, key.processed) == (4, 4)


async def test_the_end_counts_only_what_the_slice_did_not_count_on_the_way(
    broker: fairq.Broker,
) -> None:
    plans = {"basic": Plan(1, 10, 20.0)}
    a = await domain(broker, plans=plans)
    await a.publish_batch("k", [fairq.Outgoing(str(i)) for i in range(5)])
    s = await a._take(0)
    assert s is not None
    msgs, _ = await a._receive(s, 5, None)
    await a._progress(s, msgs[:3])
    lost = await a._end(s, 5, None, msgs[3:])  # the last two acked with the end
    assert lost == []
    st = await a.stats()
    (key,) = await a.key_stats()
    assert (st.processed, key.processed) == (5, 5)
    assert (await (await a.queue("k")).stats()).acked == 5


async def test_slices_keep_their_token_while_extended(
    broker: fairq.Broker, clock: fairq.ManualClock
) -> None:
    a = await domain(broker, slice_lease=10)
    await a.publish_batch("k", [fairq.Outgoing(b"x") for _ in range(2)])
    s = await a._take(0)
    assert s is not None
    for _ in range(3):
        clock.advance(6)
        assert await a._extend(s) is True
    assert (await a.stats()).slices == 1


# -- rule 8: rate limits ---------------------------------------------------------------------
async def test_rule8_rate_limit(broker: fairq.Broker, clock: fairq.ManualClock) -> None:
    plans = {"basic": Plan(1, 100, 20.0, rate=10.0, burst=5.0)}
    a = await domain(broker, plans=plans)
    await a.publish_batch("k", [fairq.Outgoing(str(i)) for i in range(30)])
    s = await a._take(0)
    assert s is not None
    msgs, retry_at = await a._receive(s, 100, None)
    assert len(msgs) == 5 and retry_at is None, "the burst"
    for m in msgs:
        await m.ack()
    msgs, retry_at = await a._receive(s, 100, None)
    assert msgs == [] and retry_at is not None
    # half a burst: a take that comes up to 0.2 s late still finds room in the bucket
    assert retry_at - clock.now() == pytest.approx(0.3, abs=1e-5), "when 3 of 5 are back"
    await a._end(s, 5, retry_at)
    assert await a._take(0) is None, "nobody spins: the key's signal waits for the bucket"
    st = await a.stats()
    assert (st.rate_limited, st.signals_pending) == (1, 1)
    clock.advance(0.2)
    assert await a._take(0) is None, "not before its due time"
    clock.advance(0.1 + 1e-5)  # 3 more tokens
    s = await a._take(0)
    assert s is not None
    msgs, retry_at = await a._receive(s, 100, None)
    assert len(msgs) == 3 and retry_at is None
    for m in msgs:
        await m.ack()
    await a._end(s, 3, (await a._receive(s, 100, None))[1])
    clock.advance(0.45)  # a take 0.15 s late: the bucket kept every token since (4.5)
    s = await a._take(0)
    assert s is not None
    msgs, _ = await a._receive(s, 100, None)
    assert len(msgs) == 4


async def test_an_immediate_message_pulls_a_delayed_signal_forward(
    broker: fairq.Broker, clock: fairq.ManualClock
) -> None:
    a = await domain(broker)
    await a.publish("k", b"later", delay=30)
    assert await a._take(0) is None, "the key's only signal waits for the delayed message"
    await a.publish("k", b"now")
    s = await a._take(0)
    assert s is not None, "the immediate message does not wait behind the delayed signal"
    assert (await a.stats()).signals_pending == 0


async def test_a_ready_signal_is_not_doubled_by_pulling_forward(
    broker: fairq.Broker, clock: fairq.ManualClock
) -> None:
    plans = {"basic": Plan(3, 100, 20.0, rate=10.0, burst=5.0)}
    a = await domain(broker, plans=plans)
    await a.publish_batch("k", [fairq.Outgoing(str(i)) for i in range(30)])
    s = await a._take(0)
    assert s is not None
    msgs, _ = await a._receive(s, 100, None)
    for m in msgs:
        await m.ack()
    _, retry_at = await a._receive(s, 100, None)
    assert retry_at is not None, "the bucket is empty"
    await a.publish("k", b"x")  # a free slot: a ready signal
    await a._end(s, len(msgs), retry_at)  # and a delayed one for the bucket
    assert (await a.stats()).signals_pending == 2
    await a.publish("k", b"y")  # a ready signal exists: nothing is pulled forward
    assert await a._take(0) is None  # the ready one meets the empty bucket
    assert await a._take(0) is None
    st = await a.stats()
    assert (st.rate_limited, st.signals_pending) == (2, 2)  # the slice end, then one take


# -- stats -----------------------------------------------------------------------------------
async def test_key_stats_and_clear_time(broker: fairq.Broker, clock: fairq.ManualClock) -> None:
    a = await domain(broker)
    await a.set_resource("quiet", plan="pro", tenant="t1")
    await a.publish_batch("busy", [fairq.Outgoing(b"x") for _ in range(3)])
    clock.advance(4)
    top = await a.key_stats(top=5)
    assert [(k.key, k.backlog, k.plan, k.state) for k in top] == [
        ("busy", 3, "basic", "active"),
        ("quiet", 0, "pro", "active"),
    ]
    assert top[0].oldest_age == pytest.approx(4, abs=0.01)
    assert top[1].tenant == "t1"
    await drain_keys(a)
    st = await a.stats()
    assert st.clear_time_avg == pytest.approx(4, abs=0.01)
    assert (await a.key_stats())[0].processed in (0, 3)
    with pytest.raises(fairq.InvalidOption):
        await a.key_stats(top=0)


@pytest.mark.parametrize(
    "options",
    [{"charge": "messages"}, {"plans": {"w": Plan(weight=3.0)}, "default_plan": "w"}],
)
async def test_weights_and_charges_need_the_worker_time_scheduler(
    broker: fairq.Broker, options: dict[str, object]
) -> None:
    """An engine without the scheduler (its capability table lists
    ``worker_time_fairness``) refuses what it would not honour, rather than differ."""
    if "worker_time_fairness" in broker.backend.missing:
        with pytest.raises(fairq.Unsupported, match="worker-time scheduler"):
            await broker.declare_attention("opts", **options)  # type: ignore[arg-type]
        a = await broker.declare_attention("opts")  # the defaults are every engine's
        with pytest.raises(fairq.Unsupported):
            await a.tenant_stats()
        return
    a = await broker.declare_attention("opts", **options)  # type: ignore[arg-type]
    assert (await a.config()).uses_worker_time_fairness()
    with pytest.raises(fairq.InvalidOption, match="charge"):
        await broker.declare_attention("opts", charge="bytes")  # type: ignore[arg-type]


async def test_set_resource_checks_its_input(broker: fairq.Broker) -> None:
    a = await domain(broker)
    with pytest.raises(fairq.InvalidOption):
        await a.set_resource("k", plan="platinum")
    with pytest.raises(fairq.InvalidOption):
        await a.set_resource("k", state="sleeping")  # type: ignore[arg-type]
    with pytest.raises(fairq.InvalidName):
        await a.set_resource("bad key")
    with pytest.raises(fairq.InvalidName):
        await a.publish("bad/key", b"x")


# -- the worker runtime ----------------------------------------------------------------------
async def test_worker_keeps_order_with_max_concurrency_1(live_broker: fairq.Broker) -> None:
    a = await live_broker.declare_attention("orders", plans={"basic": Plan(1, 7, 20.0)})
    for key in ("s1", "s2", "s3"):
        await a.publish_batch(key, [fairq.Outgoing(f"{key}-{i}") for i in range(40)])
    seen: dict[str, list[str]] = {}
    running: Counter[str] = Counter()
    overlap = []
    worker = fairq.Worker(live_broker, concurrency=8, handle_signals=False, poll_wait=0.1)

    @worker.attention("orders")
    async def handle(msg: fairq.Received) -> None:
        assert msg.key is not None
        running[msg.key] += 1
        overlap.append(running[msg.key])
        seen.setdefault(msg.key, []).append(msg.text())
        await asyncio.sleep(0.001)
        running[msg.key] -= 1

    task = asyncio.create_task(worker.run())
    try:
        for _ in range(300):
            if (await a.stats()).processed == 120:
                break
            await asyncio.sleep(0.05)
    finally:
        worker.stop()
        await asyncio.wait_for(task, 10)
    assert max(overlap) == 1, "one message of a key at a time"
    for key in ("s1", "s2", "s3"):
        assert seen[key] == [f"{key}-{i}" for i in range(40)], "in order"
    st = await a.stats()
    assert (st.processed, st.slices, st.signals_pending) == (120, 0, 0)


async def test_idle_worker_makes_no_per_key_calls(live_broker: fairq.Broker) -> None:
    a = await live_broker.declare_attention("idle")
    for i in range(200):
        await a.publish(f"store-{i}", b"x")
    worker = fairq.Worker(live_broker, concurrency=4, handle_signals=False, poll_wait=0.2)

    @worker.attention("idle")
    async def handle(msg: fairq.Received) -> None:
        pass

    task = asyncio.create_task(worker.run())
    while (await a.stats()).processed < 200:  # noqa: ASYNC110 - polls the backend
        await asyncio.sleep(0.05)
    backend = live_broker.backend
    calls: Counter[str] = Counter()
    originals = {}
    for name in ("receive", "stats", "peek", "attention_receive", "attention_take"):
        originals[name] = getattr(backend, name)

        def counting(*args: object, _name: str = name, **kw: object) -> object:
            calls[_name] += 1
            return originals[_name](*args, **kw)

        setattr(backend, name, counting)
    try:
        await asyncio.sleep(0.8)  # every queue is empty now
    finally:
        for name, fn in originals.items():
            setattr(backend, name, fn)
        worker.stop()
        await asyncio.wait_for(task, 10)
    per_key = calls["receive"] + calls["stats"] + calls["peek"] + calls["attention_receive"]
    assert per_key == 0, f"no work queue is touched while all are empty: {calls}"
    assert calls["attention_take"] <= 4 * 10, "takes wait on wake-ups, not a busy loop"


async def test_worker_serves_every_key(live_broker: fairq.Broker) -> None:
    a = await live_broker.declare_attention("stores", plans={"basic": Plan(2, 10, 5.0)})
    for i in range(30):
        await a.publish_batch(f"s{i}", [fairq.Outgoing(str(j)) for j in range(i % 7 + 1)])
    done: Counter[str] = Counter()
    worker = fairq.Worker(live_broker, concurrency=6, handle_signals=False, poll_wait=0.1)

    @worker.attention("stores")
    def handle(msg: fairq.Received) -> None:  # a sync handler, in the thread pool
        assert msg.key is not None
        done[msg.key] += 1

    task = asyncio.create_task(worker.run())
    total = sum(i % 7 + 1 for i in range(30))
    try:
        for _ in range(300):
            if sum(done.values()) >= total and (await a.stats()).slices == 0:
                break
            await asyncio.sleep(0.05)
    finally:
        worker.stop()
        await asyncio.wait_for(task, 10)
    assert done == {f"s{i}": i % 7 + 1 for i in range(30)}


async def test_a_slice_acks_each_message_as_it_finishes(live_broker: fairq.Broker) -> None:
    """Not at the end of the slice: a worker killed mid-slice leaves few handled messages
    unacked (they would be delivered again)."""
    a = await live_broker.declare_attention("asyougo", plans={"basic": Plan(1, 10, 60.0)})
    await a.publish_batch("k", [fairq.Outgoing(str(i)) for i in range(10)])
    q = await a.queue("k")
    acked_before: list[int] = []
    worker = fairq.Worker(live_broker, concurrency=1, handle_signals=False, poll_wait=0.1)

    @worker.attention("asyougo")
    async def handle(msg: fairq.Received) -> None:
        await asyncio.sleep(0.02)  # time for the acks of the messages before this one
        acked_before.append((await q.stats()).acked)

    task = asyncio.create_task(worker.run())
    try:
        for _ in range(300):
            if (await q.stats()).acked == 10:
                break
            await asyncio.sleep(0.02)
    finally:
        worker.stop()
        await asyncio.wait_for(task, 10)
    assert len(acked_before) == 10 and (await a.stats()).slices == 0
    assert acked_before[5] >= 4, f"messages are acked while the slice runs: {acked_before}"
    assert (await a.stats()).processed == 10


async def test_an_ack_racing_a_lease_extension_is_no_lost_lease(
    live_broker: fairq.Broker, caplog: pytest.LogCaptureFixture
) -> None:
    """The lease keeper extends a message whose handler runs long; its ack lands while the
    extension is on its way (the extension answers "not current"): no warning, no count."""
    a = await live_broker.declare_attention(
        "race", plans={"basic": Plan(1, 3, 60.0)}, queue_options={"visibility_timeout": 0.4}
    )
    await a.publish_batch("k", [fairq.Outgoing(str(i)) for i in range(3)])
    worker = fairq.Worker(live_broker, concurrency=1, handle_signals=False, poll_wait=0.1)

    @worker.attention("race")
    async def handle(msg: fairq.Received) -> None:
        await asyncio.sleep(0.3)  # past half the lease: the keeper extends it

    caplog.set_level("WARNING", logger="fairq")
    with extensions_after_acks(live_broker) as raced:
        task = asyncio.create_task(worker.run())
        try:
            for _ in range(300):
                if (await a.stats()).processed == 3:
                    break
                await asyncio.sleep(0.02)
        finally:
            worker.stop()
            await asyncio.wait_for(task, 10)
    assert raced, "the race happened: an extension answered after the ack"
    assert worker.stats.lease_lost == 0
    assert "lost" not in caplog.text, caplog.text


@pytest.mark.requires("attention.one_take_per_due")
async def test_a_due_signal_costs_one_take_however_many_takers(
    live_broker: fairq.Broker, url: str, backend_name: str
) -> None:
    """A rate-limited key comes due again and again; two takers wait for it — two Workers
    in one process (memory), two brokers (as two processes would have) elsewhere. Each
    due signal is taken by one of them: at most 2.5 take attempts per handled message."""
    plans = {"basic": Plan(1, 10, 60.0, rate=40.0, burst=1.0)}
    a = await live_broker.declare_attention("due", plans=plans)
    other = live_broker if backend_name == "memory" else await fairq.connect(url)
    brokers = [live_broker, other]
    takes: Counter[int] = Counter()
    originals = []
    for i, b in enumerate(dict.fromkeys(brokers)):
        take = b.backend.attention_take
        originals.append((b.backend, take))

        async def counted(domain: str, _take: Any = take, _i: int = i) -> Slice | None:
            takes[_i] += 1
            return await _take(domain)  # type: ignore[no-any-return]

        b.backend.attention_take = counted  # type: ignore[method-assign]
    handled = 0
    workers = [fairq.Worker(b, concurrency=2, handle_signals=False, poll_wait=1.0) for b in brokers]
    for w in workers:

        @w.attention("due")
        async def handle(msg: fairq.Received) -> None:
            nonlocal handled
            handled += 1

    tasks = [asyncio.create_task(w.run()) for w in workers]
    await asyncio.sleep(0.3)  # both wait on the empty domain
    await a.publish_batch("api", [fairq.Outgoing(str(i)) for i in range(30)])
    try:
        for _ in range(400):
            if handled >= 30:
                break
            await asyncio.sleep(0.02)
    finally:
        for w in workers:
            w.stop()
        await asyncio.gather(*tasks)
        for backend, take in originals:
            backend.attention_take = take  # type: ignore[method-assign]
        if other is not live_broker:
            await other.close()
    assert handled == 30
    # taking at every due time and every commit of the other process was 6.8 attempts a
    # message; one take per due is ~1, up to 1.7 on a loaded machine (a taker waking
    # from its look a little before the key is due tries again)
    assert sum(takes.values()) <= 2.5 * handled, f"take attempts {dict(takes)} for {handled}"


async def test_memory_stays_flat_while_an_attention_worker_is_busy(
    live_broker: fairq.Broker,
) -> None:
    """An attention worker kept busy on 50 keys lets go of what it has handled (the RabbitMQ
    backend kept an entry per lease until its visibility timeout would have ended)."""
    a = await live_broker.declare_attention("busy", plans={"basic": Plan(2, 20, 60.0)})
    worker = fairq.Worker(live_broker, concurrency=20, handle_signals=False, poll_wait=0.2)

    async def feed() -> int:
        for key in random.sample(range(50), 10):
            bodies = [fairq.Outgoing(os.urandom(held.BODY)) for _ in range(20)]
            await a.publish_batch(f"k{key}", bodies)
        return 200

    # 1,800 messages (3.6 MB of bodies) handled between the two readings
    await held.assert_flat_while_busy(worker, worker.attention("busy"), feed, 2500, 300, 2100)
