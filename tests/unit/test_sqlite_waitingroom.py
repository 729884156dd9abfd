"""SQLite waiting rooms: a status call does no per-fan work (SPEC §8 rule 8), checked on the
statements SQLite runs (set_trace_callback). Other engines' status costs are measured by
``bench.waitingroom``; this check is SQLite's own, so it lives here and not in the
conformance suite, whose only skips come from the backends' capability tables."""

from __future__ import annotations

from pathlib import Path

import fairq


async def test_status_reads_no_fan_rows(tmp_path: Path) -> None:
    """The statements of a status call never touch the fans (they are not counted, nor even
    looked up: the ticket carries the arrival number); a sold-out room answers from its row
    alone."""
    async with await fairq.connect(f"sqlite:///{tmp_path / 'room.db'}") as broker:
        room = await broker.waiting_room("ev-88")
        tickets = await room.join_many([f"fan-{i}" for i in range(5000)])
        await room.admit(100)
        conn = broker.backend._writer.conn  # type: ignore[attr-defined]
        seen: list[str] = []
        conn.set_trace_callback(seen.append)
        try:
            await room.status(tickets[4999].ticket)  # type: ignore[arg-type]
            waiting = [s for s in seen if "fairq_room" in s]
            seen.clear()
            await room.status(tickets[5].ticket)  # type: ignore[arg-type]
            admitted = [s for s in seen if "fairq_room" in s]
            await room.sold_out()
            seen.clear()
            await room.status(tickets[5].ticket)  # type: ignore[arg-type]
            sold = [s for s in seen if "fairq_room" in s]
        finally:
            conn.set_trace_callback(None)
    assert len(waiting) == 1 and "fairq_room_fans" not in waiting[0]
    assert not any("fairq_room_fans" in s or "count(" in s.lower() for s in admitted)
    assert len(admitted) <= 3
    assert len(sold) == 1 and "fairq_rooms" in sold[0]
