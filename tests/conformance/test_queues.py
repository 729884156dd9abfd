"""SPEC §3, rule by rule, on every backend. Time moves with the manual clock, except in
tests about waiting (long polls, blocked sends), which use the real one."""

from __future__ import annotations

import asyncio
import time

import pytest

import fairq

Outgoing = fairq.Outgoing


async def bodies(msgs: list[fairq.Received]) -> list[bytes]:
    return [m.body for m in msgs]


async def receive_n(q: fairq.Queue, n: int) -> list[fairq.Received]:
    """``n`` messages of ``q``, in as many long polls as it takes (each must bring some)."""
    got: list[fairq.Received] = []
    while len(got) < n:
        more = await q.receive(max_messages=n - len(got), wait=2)
        assert more, f"only {len(got)} of {n} came"
        got += more
    return got


# -- rule 1: competing consumers -----------------------------------------------------------
async def test_rule1_each_visible_message_goes_to_one_receiver(broker: fairq.Broker) -> None:
    q = await broker.declare_queue("jobs")
    await q.send_batch([Outgoing(str(i)) for i in range(30)])
    results = await asyncio.gather(*[q.receive(max_messages=7) for _ in range(6)])
    got = [m.body for batch in results for m in batch]
    assert all(len(batch) <= 7 for batch in results)
    assert sorted(got, key=int) == [str(i).encode() for i in range(30)]
    assert await q.receive(max_messages=10) == []


async def test_rule1_receive_returns_up_to_max(broker: fairq.Broker) -> None:
    q = await broker.declare_queue("jobs")
    await q.send_batch([Outgoing(b"x") for _ in range(5)])
    assert len(await q.receive()) == 1
    assert len(await q.receive(max_messages=3)) == 3
    assert len(await q.receive(max_messages=3)) == 1


# -- rule 2: order -------------------------------------------------------------------------
async def test_rule2_send_order(broker: fairq.Broker) -> None:
    q = await broker.declare_queue("ordered")
    for i in range(20):
        await q.send(str(i))
    got = []
    while batch := await q.receive(max_messages=3):
        got += await bodies(batch)
    assert got == [str(i).encode() for i in range(20)]


async def test_rule2_priority_first_then_order(broker: fairq.Broker) -> None:
    q = await broker.declare_queue("prio", max_priority=9)
    await q.send_batch(
        [
            Outgoing(b"low-1", priority=0),
            Outgoing(b"high-1", priority=9),
            Outgoing(b"mid-1", priority=4),
            Outgoing(b"high-2", priority=9),
            Outgoing(b"low-2", priority=0),
        ]
    )
    got = await bodies(await q.receive(max_messages=10))
    assert got == [b"high-1", b"high-2", b"mid-1", b"low-1", b"low-2"]


@pytest.mark.requires("clock.delays")
async def test_rule2_order_of_becoming_available(
    broker: fairq.Broker, clock: fairq.ManualClock
) -> None:
    q = await broker.declare_queue("avail")
    await q.send(b"delayed-5", delay=5)
    await q.send(b"delayed-2", delay=2)
    clock.advance(1)
    await q.send(b"now")
    assert await bodies(await q.receive(max_messages=10)) == [b"now"]
    clock.advance(10)
    # both came due; they are delivered in the order they became available
    assert await bodies(await q.receive(max_messages=10)) == [b"delayed-2", b"delayed-5"]


async def test_rule2_nacked_message_goes_behind_earlier_ones(
    broker: fairq.Broker, clock: fairq.ManualClock
) -> None:
    q = await broker.declare_queue("requeue")
    await q.send_batch([Outgoing(b"a"), Outgoing(b"b")])
    (a,) = await q.receive()
    clock.advance(1)
    await a.nack()
    assert await bodies(await q.receive(max_messages=5)) == [b"b", b"a"]


# -- rule 3: lease -------------------------------------------------------------------------
async def test_rule3_lease_hides_and_counts_attempts(
    broker: fairq.Broker, clock: fairq.ManualClock
) -> None:
    q = await broker.declare_queue("lease", visibility_timeout=30)
    await q.send(b"x")
    (first,) = await q.receive()
    assert first.attempt == 1
    clock.advance(29.9)
    assert await q.receive() == []
    clock.advance(0.2)
    (second,) = await q.receive()
    assert second.attempt == 2 and second.id == first.id
    assert second.receipt != first.receipt


async def test_rule3_visibility_timeout_per_receive(
    broker: fairq.Broker, clock: fairq.ManualClock
) -> None:
    q = await broker.declare_queue("lease2", visibility_timeout=30)
    await q.send(b"x")
    await q.receive(visibility_timeout=2)
    clock.advance(2.5)
    assert len(await q.receive()) == 1


# -- rule 4: ack, and stale receipts -------------------------------------------------------
async def test_rule4_ack_deletes(broker: fairq.Broker, clock: fairq.ManualClock) -> None:
    q = await broker.declare_queue("ack", visibility_timeout=5)
    await q.send(b"x")
    (m,) = await q.receive()
    await m.ack()
    clock.advance(100)
    assert await q.receive() == []
    s = await q.stats()
    assert (s.visible, s.in_flight, s.acked) == (0, 0, 1)


async def test_rule4_stale_receipt_raises_and_changes_nothing(
    broker: fairq.Broker, clock: fairq.ManualClock
) -> None:
    q = await broker.declare_queue("stale", visibility_timeout=5)
    await q.send(b"x")
    (old,) = await q.receive()
    clock.advance(6)  # the lease ran out
    for settle in (old.ack(), old.nack(), old.extend(10), old.dead_letter("bad")):
        with pytest.raises(fairq.LeaseLost):
            await settle
    (new,) = await q.receive()  # redelivered; the old receipt still changes nothing
    assert new.attempt == 2
    with pytest.raises(fairq.LeaseLost):
        await old.ack()
    s = await q.stats()
    assert (s.in_flight, s.acked, s.nacked, s.dead_lettered) == (1, 0, 0, 0)
    await new.ack()
    with pytest.raises(fairq.LeaseLost):
        await new.ack()  # acked twice


async def test_rule4_ack_batch_reports_lost_and_acks_the_rest(
    broker: fairq.Broker, clock: fairq.ManualClock
) -> None:
    q = await broker.declare_queue("batch", visibility_timeout=5)
    await q.send_batch([Outgoing(b"a"), Outgoing(b"b")])
    (a,) = await q.receive(visibility_timeout=1)
    (b,) = await q.receive(visibility_timeout=10)
    clock.advance(2)
    with pytest.raises(fairq.LeaseLost) as info:
        await q.ack_batch([a.receipt, b.receipt])
    assert info.value.lost == [a.receipt]
    s = await q.stats()
    assert (s.acked, s.visible, s.in_flight) == (1, 1, 0)


@pytest.mark.parametrize(
    "fifo", [False, pytest.param(True, marks=pytest.mark.requires("fifo"))], ids=["plain", "fifo"]
)
async def test_rule4_the_old_receipt_of_a_redelivered_message_is_lost_beside_the_new(
    broker: fairq.Broker, clock: fairq.ManualClock, fifo: bool
) -> None:
    """One call with the stale receipt and the current one of the same message (a worker's
    timed-out handler and the redelivered one finishing together): only the current one
    counts, for acks, extensions and releases alike."""
    q = await broker.declare_queue("twice", visibility_timeout=5, fifo=fifo)
    await q.send(b"x")
    (old,) = await q.receive()
    clock.advance(6)
    (new,) = await q.receive()
    assert await q.extend_batch([old.receipt, new.receipt], 30) == [old.receipt]
    assert await q.release_batch([old.receipt, new.receipt]) == [old.receipt]
    (new,) = await q.receive()
    with pytest.raises(fairq.LeaseLost) as info:
        await q.ack_batch([old.receipt, new.receipt])
    assert info.value.lost == [old.receipt]
    s = await q.stats()
    assert (s.acked, s.visible, s.in_flight) == (1, 0, 0)
    await q.send(b"y")
    (old,) = await q.receive()
    clock.advance(6)
    (new,) = await q.receive()
    acks = await asyncio.gather(old.ack(), new.ack(), return_exceptions=True)
    assert isinstance(acks[0], fairq.LeaseLost) and acks[1] is None, acks


async def test_rule4_receipt_of_another_queue_is_lost(broker: fairq.Broker) -> None:
    q1 = await broker.declare_queue("one")
    q2 = await broker.declare_queue("two")
    await q1.send(b"x")
    (m,) = await q1.receive()
    with pytest.raises(fairq.LeaseLost):
        await q2.ack_batch([m.receipt])
    assert (await q1.stats()).in_flight == 1


# -- rule 5: redelivery --------------------------------------------------------------------
@pytest.mark.requires("clock.delays", "stats.delayed")
async def test_rule5_nack_delay(broker: fairq.Broker, clock: fairq.ManualClock) -> None:
    q = await broker.declare_queue("nack")
    await q.send(b"x")
    (m,) = await q.receive()
    await m.nack(delay=10)
    s = await q.stats()
    assert (s.delayed, s.in_flight, s.nacked) == (1, 0, 1)
    clock.advance(9.9)
    assert await q.receive() == []
    clock.advance(0.2)
    (again,) = await q.receive()
    assert again.attempt == 2


async def test_rule5_nack_now(broker: fairq.Broker) -> None:
    q = await broker.declare_queue("nack0")
    await q.send(b"x")
    (m,) = await q.receive()
    await m.nack()
    (again,) = await q.receive()
    assert again.id == m.id and again.attempt == 2


async def test_extend_keeps_the_lease(broker: fairq.Broker, clock: fairq.ManualClock) -> None:
    q = await broker.declare_queue("extend", visibility_timeout=10)
    await q.send(b"x")
    (m,) = await q.receive()
    clock.advance(8)
    await m.extend(20)  # now ends 20 s from now
    clock.advance(15)
    assert await q.receive() == []
    await m.ack()
    clock.advance(100)
    assert await q.receive() == []


async def test_release_does_not_count_the_attempt(broker: fairq.Broker) -> None:
    q = await broker.declare_queue("release", max_attempts=1)
    await q.send(b"x")
    (m,) = await q.receive()
    assert await q.release_batch([m.receipt]) == []
    (again,) = await q.receive()
    assert again.attempt == 1
    assert await q.release_batch([m.receipt]) == [m.receipt]


# -- rule 6: attempts and dead letters -----------------------------------------------------
async def test_rule6_max_attempts_by_expiry(broker: fairq.Broker, clock: fairq.ManualClock) -> None:
    q = await broker.declare_queue("flaky", visibility_timeout=1, max_attempts=3)
    mid = await q.send(b"boom", attributes={"order": "o-1"})
    for attempt in (1, 2, 3):
        (m,) = await q.receive()
        assert m.attempt == attempt
        clock.advance(1.5)
    assert await q.receive() == []
    dlq = broker.queue("flaky.dlq")
    (dead,) = await dlq.receive()
    assert dead.body == b"boom"
    assert dead.attributes == {
        "order": "o-1",
        "fairq.reason": "max_attempts",
        "fairq.source": "flaky",
        "fairq.original_id": mid,
        "fairq.attempts": "3",
    }
    assert dead.id != mid
    s = await q.stats()
    assert (s.dead_lettered, s.visible, s.in_flight, s.redelivered) == (1, 0, 0, 2)


async def test_rule6_max_attempts_by_nack(broker: fairq.Broker) -> None:
    q = await broker.declare_queue("nacky", max_attempts=2)
    await q.send(b"x")
    (m,) = await q.receive()
    await m.nack()
    (m,) = await q.receive()
    await m.nack(delay=60)  # the last attempt: no delay, straight to the DLQ
    (dead,) = await broker.queue("nacky.dlq").receive()
    assert dead.attributes["fairq.reason"] == "max_attempts"
    assert dead.attributes["fairq.attempts"] == "2"


async def test_rule6_a_last_nack_keeps_its_error_as_the_detail(broker: fairq.Broker) -> None:
    """``nack(error=...)``: the text is the dead letter's ``fairq.detail`` when the nack
    dead-letters the message; an earlier nack's error is not kept."""
    q = await broker.declare_queue("erring", max_attempts=2)
    await q.send(b"x", attributes={"order": "7"})
    (m,) = await q.receive()
    await m.nack(error="TimeoutError: first")
    (m,) = await q.receive()
    await m.nack(error="ValueError: bad total " + "x" * 2000)
    (dead,) = await broker.queue("erring.dlq").receive()
    attrs = dead.attributes
    assert (attrs["fairq.reason"], attrs["fairq.attempts"], attrs["order"]) == (
        "max_attempts",
        "2",
        "7",
    )
    assert attrs["fairq.detail"] == ("ValueError: bad total " + "x" * 2000)[:1000]
    # without an error, no detail
    await q.send(b"y")
    for _ in range(2):
        (m,) = await q.receive()
        await m.nack()
    await dead.ack()
    (dead,) = await broker.queue("erring.dlq").receive()
    assert dead.body == b"y" and "fairq.detail" not in dead.attributes
    await q.send(b"z")
    (m,) = await q.receive()
    with pytest.raises(fairq.InvalidOption):
        await m.nack(error=3)  # type: ignore[arg-type]


async def test_rule6_dead_letter_now(broker: fairq.Broker) -> None:
    q = await broker.declare_queue("poison", max_attempts=None)
    await q.send(b"x")
    (m,) = await q.receive()
    await m.dead_letter("unparseable order")
    (dead,) = await broker.queue("poison.dlq").receive()
    assert dead.attributes["fairq.reason"] == "rejected"
    assert dead.attributes["fairq.detail"] == "unparseable order"
    assert dead.attributes["fairq.attempts"] == "1"


async def test_rule6_discard_when_no_dead_letter_queue(
    broker: fairq.Broker, clock: fairq.ManualClock
) -> None:
    q = await broker.declare_queue("nodlq", dead_letter=None, max_attempts=1, visibility_timeout=1)
    assert await broker.list_queues() == ["nodlq"]
    await q.send(b"x")
    await q.receive()
    clock.advance(2)
    assert await q.receive() == []
    s = await q.stats()
    assert (s.discarded, s.dead_lettered) == (1, 0)


async def test_rule6_unlimited_attempts(broker: fairq.Broker, clock: fairq.ManualClock) -> None:
    q = await broker.declare_queue("forever", max_attempts=None, visibility_timeout=1)
    await q.send(b"x")
    for attempt in range(1, 21):
        (m,) = await q.receive()
        assert m.attempt == attempt
        clock.advance(1.5)


async def test_rule6_custom_dead_letter_queue(broker: fairq.Broker) -> None:
    q = await broker.declare_queue("src", dead_letter="graveyard", max_attempts=1)
    await q.send(b"x")
    (m,) = await q.receive()
    await m.nack()
    assert len(await broker.queue("graveyard").receive()) == 1


# -- rule 7: retention ---------------------------------------------------------------------
@pytest.mark.requires("clock.retention", "clock.delays")
async def test_rule7_retention(broker: fairq.Broker, clock: fairq.ManualClock) -> None:
    q = await broker.declare_queue("short", retention=60)
    await q.send(b"old")
    await q.send(b"delayed", delay=30)
    clock.advance(59)
    await q.send(b"fresh")
    clock.advance(2)
    assert await bodies(await q.receive(max_messages=10)) == [b"fresh"]
    dead = await broker.queue("short.dlq").receive(max_messages=10)
    assert sorted(m.body for m in dead) == [b"delayed", b"old"]
    assert {m.attributes["fairq.reason"] for m in dead} == {"expired"}
    s = await q.stats()
    assert (s.expired, s.dead_lettered) == (2, 2)


@pytest.mark.requires("clock.retention")
async def test_rule7_retention_is_applied_when_stats_are_read(
    broker: fairq.Broker, clock: fairq.ManualClock
) -> None:
    q = await broker.declare_queue("short3", retention=60, visibility_timeout=120)
    await q.send(b"leased")
    await q.send(b"old")
    (held,) = await q.receive()
    assert held.body == b"leased"
    await q.send(b"delayed", delay=30)
    clock.advance(61)
    s = await q.stats()  # nothing received: stats alone expire what is past retention
    assert (s.visible, s.delayed, s.in_flight, s.expired) == (0, 0, 1, 2)
    assert (await broker.queue("short3.dlq").stats()).visible == 2
    await held.ack()  # the leased one is checked when its lease ends, not before


@pytest.mark.requires("clock.retention")
async def test_rule7_retention_after_redelivery(
    broker: fairq.Broker, clock: fairq.ManualClock
) -> None:
    q = await broker.declare_queue("short2", retention=10, visibility_timeout=8, max_attempts=None)
    await q.send(b"x")
    await q.receive()
    clock.advance(8.5)
    assert len(await q.receive()) == 1  # 8.5 s old: still delivered
    clock.advance(8.5)
    assert await q.receive() == []  # 17 s old: expired when its lease ended
    assert (await q.stats()).expired == 1


# -- rule 8: bounded queues ----------------------------------------------------------------
@pytest.mark.requires("bounded.in_flight")
async def test_rule8_reject(broker: fairq.Broker) -> None:
    q = await broker.declare_queue("bounded", max_length=3)
    await q.send_batch([Outgoing(b"1"), Outgoing(b"2")])
    with pytest.raises(fairq.QueueFull):
        await q.send_batch([Outgoing(b"3"), Outgoing(b"4")])  # all or nothing
    await q.send(b"3")
    with pytest.raises(fairq.QueueFull):
        await q.send(b"4")
    s = await q.stats()
    assert (s.visible, s.sent) == (3, 3)
    (m,) = await q.receive()
    with pytest.raises(fairq.QueueFull):
        await q.send(b"4")  # in-flight messages take room too
    await m.ack()
    await q.send(b"4")


@pytest.mark.requires("bounded.in_flight")
async def test_rule8_drop_oldest(broker: fairq.Broker) -> None:
    q = await broker.declare_queue("ring", max_length=3, overflow="drop_oldest")
    await q.send_batch([Outgoing(b"1"), Outgoing(b"2"), Outgoing(b"3")])
    await q.send(b"4")
    await q.send_batch([Outgoing(b"5"), Outgoing(b"6")])
    assert await bodies(await q.receive(max_messages=10)) == [b"4", b"5", b"6"]
    dead = await broker.queue("ring.dlq").receive(max_messages=10)
    assert [m.body for m in dead] == [b"1", b"2", b"3"]
    assert {m.attributes["fairq.reason"] for m in dead} == {"overflow"}
    with pytest.raises(fairq.QueueFull):
        await q.send(b"7")  # all three are in flight: nothing visible to drop


@pytest.mark.requires("bounded.in_flight")
@pytest.mark.parametrize("overflow", ["reject", "drop_oldest"])
async def test_rule8_a_message_past_its_last_attempt_takes_no_room(
    broker: fairq.Broker, clock: fairq.ManualClock, overflow: str
) -> None:
    """Its last lease ran out: it is on its way to the dead-letter queue (rule 6), so a
    full queue has room again, and drop_oldest does not drop it as an overflow."""
    q = await broker.declare_queue(
        "last", max_length=1, max_attempts=1, visibility_timeout=5, overflow=overflow
    )
    await q.send(b"a")
    assert len(await q.receive()) == 1
    clock.advance(6)
    await q.send(b"b")  # the room a's last attempt left
    (dead,) = await broker.queue("last.dlq").receive()
    assert (dead.body, dead.attributes["fairq.reason"]) == (b"a", "max_attempts")
    assert await bodies(await q.receive()) == [b"b"]


@pytest.mark.requires("overflow.block")
async def test_rule8_batch_larger_than_the_queue(broker: fairq.Broker) -> None:
    for overflow in ("reject", "drop_oldest", "block"):
        q = await broker.declare_queue(f"tiny-{overflow}", max_length=2, overflow=overflow)
        with pytest.raises(fairq.QueueFull):
            await q.send_batch([Outgoing(b"x") for _ in range(3)], timeout=0.1)
        assert (await q.stats()).sent == 0


@pytest.mark.requires("overflow.block")
async def test_rule8_block_waits_for_an_ack(live_broker: fairq.Broker) -> None:
    await _blocked_send_wakes(live_broker, "ack")


@pytest.mark.requires("overflow.block")
async def test_rule8_block_waits_for_a_dead_letter(live_broker: fairq.Broker) -> None:
    await _blocked_send_wakes(live_broker, "dead_letter")


async def _blocked_send_wakes(live_broker: fairq.Broker, how: str) -> None:
    """A send blocked by a full queue goes on as soon as ``how`` frees a place."""
    q = await live_broker.declare_queue("blocky", max_length=2, overflow="block")
    await q.send_batch([Outgoing(b"1"), Outgoing(b"2")])
    blocked = asyncio.create_task(q.send(b"3", timeout=10))
    await asyncio.sleep(0.2)
    assert not blocked.done()
    (m,) = await q.receive()
    started = time.monotonic()
    await (m.ack() if how == "ack" else m.dead_letter("cannot parse"))
    acked_at = time.monotonic()
    mid = await asyncio.wait_for(blocked, 5)
    woke_after = time.monotonic() - acked_at
    # woken by the ack, not by a poll (0.5-1 s): measured from the ack's return, and
    # bounded by "before any poll", not by a quiet machine (a loaded one took 0.75 s on
    # PostgreSQL once, the ack included)
    assert woke_after < 0.45, (
        f"a blocked send should wake on the {how}, took {woke_after:.3f} s "
        f"(the {how} itself took {acked_at - started:.3f} s)"
    )
    assert isinstance(mid, str)
    assert (await q.stats()).sent == 3


@pytest.mark.requires("overflow.block")
async def test_rule8_block_times_out(live_broker: fairq.Broker) -> None:
    q = await live_broker.declare_queue("blocky2", max_length=1, overflow="block")
    await q.send(b"1")
    started = time.monotonic()
    with pytest.raises(fairq.QueueFull):
        await q.send(b"2", timeout=0.3)
    assert 0.25 < time.monotonic() - started < 2
    assert (await q.stats()).sent == 1


# -- rule 9: deduplication -----------------------------------------------------------------
async def test_rule9_dedup(broker: fairq.Broker, clock: fairq.ManualClock) -> None:
    q = await broker.declare_queue("dedup", dedup_window=300)
    first = await q.send(b"a", dedup_id="order-1")
    assert await q.send(b"b", dedup_id="order-1") == first
    (m,) = await q.receive()
    await m.ack()
    clock.advance(299)
    assert await q.send(b"c", dedup_id="order-1") == first  # still inside the window
    clock.advance(2)
    again = await q.send(b"d", dedup_id="order-1")
    assert again != first
    assert (await q.stats()).sent == 2


async def test_rule9_dedup_within_a_batch_and_per_queue(broker: fairq.Broker) -> None:
    q = await broker.declare_queue("dedup2")
    # another queue of the same family: on Redis Cluster ids are unique within a family
    other = await broker.declare_queue("dedup2.other")
    ids = await q.send_batch(
        [Outgoing(b"1", dedup_id="k"), Outgoing(b"2", dedup_id="k"), Outgoing(b"3")]
    )
    assert ids[0] == ids[1] != ids[2]
    assert await other.send(b"x", dedup_id="k") not in ids
    assert (await q.stats()).sent == 2


async def test_rule9_duplicates_take_no_room(broker: fairq.Broker) -> None:
    q = await broker.declare_queue("dedup4", max_length=1)
    first = await q.send(b"1", dedup_id="k")
    assert await q.send(b"1", dedup_id="k") == first


# -- rule 10: FIFO groups ------------------------------------------------------------------
@pytest.mark.requires("fifo")
async def test_rule10_fifo_group_one_at_a_time(broker: fairq.Broker) -> None:
    q = await broker.declare_queue("fifo", fifo=True)
    await q.send_batch([Outgoing(f"a{i}", group="a") for i in range(3)])
    await q.send_batch([Outgoing(f"b{i}", group="b") for i in range(2)])
    first = await q.receive(max_messages=10)
    assert sorted(await bodies(first)) == [b"a0", b"b0"]  # one per group, in parallel
    assert await q.receive(max_messages=10) == []
    for m in first:
        await m.ack()
    assert sorted(await bodies(await q.receive(max_messages=10))) == [b"a1", b"b1"]


@pytest.mark.requires("fifo")
async def test_rule10_nacked_message_keeps_its_place(
    broker: fairq.Broker, clock: fairq.ManualClock
) -> None:
    q = await broker.declare_queue("fifo2", fifo=True, visibility_timeout=5)
    await q.send_batch([Outgoing(f"m{i}", group="g") for i in range(3)])
    (m,) = await q.receive(max_messages=10)
    await m.nack(delay=3)
    assert await q.receive(max_messages=10) == []  # the head is delayed: the group waits
    clock.advance(3.5)
    (m,) = await q.receive(max_messages=10)
    assert m.body == b"m0" and m.attempt == 2
    clock.advance(6)  # lease expires: still the head
    (m,) = await q.receive(max_messages=10)
    assert m.body == b"m0" and m.attempt == 3
    await m.ack()
    order = []
    while batch := await q.receive(max_messages=10):
        assert len(batch) == 1
        order.append(batch[0].body)
        await batch[0].ack()
    assert order == [b"m1", b"m2"]


@pytest.mark.requires("fifo")
async def test_rule10_default_group(broker: fairq.Broker) -> None:
    q = await broker.declare_queue("fifo3", fifo=True)
    await q.send_batch([Outgoing(b"1"), Outgoing(b"2")])
    (m,) = await q.receive(max_messages=10)
    assert m.group == "default"


@pytest.mark.requires("fifo")
async def test_rule10_dead_lettered_head_frees_the_group(broker: fairq.Broker) -> None:
    q = await broker.declare_queue("fifo4", fifo=True, max_attempts=1)
    await q.send_batch([Outgoing(b"1", group="g"), Outgoing(b"2", group="g")])
    (m,) = await q.receive(max_messages=10)
    await m.nack()
    (m,) = await q.receive(max_messages=10)
    assert m.body == b"2"


async def test_rule10_fifo_with_priority_conflicts(broker: fairq.Broker) -> None:
    with pytest.raises(fairq.ConfigConflict):
        await broker.declare_queue("fifo5", fifo=True, max_priority=3)
    assert await broker.list_queues() == []


# -- rule 11: long polling -----------------------------------------------------------------
async def test_rule11_long_poll_wakes_on_send(live_broker: fairq.Broker) -> None:
    q = await live_broker.declare_queue("poll")
    waiter = asyncio.create_task(q.receive(wait=10))
    await asyncio.sleep(0.2)
    assert not waiter.done()
    started = time.monotonic()
    await q.send(b"hello")
    sent_at = time.monotonic()
    msgs = await asyncio.wait_for(waiter, 5)
    latency = time.monotonic() - sent_at
    assert [m.body for m in msgs] == [b"hello"]
    # woken by the send, not by a poll (0.5-1 s): measured from the send's return (the
    # send's own commit is the engine's speed, not the wake-up's), and bounded by "before
    # any poll", not by a quiet machine (a loaded one took 0.92 s once on PostgreSQL,
    # send included)
    assert latency < 0.45, (
        f"long poll took {latency:.3f} s to see the send (the send itself took "
        f"{sent_at - started:.3f} s)"
    )


async def test_rule11_long_poll_on_a_dead_letter_queue_wakes_on_a_dead_letter(
    live_broker: fairq.Broker,
) -> None:
    q = await live_broker.declare_queue("src")
    await q.send(b"poison")
    (m,) = await q.receive()
    dlq = live_broker.queue("src.dlq")
    waiter = asyncio.create_task(dlq.receive(wait=10))
    await asyncio.sleep(0.2)
    assert not waiter.done()
    await m.dead_letter("cannot parse")
    done_at = time.monotonic()
    (dead,) = await asyncio.wait_for(waiter, 5)
    assert dead.body == b"poison"
    assert time.monotonic() - done_at < 0.45, "woken by the dead letter, not by a poll"


async def test_rule11_long_poll_times_out_empty(live_broker: fairq.Broker) -> None:
    q = await live_broker.declare_queue("poll2")
    started = time.monotonic()
    assert await q.receive(wait=0.3) == []
    assert 0.28 < time.monotonic() - started < 2


async def test_rule11_long_poll_wakes_when_a_delay_ends(live_broker: fairq.Broker) -> None:
    q = await live_broker.declare_queue("poll3")
    await q.send(b"later", delay=0.3)
    started = time.monotonic()
    msgs = await q.receive(wait=5)
    took = time.monotonic() - started
    assert [m.body for m in msgs] == [b"later"]
    # woken by the delay's end, not by the 5 s wait running out (a loaded machine took
    # 0.83 s on RabbitMQ, whose delays go through a TTL queue)
    assert 0.25 < took < 2.5


async def test_rule11_many_waiters_each_get_one(live_broker: fairq.Broker) -> None:
    q = await live_broker.declare_queue("poll4")
    waiters = [asyncio.create_task(q.receive(wait=5)) for _ in range(5)]
    await asyncio.sleep(0.1)
    await q.send_batch([Outgoing(str(i)) for i in range(5)])
    got = await asyncio.wait_for(asyncio.gather(*waiters), 5)
    assert sorted(m.body for batch in got for m in batch) == [str(i).encode() for i in range(5)]


# -- rule 12: atomic batches ---------------------------------------------------------------
async def test_rule12_batch_all_or_nothing(broker: fairq.Broker) -> None:
    q = await broker.declare_queue("atomic", max_priority=1, max_length=10)
    with pytest.raises(fairq.FairqError):
        await q.send_batch([Outgoing(b"ok") for _ in range(5)] + [Outgoing(b"x", priority=5)])
    with pytest.raises(fairq.QueueFull):
        await q.send_batch([Outgoing(b"ok") for _ in range(11)])
    assert (await q.stats()).sent == 0
    ids = await q.send_batch([Outgoing(b"ok") for _ in range(10)])
    assert len(ids) == 10
    assert await q.send_batch([]) == []


# -- rule 13: stats ------------------------------------------------------------------------
@pytest.mark.requires("clock.delays", "stats.delayed")
async def test_rule13_stats(broker: fairq.Broker, clock: fairq.ManualClock) -> None:
    q = await broker.declare_queue("stats", visibility_timeout=10, max_attempts=2)
    empty = await q.stats()
    assert empty == fairq.QueueStats()
    await q.send_batch([Outgoing(str(i)) for i in range(6)])
    await q.send(b"later", delay=100)
    clock.advance(4)
    a, b, _c = await q.receive(max_messages=3)
    await a.ack()
    await b.nack()
    s = await q.stats()
    assert (s.visible, s.delayed, s.in_flight) == (4, 1, 1)
    assert (s.sent, s.acked, s.nacked, s.redelivered) == (7, 1, 1, 0)
    assert s.oldest_age == pytest.approx(4, abs=0.01)
    assert s.depth == 6
    (b2,) = [m for m in await q.receive(max_messages=10) if m.id == b.id]
    assert b2.attempt == 2
    await b2.nack()  # second and last attempt
    clock.advance(11)  # c's lease ends: it becomes visible again
    s = await q.stats()
    assert (s.redelivered, s.dead_lettered, s.nacked) == (1, 1, 2)
    assert s.expired == s.discarded == 0
    await q.purge()
    s = await q.stats()
    assert (s.visible, s.delayed, s.in_flight, s.oldest_age) == (0, 0, 0, 0.0)
    assert s.sent == 7  # counters are totals since the queue was declared


# -- rule 14: durability (restart; kill -9 lives in tests/reliability) ---------------------
@pytest.mark.requires("leases.process", "persistence")
async def test_rule14_reopen_keeps_everything(url: str, clock: fairq.ManualClock) -> None:
    async with await fairq.connect(url, clock=clock) as b:
        q = await b.declare_queue("durable", visibility_timeout=30)
        ids = await q.send_batch([Outgoing(str(i)) for i in range(10)])
        (m,) = await q.receive()
        await m.ack()
        (leased,) = await q.receive()
    async with await fairq.connect(url, clock=clock) as b:
        q = b.queue("durable")
        s = await q.stats()
        assert (s.visible, s.in_flight, s.acked) == (8, 1, 1)
        clock.advance(31)
        got = await q.receive(max_messages=20)
        # the expired lease ended after the others were sent: it comes last
        assert [m.id for m in got] == [*ids[2:], leased.id]
        assert len(got) == 9


# -- rule 15: freshness --------------------------------------------------------------------
@pytest.mark.requires("stats.process")
async def test_rule15_freshness_slo(broker: fairq.Broker, clock: fairq.ManualClock) -> None:
    q = await broker.declare_queue("fresh", freshness_slo=60)
    await q.send(b"x")
    clock.advance(59)
    s = await q.stats()
    assert s.freshness_slo == 60 and not s.breaching
    clock.advance(2)
    assert (await q.stats()).breaching
    (m,) = await q.receive()
    await m.ack()
    assert not (await q.stats()).breaching
    plain = await broker.declare_queue("plain")
    assert (await plain.stats()).freshness_slo is None


# -- rule 16: declare ----------------------------------------------------------------------
async def test_rule16_declare_is_idempotent_and_updates(
    broker: fairq.Broker, clock: fairq.ManualClock
) -> None:
    q = await broker.declare_queue("decl", visibility_timeout=5)
    await q.send(b"x")
    await broker.declare_queue("decl", visibility_timeout=5)
    assert (await q.stats()).visible == 1  # re-declaring keeps the messages
    await broker.declare_queue("decl", visibility_timeout=50, max_attempts=9)
    config = await q.config()
    assert (config.visibility_timeout, config.max_attempts) == (50, 9)
    await q.receive()
    clock.advance(10)
    assert await q.receive() == []  # the new lease length applies


@pytest.mark.requires("fifo")
async def test_rule16_fifo_and_priority_cannot_change(broker: fairq.Broker) -> None:
    await broker.declare_queue("fixed", max_priority=3)
    with pytest.raises(fairq.ConfigConflict):
        await broker.declare_queue("fixed", max_priority=4)
    with pytest.raises(fairq.ConfigConflict):
        await broker.declare_queue("fixed", fifo=True, max_priority=3)
    await broker.declare_queue("ff", fifo=True)
    with pytest.raises(fairq.ConfigConflict):
        await broker.declare_queue("ff")
    assert (await broker.queue("fixed").config()).max_priority == 3


async def test_rule16_dead_letter_queue_is_declared(broker: fairq.Broker) -> None:
    await broker.declare_queue("withdlq")
    assert await broker.list_queues() == ["withdlq", "withdlq.dlq"]
    config = await broker.queue("withdlq.dlq").config()
    assert (config.dead_letter, config.max_attempts) == (None, None)
    assert (await broker.queue("withdlq").config()).dead_letter == "withdlq.dlq"


async def test_rule16_existing_dead_letter_queue_keeps_its_options(broker: fairq.Broker) -> None:
    await broker.declare_queue("mine.dlq", dead_letter=None, retention=99)
    await broker.declare_queue("mine")
    assert (await broker.queue("mine.dlq").config()).retention == 99


async def test_queue_cannot_be_its_own_dead_letter_queue(broker: fairq.Broker) -> None:
    with pytest.raises(fairq.ConfigConflict):
        await broker.declare_queue("self", dead_letter="self")


# -- handles, listing, purge, delete, redrive, peek ----------------------------------------
async def test_handle_of_undeclared_queue(broker: fairq.Broker) -> None:
    q = broker.queue("never")
    assert q.name == "never"
    for call in (q.send(b"x"), q.receive(), q.stats(), q.purge(), q.ack_batch(["01.1"])):
        with pytest.raises(fairq.QueueNotFound):
            await call


async def test_list_and_delete(broker: fairq.Broker) -> None:
    for name in ("b.x", "a.x", "a_y", "ab"):
        await broker.declare_queue(name, dead_letter=None)
    assert await broker.list_queues() == ["a.x", "a_y", "ab", "b.x"]
    assert await broker.list_queues(prefix="a_") == ["a_y"]  # "_" is not a wildcard
    assert await broker.list_queues(prefix="a") == ["a.x", "a_y", "ab"]
    q = broker.queue("a.x")
    await q.send(b"x")
    assert await broker.delete_queue("a.x") is True
    assert await broker.delete_queue("a.x") is False
    with pytest.raises(fairq.QueueNotFound):
        await q.receive()
    q2 = await broker.declare_queue("a.x", dead_letter=None)
    assert (await q2.stats()).sent == 0


@pytest.mark.requires("fifo")
async def test_purge(broker: fairq.Broker) -> None:
    q = await broker.declare_queue("purge", fifo=True)
    await q.send_batch([Outgoing(b"x", group="g") for _ in range(5)])
    await q.send(b"later", delay=50)
    await q.receive()
    assert await q.purge() == 6
    assert await q.receive() == []
    await q.send(b"again", group="g")  # the FIFO group starts fresh
    assert len(await q.receive()) == 1


async def test_redrive_back_to_source(broker: fairq.Broker) -> None:
    q = await broker.declare_queue("work", max_attempts=1)
    other = await broker.declare_queue("other", dead_letter="work.dlq", max_attempts=1)
    await q.send(b"w1", attributes={"k": "v"})
    await other.send(b"o1")
    for queue in (q, other):
        (m,) = await queue.receive()
        await m.nack()
    assert (await broker.queue("work.dlq").stats()).visible == 2
    assert await broker.redrive("work.dlq") == 2
    (w,) = await q.receive()
    (o,) = await other.receive()
    assert (w.body, o.body) == (b"w1", b"o1")
    assert w.attempt == 1
    assert w.attributes == {"k": "v", "fairq.original_id": w.attributes["fairq.original_id"]}
    assert (await broker.queue("work.dlq").stats()).visible == 0


async def test_redrive_to_target_with_limit(broker: fairq.Broker) -> None:
    q = await broker.declare_queue("src2", max_attempts=1)
    target = await broker.declare_queue("retry-lane")
    await q.send_batch([Outgoing(str(i)) for i in range(5)])
    for m in await q.receive(max_messages=5):
        await m.nack()
    assert await broker.redrive("src2.dlq", to="retry-lane", limit=3) == 3
    assert await bodies(await target.receive(max_messages=10)) == [b"0", b"1", b"2"]
    assert (await broker.queue("src2.dlq").stats()).visible == 2
    with pytest.raises(fairq.QueueNotFound):
        await broker.redrive("src2.dlq", to="nowhere")


async def test_redrive_moves_dead_letters_this_process_looked_at(broker: fairq.Broker) -> None:
    """An operator receives a dead letter to read it, nacks it back, then redrives: it
    moves (on RabbitMQ the nacked delivery waits in this process's consumer, where no other
    channel's basic.get finds it)."""
    q = await broker.declare_queue("looked", max_attempts=1)
    await q.send_batch([Outgoing(b"a"), Outgoing(b"b"), Outgoing(b"c")])
    for m in await q.receive(max_messages=3):
        await m.nack()
    dlq = broker.queue("looked.dlq")
    for m in await dlq.receive(max_messages=3, wait=2):
        await m.nack()
    assert await broker.redrive("looked.dlq", limit=2) == 2
    assert await broker.redrive("looked.dlq") == 1
    assert (await dlq.stats()).visible == 0
    assert sorted(await bodies(await receive_n(q, 3))) == [b"a", b"b", b"c"]


async def test_redrive_keeps_looked_at_dead_letters_whose_source_is_gone(
    broker: fairq.Broker,
) -> None:
    """They stay, once each (on RabbitMQ a copy put back at the tail came straight back to
    this process's consumer, and the redrive copied it again, for ever)."""
    q = await broker.declare_queue("gone2", dead_letter="keep2.dlq", max_attempts=1)
    await q.send_batch([Outgoing(str(i)) for i in range(3)])
    for m in await q.receive(max_messages=3):
        await m.nack()
    await broker.delete_queue("gone2")
    dlq = broker.queue("keep2.dlq")
    for m in await dlq.receive(max_messages=3, wait=2):
        await m.nack()
    assert (await dlq.stats()).visible == 3  # (on RabbitMQ: back in this process's buffer)
    assert await asyncio.wait_for(broker.redrive("keep2.dlq"), 10) == 0
    assert sorted(await bodies(await receive_n(dlq, 3))) == [b"0", b"1", b"2"]
    assert await dlq.receive(wait=0.2) == [], "each stayed once"


async def test_redrive_keeps_messages_whose_source_is_gone(broker: fairq.Broker) -> None:
    q = await broker.declare_queue("gone", dead_letter="keep.dlq", max_attempts=1)
    await q.send(b"x")
    (m,) = await q.receive()
    await m.nack()
    await broker.delete_queue("gone")
    assert await broker.redrive("keep.dlq") == 0
    assert (await broker.queue("keep.dlq").stats()).visible == 1


@pytest.mark.requires("peek")
async def test_peek_does_not_lease(broker: fairq.Broker) -> None:
    q = await broker.declare_queue("peek")
    await q.send_batch([Outgoing(str(i)) for i in range(3)])
    seen = await q.peek(limit=2)
    assert [m.body for m in seen] == [b"0", b"1"]
    assert all(m.receipt == "" for m in seen)
    assert len(await q.receive(max_messages=5)) == 3


async def test_async_context_manager(url: str) -> None:
    async with await fairq.connect(url) as b:
        q = await b.declare_queue("ctx")
        await q.send(b"x")
    with pytest.raises(fairq.FairqError):
        await q.send(b"y")


# -- the same rules on the real clock (engines whose own clock ends delays and retention) ----
async def test_delays_end_in_order_on_the_real_clock(live_broker: fairq.Broker) -> None:
    q = await live_broker.declare_queue("real-delays")
    sent = time.monotonic()
    await q.send(b"late", delay=0.6)
    await q.send(b"early", delay=0.3)
    await q.send(b"now")
    # when each body was first seen, in seconds since just before the sends: a loaded
    # machine may see two in one receive, but in their order and none before its delay
    seen: dict[bytes, float] = {}
    deadline = time.monotonic() + 5
    while len(seen) < 3 and time.monotonic() < deadline:
        for body in await bodies(await q.receive(max_messages=10, wait=1)):
            seen.setdefault(body, time.monotonic() - sent)
    assert list(seen) == [b"now", b"early", b"late"]
    assert seen[b"early"] >= 0.3 and seen[b"late"] >= 0.6, seen


async def test_nack_delay_on_the_real_clock(live_broker: fairq.Broker) -> None:
    q = await live_broker.declare_queue("real-nack")
    await q.send(b"x")
    (m,) = await q.receive()
    started = time.monotonic()
    await m.nack(delay=0.4)
    (again,) = await q.receive(wait=5)  # not before its delay (a fixed 0.2 s look would
    # race a loaded machine's slow nack call)
    assert time.monotonic() - started >= 0.35, "the message came back before its delay"
    assert (again.id, again.attempt) == (m.id, 2)


async def test_retention_on_the_real_clock(live_broker: fairq.Broker) -> None:
    # a retention long enough that the fresh message cannot age past it between its send
    # and the receive on a loaded machine (0.3 s did once, on PostgreSQL)
    q = await live_broker.declare_queue("real-retention", retention=1.0)
    await q.send(b"old", attributes={"k": "v"})
    await asyncio.sleep(1.3)
    await q.send(b"fresh")
    assert await bodies(await q.receive(max_messages=10)) == [b"fresh"]
    (dead,) = await live_broker.queue("real-retention.dlq").receive(wait=2)
    assert dead.body == b"old"
    assert dead.attributes["k"] == "v"
    assert dead.attributes["fairq.reason"] == "expired"
    assert dead.attributes["fairq.source"] == "real-retention"


async def test_rule8_reject_counts_visible_messages(broker: fairq.Broker) -> None:
    """What every engine agrees on: a full bounded queue of visible messages refuses."""
    q = await broker.declare_queue("bounded-v", max_length=2)
    await q.send_batch([Outgoing(b"1"), Outgoing(b"2")])
    with pytest.raises(fairq.QueueFull):
        await q.send(b"3")
    assert await bodies(await q.receive(max_messages=10)) == [b"1", b"2"]


async def test_rule8_drop_oldest_of_visible_messages(live_broker: fairq.Broker) -> None:
    q = await live_broker.declare_queue("ring-v", max_length=2, overflow="drop_oldest")
    await q.send_batch([Outgoing(b"1"), Outgoing(b"2")])
    await q.send(b"3")
    assert await bodies(await q.receive(max_messages=10)) == [b"2", b"3"]
    (dead,) = await live_broker.queue("ring-v.dlq").receive(wait=2)
    assert (dead.body, dead.attributes["fairq.reason"]) == (b"1", "overflow")
    assert dead.attributes["fairq.source"] == "ring-v"


@pytest.mark.requires("overflow.drop_oldest.priority")
async def test_rule8_drop_oldest_drops_the_oldest_not_the_first_in_line(
    live_broker: fairq.Broker,
) -> None:
    """With priorities the first in line is the highest priority: the oldest visible
    message is dropped all the same."""
    q = await live_broker.declare_queue(
        "ring-p", max_length=2, overflow="drop_oldest", max_priority=5
    )
    await q.send(b"old-low", priority=0)
    await q.send(b"young-high", priority=5)
    await q.send(b"new", priority=0)
    (dead,) = await live_broker.queue("ring-p.dlq").receive(wait=2)
    assert (dead.body, dead.attributes["fairq.reason"]) == (b"old-low", "overflow")
    assert await bodies(await q.receive(max_messages=10)) == [b"young-high", b"new"]


async def test_purge_removes_visible_and_leased(broker: fairq.Broker) -> None:
    q = await broker.declare_queue("purge2")
    await q.send_batch([Outgoing(str(i)) for i in range(3)])
    (m,) = await q.receive()
    assert await q.purge() == 3
    assert await q.receive(max_messages=10) == []
    s = await q.stats()
    assert (s.visible, s.in_flight) == (0, 0)
    with pytest.raises(fairq.LeaseLost):
        await m.ack()


async def test_nul_characters_are_refused_alike_on_every_engine(broker: fairq.Broker) -> None:
    """No engine's text holds NUL alike (PostgreSQL refuses it): every text fairq stores
    refuses it before any engine sees it, and a listing prefix holding it lists nothing."""
    q = await broker.declare_queue("nul")
    assert await broker.list_queues("n\x00") == []
    assert await broker.list_topics("\x00") == []
    assert await broker.list_rooms("\x00") == []
    assert await broker.list_attention("\x00") == []
    t = await broker.declare_topic("nul-topic")
    with pytest.raises(fairq.InvalidFilter, match="NUL"):
        await t.subscribe("a", routing="order.\x00")
    with pytest.raises(fairq.InvalidFilter, match="NUL"):
        await t.subscribe("b", filter={"kind": ["x\x00"]})
    with pytest.raises(fairq.InvalidFilter, match="NUL"):
        await t.subscribe("c", filter={"ki\x00nd": "x"})
    await q.send_batch([fairq.Outgoing(b"1"), fairq.Outgoing(b"2")])
    first, second = await q.receive(max_messages=2)
    with pytest.raises(fairq.InvalidOption, match="NUL"):
        await first.dead_letter("bad\x00")
    with pytest.raises(fairq.InvalidOption, match="NUL"):
        await second.nack(error="Error\x00")
    with pytest.raises(fairq.InvalidOption, match="UTF-8"):
        await second.nack(error="Error \udcff")
    with pytest.raises(fairq.InvalidOption, match="NUL"):
        await broker.idempotency("nul").claim("k", holder="jobs:\x00")
    await first.ack()  # nothing was changed by the refused calls
    await second.ack()
    assert (await q.stats()).acked == 2


async def test_attributes_take_at_most_64_kib_on_every_engine(broker: fairq.Broker) -> None:
    q = await broker.declare_queue("attrs")
    most = {f"k{i:02d}": "v" * (2048 - 3) for i in range(32)}  # 32 x 2048 = 65,536 bytes
    await q.send(b"x", attributes=most)
    (m,) = await q.receive()
    assert m.attributes == most
    with pytest.raises(fairq.InvalidMessage, match="at most 65536 bytes"):
        await q.send(b"x", attributes={**most, "k00": "v" * 2046})
    with pytest.raises(fairq.InvalidMessage, match="at most 65536 bytes"):
        await q.send_batch([fairq.Outgoing(b"ok"), fairq.Outgoing(b"x", {"a": "é" * 40_000})])
    assert (await q.stats()).sent == 1


@pytest.mark.parametrize("overflow", ["reject", "block", "drop_oldest"])
async def test_a_batch_larger_than_max_length_never_fits(
    broker: fairq.Broker, backend_name: str, overflow: str
) -> None:
    """Whatever the overflow, a batch larger than ``max_length`` is refused whole at once
    and says it can never fit (over HTTP: 422, not 429 "retry later")."""
    if overflow == "block" and backend_name == "amqp":
        pytest.skip("overflow='block' is Unsupported on RabbitMQ")
    q = await broker.declare_queue(f"tight-{overflow}", max_length=2, overflow=overflow)
    with pytest.raises(fairq.QueueFull) as caught:
        await q.send_batch([fairq.Outgoing(f"{i}") for i in range(3)], timeout=0.1)
    assert caught.value.never_fits and caught.value.max_length == 2
    assert (await q.stats()).sent == 0
    await q.send_batch([fairq.Outgoing(b"a"), fairq.Outgoing(b"b")])
    if overflow == "reject":
        with pytest.raises(fairq.QueueFull) as full:
            await q.send(b"c")
        assert not full.value.never_fits  # a full queue: later, it may fit
