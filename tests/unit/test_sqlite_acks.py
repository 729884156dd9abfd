"""SQLite sends and acks in batches: a plain batch keeps order, attributes and counts; one
``ack_batch`` of receipts from several receives (several lease tokens), with a receipt
repeated and one whose lease is gone, deletes each leased message once, counts it once,
and reports only the stale receipt as lost."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import fairq
from fairq.backends.sqlite.messages import _ids_of


async def test_ack_batch_across_leases_with_a_repeat_and_a_stale_receipt(tmp_path: Path) -> None:
    async with await fairq.connect(f"sqlite:///{tmp_path / 'acks.db'}") as broker:
        q = await broker.declare_queue("work")
        await q.send_batch([fairq.Outgoing(f"m{i}") for i in range(5)])
        first = await q.receive(max_messages=2, visibility_timeout=0.05)
        second = await q.receive(max_messages=3)
        stale = first[0]
        assert len(second) == 3
        redelivered = None
        while redelivered is None:  # first's leases run out; one comes back under a new lease
            for m in await q.receive(max_messages=1, wait=1):
                redelivered = m
        receipts = [m.receipt for m in second] + [second[0].receipt, redelivered.receipt]
        receipts.append(stale.receipt if redelivered.id == stale.id else first[1].receipt)
        with pytest.raises(fairq.LeaseLost) as lost:
            await q.ack_batch(receipts)
        assert lost.value.lost == [receipts[-1]]
        stats = await q.stats()
        assert stats.acked == 4
        assert stats.in_flight == 0
        assert stats.visible + stats.in_flight + stats.delayed == 1
        assert stats.sent == 5


async def test_a_plain_batch_keeps_order_attributes_and_counts(tmp_path: Path) -> None:
    # a batch visible now without priority, group or dedup id takes the one-executemany path
    async with await fairq.connect(f"sqlite:///{tmp_path / 'batch.db'}") as broker:
        q = await broker.declare_queue("work")
        ids = await q.send_batch(
            [fairq.Outgoing(b"a"), fairq.Outgoing({"n": 1}, attributes={"k": "v"})]
        )
        assert len(ids) == 2 and ids == sorted(ids) and len(set(ids)) == 2
        a, b = await q.receive(max_messages=2)
        assert (a.id, a.body, a.attributes) == (ids[0], b"a", {})
        assert (b.id, b.body, b.attributes["k"]) == (ids[1], b'{"n":1}', "v")
        stats = await q.stats()
        assert (stats.sent, stats.in_flight, stats.visible) == (2, 2, 0)


async def test_receipts_of_one_receive_are_read_as_one_lease_and_still_checked(
    tmp_path: Path,
) -> None:
    # the receipts of one receive share their ".<lease>" tail: read at once, each id still
    # parsed and checked (one malformed or out-of-range id is refused, nothing is acked)
    async with await fairq.connect(f"sqlite:///{tmp_path / 'acks.db'}") as broker:
        q = await broker.declare_queue("work")
        await q.send_batch([fairq.Outgoing(f"m{i}") for i in range(40)])
        got = await q.receive(max_messages=40)
        receipts = [m.receipt for m in got]
        tail = receipts[0][16:]
        for bad in ("zzzzzzzzzzzzzzzz", "000.000000000001", "ffffffffffffffff", "-000000000000001"):
            with pytest.raises(fairq.InvalidMessage):
                await q.ack_batch([*receipts[:20], bad + tail, *receipts[20:]])
            assert (await q.stats()).acked == 0
        await q.ack_batch(receipts)
        stats = await q.stats()
        assert (stats.acked, stats.in_flight) == (40, 0)


async def test_ack_receive_is_one_transaction_and_reports_lost_receipts(tmp_path: Path) -> None:
    async with await fairq.connect(f"sqlite:///{tmp_path / 'acks.db'}") as broker:
        q = await broker.declare_queue("work")
        await q.send_batch([fairq.Outgoing(f"m{i}") for i in range(30)])
        backend = broker.backend
        got = await q.receive(max_messages=10)
        stale = got[0].receipt
        await got[0].nack()  # its lease ends: its receipt is no longer current
        writer = backend._writer  # type: ignore[attr-defined]
        before = writer.commits
        lost, more = await backend.ack_receive("work", [m.receipt for m in got], 20, None)
        assert writer.commits - before == 1
        assert lost == [stale]
        assert len(more) == 20  # (the nacked one is now behind the others: visible)
        stats = await q.stats()
        assert (stats.acked, stats.in_flight, stats.visible) == (9, 20, 1)


async def test_a_given_up_ack_receive_keeps_its_acks_and_hands_back_its_leases(
    tmp_path: Path,
) -> None:
    async with await fairq.connect(f"sqlite:///{tmp_path / 'acks.db'}") as broker:
        q = await broker.declare_queue("work")
        await q.send_batch([fairq.Outgoing(f"m{i}") for i in range(30)])
        backend = broker.backend
        got = await q.receive(max_messages=10)
        loop = asyncio.get_running_loop()
        loop.call_soon(lambda: None)  # something else ready: the call waits for the writer
        fut = backend.ack_receive("work", [m.receipt for m in got], 10, None)
        fut.cancel()  # the consumer gave up (a worker stopping) before it ran
        for _ in range(100):
            stats = await q.stats()
            if stats.acked == 10 and stats.in_flight == 0:
                break
            await asyncio.sleep(0.01)
        assert (stats.acked, stats.in_flight, stats.visible) == (10, 0, 20)


def test_the_ids_of_one_lease_are_decoded_together_as_int_would() -> None:
    # all the digits at once (bytes.fromhex, struct); what only int() reads goes to int()
    tail = ".1f2e3d"
    ids = [0, 1, 0x0123456789ABCDEF, (1 << 63) - 1, 1 << 63, (1 << 64) - 1]
    receipts = [f"{i:016x}{tail}" for i in ids]
    assert list(_ids_of(receipts, tail)) == ids
    upper = [r[:16].upper() + tail for r in receipts]
    assert list(_ids_of(upper, tail)) == ids
    for odd in ("+00000000000000f", "0000_00000000001", " 00000000000001f"):
        assert list(_ids_of([receipts[0], odd + tail], tail)) == [0, int(odd, 16)]
