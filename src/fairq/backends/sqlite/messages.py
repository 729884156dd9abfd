"""The SQLite backend's message rows: inserting, moving, deleting and sweeping them —
the steps the operations of every capability are built from (queues.py, topics.py,
attention.py). Everything runs inside one :class:`~fairq.backends.sqlite.txn.Txn`; the
schema, and what the message states mean, are in ``schema.sql``.
"""

from __future__ import annotations

import math
import sqlite3
import struct
from collections import Counter
from collections.abc import Sequence
from typing import Any

import orjson

from ...errors import BATCH_LARGER, QueueFull
from ...message import (
    INT64_END,
    Received,
    format_id,
    id_time,
    parse_receipt,
    storable_lease,
)
from ...model.queues import Envelope, QueueConfig
from ..rules import (
    CopyPlan,
    dead_letter_attributes,
)
from .txn import INSERT_VISIBLE, QueueRow, Row, Txn, chunks, ids_in, in_list, insert_rows, marks

READY, WAITING, BLOCKED = 0, 1, 2
# a published copy keeps its body in fairq_bodies (shared by its topic's copies): body_ref
COLS = (
    "id, queue_id, state, priority, avail_at, attempt, lease, grp, body_ref, "
    "coalesce(body, (SELECT body FROM fairq_bodies WHERE id = body_ref)), attrs"
)
ID, QID, STATE, PRIO, AVAIL, ATTEMPT, LEASE, GRP, BODY_REF, BODY, ATTRS = range(11)

_INSERT = (
    "INSERT INTO fairq_messages (id, queue_id, state, priority, avail_at, attempt, lease, grp, "
    "body_ref, body, attrs) VALUES (?,?,?,?,?,?,?,?,?,?,?)"
)
# the next ready messages of a queue (id, priority, attempt, grp, body, attrs): state 0 less
# the rows leased in place (avail_at < -1: schema.sql) ...
SELECT_READY = (
    "SELECT id, priority, attempt, grp, "
    "coalesce(body, (SELECT body FROM fairq_bodies WHERE id = body_ref)), attrs "
    "FROM fairq_messages WHERE queue_id = ? AND state = 0 AND avail_at >= 0 "
    "ORDER BY priority DESC, avail_at, id LIMIT ?"
)
# ... and of a queue without priorities, one seek past them in ix_ready (its priority is
# the constant: SQLite then reads one column fewer of each row)
SELECT_READY_FLAT = (
    "SELECT id, 0, attempt, grp, "
    "coalesce(body, (SELECT body FROM fairq_bodies WHERE id = body_ref)), attrs "
    "FROM fairq_messages WHERE queue_id = ? AND state = 0 AND priority = 0 AND avail_at >= 0 "
    "ORDER BY avail_at, id LIMIT ?"
)
_SWEEP_BATCH = 1000
# a receive or an ack of fewer messages than this (of a non-FIFO queue) leaves its counters
# to settle(): an ack marks its rows acked, a receive keeps its lease's end negated. Bigger
# ones count (and delete) at once: their pages are shared by enough rows that writing
# each row twice costs more than the counters and the per-queue index
# (bench.sqlite_hotpath floor, acks: 60 vs 73 µs for one, 9 vs 9 for 16, 7-10 vs 4.6 for 100)
LAZY_BELOW = 16
# the due time of a leased row is when its lease ends; while the receive that leased it is
# not counted yet (a receive of fewer than LAZY_BELOW messages of a non-FIFO queue) it is
# kept negated, below -1, and an acked row sits at ACKED, or ACKED_UNCOUNTED when its
# receive was not counted either: settle() counts all of them (schema.sql)
ACKED, ACKED_UNCOUNTED = -1.0, -0.5
# ... except that a row acked while its receive is not counted yet keeps its negated due time
# and only takes this lease (which no receipt names: tokens are positive, and a receipt's
# out-of-range lease is stored as 0): the ack then writes the row's page and no index page,
# and settle() finds the row among the receives it counts anyway (schema 12)
ACKED_LEASE = -1
# a small receive of a queue without priorities leases its rows in place (schema 13): state
# 0, avail_at = the lease's end - LEASED_OFFSET, below -1 and below every ready row (leases
# that end before the year 2286; a later one is leased the other way)
LEASED_OFFSET = 1e10
# the rows of one queue leased in place, in ix_ready (the queue's id is the parameter)
IN_PLACE = "queue_id = ? AND state = 0 AND priority = 0 AND avail_at < -1"
# a queue's visible messages as SQL, for reads over many queues (``q`` is its fairq_queues
# row): the stored count plus the messages stored since it was last folded (Txn.fold)
VISIBLE = (
    "(q.visible + (SELECT count(*) FROM fairq_messages m "
    "WHERE m.queue_id = q.id AND m.id > q.sent_upto))"
)


def rows_by_id(t: Txn, ids: Sequence[int]) -> list[Row]:
    """The whole rows (``COLS``) of these messages."""
    rows: list[Row] = []
    for chunk in chunks(ids):
        rows += t.conn.execute(
            f"SELECT {COLS} FROM fairq_messages WHERE id IN ({marks(len(chunk))})", chunk
        )
    return rows


def attrs_of(blob: bytes | None) -> dict[str, str]:
    return orjson.loads(blob) if blob else {}


def blob_of(attrs: dict[str, str]) -> bytes | None:
    return orjson.dumps(attrs) if attrs else None


# -- message moves -------------------------------------------------------------------------
Item = tuple[bytes, bytes | None, float, int, str | None]  # body, attrs blob, delay, prio, group


def insert(t: Txn, q: QueueRow, items: Sequence[Item]) -> list[int]:
    """Store new messages in ``q``; return their ids."""
    if not q.config.fifo and all(not it[2] and it[4] is None for it in items):
        return insert_plain(t, q, items)
    ids, rows = rows_for(t, q, items)
    insert_rows(t.conn, _INSERT, rows)
    return ids


# the common send goes to the inbox (schema.sql, version 12): one B-tree page, not three
_INSERT_ONE = "INSERT INTO fairq_inbox (id, queue_id, avail_at, body, attrs) VALUES (?, ?, ?, ?, ?)"
# ... of a message without attributes: Python's sqlite3 passes every parameter that is not
# an int, float, str or bytearray through its adapter lookup (two failed attribute lookups,
# about 0.2 µs each), None and bytes included: the attributes' NULL is left to the column's
# default, and the body is bound as a bytearray (tests/unit/test_sqlite_binding.py)
_INSERT_ONE_BARE = "INSERT INTO fairq_inbox (id, queue_id, avail_at, body) VALUES (?, ?, ?, ?)"
_INSERT_VISIBLE_BARE = (
    "INSERT INTO fairq_messages (id, queue_id, state, priority, avail_at, attempt, body) "
    "VALUES (?, ?, 0, 0, ?, 0, ?)"
)
# (a batch of such messages goes straight to fairq_messages, txn.INSERT_VISIBLE: its pages
# are shared by its rows)
# the columns a visible message without a group sets (fewer parameters to bind per row)
_INSERT_PLAIN = (
    "INSERT INTO fairq_messages (id, queue_id, state, priority, avail_at, attempt, body, attrs) "
    "VALUES (?, ?, 0, ?, ?, 0, ?, ?)"
)


def insert_plain(t: Txn, q: QueueRow, items: Sequence[Item]) -> list[int]:
    """Store visible messages without a group (no delay) in ``q`` (not FIFO)."""
    ids = t.allocate(len(items), stored=True)
    now = t.now
    qid = q.id
    rows = [
        (mid, qid, prio, now, body, attrs)
        for mid, (body, attrs, _, prio, _) in zip(ids, items, strict=True)
    ]
    insert_rows(t.conn, _INSERT_PLAIN, rows)
    if rows:
        t.stored(qid, len(rows), ids[-1])
    t.op_notify.add(q.name)
    return list(ids)


def insert_one(t: Txn, q: QueueRow, body: bytes, attrs: bytes | None) -> int:
    """Store one visible message of priority 0 in ``q`` (neither FIFO nor bounded): the
    common send, with nothing to decide, appended to the inbox (the next transaction that
    does anything else moves it into ``fairq_messages``: Txn.drain); return its id."""
    (mid,) = t.allocate(1, stored=True)
    if t.store.new_formats or t.new_formats():
        if attrs is None:
            t.cur.execute(_INSERT_ONE_BARE, (mid, q.id, t.now, bytearray(body)))
        else:
            t.cur.execute(_INSERT_ONE, (mid, q.id, t.now, bytearray(body), attrs))
        t.store.inbox += 1
    else:  # just after an upgrade (Txn.new_formats): as a fairq before schema 12 did
        t.conn.execute(INSERT_VISIBLE, (mid, q.id, t.now, body, attrs))
    t.stored(q.id, 1, mid)
    t.op_notify.add(q.name)
    return mid


def insert_visible(t: Txn, q: QueueRow, envs: Sequence[Envelope]) -> range:
    """Store messages that are visible now, of priority 0 and without a group, in ``q``
    (not FIFO): a plain batch, binding the five columns each sets; return their ids."""
    ids = t.allocate(len(envs), stored=True)
    now = t.now
    qid = q.id
    if any(e.attributes for e in envs):
        dumps = orjson.dumps
        rows: list[tuple[Any, ...]] = [
            (mid, qid, now, bytearray(e.body), dumps(e.attributes) if e.attributes else None)
            for mid, e in zip(ids, envs, strict=True)
        ]
        insert_rows(t.conn, INSERT_VISIBLE, rows)
    else:  # (no NULL to bind: _INSERT_ONE_BARE)
        rows = [(mid, qid, now, bytearray(e.body)) for mid, e in zip(ids, envs, strict=True)]
        insert_rows(t.conn, _INSERT_VISIBLE_BARE, rows)
    t.stored(qid, len(envs), ids[-1])
    t.op_notify.add(q.name)
    return ids


def rows_for(t: Txn, q: QueueRow, items: Sequence[Item]) -> tuple[list[int], list[Row]]:
    """The rows of new messages for ``q`` (FIFO heads and counters already updated); the
    caller inserts them, so copies for many queues can go in one statement."""
    now = t.now
    qid = q.id
    ids = t.allocate(len(items), stored=True)
    rows = []
    delayed = 0
    if not q.config.fifo:
        for mid, (body, attrs, delay, prio, grp) in zip(ids, items, strict=True):
            if delay > 0:
                rows.append((mid, qid, WAITING, prio, now + delay, 0, None, grp, None, body, attrs))
                delayed += 1
                t.waiting_until(now + delay)
            else:
                rows.append((mid, qid, READY, prio, now, 0, None, grp, None, body, attrs))
    else:
        conn = t.conn
        headed: dict[str, bool] = {}
        for mid, (body, attrs, delay, prio, grp) in zip(ids, items, strict=True):
            grp = grp or "default"
            has_head = headed.get(grp)
            if has_head is None:
                has_head = (
                    conn.execute(
                        "SELECT 1 FROM fairq_fifo_heads WHERE queue_id = ? AND grp = ?", (qid, grp)
                    ).fetchone()
                    is not None
                )
            if has_head:
                rows.append((mid, qid, BLOCKED, prio, now + delay, 0, None, grp, None, body, attrs))
            else:
                conn.execute(
                    "INSERT INTO fairq_fifo_heads (queue_id, grp, msg_id) VALUES (?, ?, ?)",
                    (qid, grp, mid),
                )
                if delay > 0:
                    rows.append(
                        (mid, qid, WAITING, prio, now + delay, 0, None, grp, None, body, attrs)
                    )
                    delayed += 1
                    t.waiting_until(now + delay)
                else:
                    rows.append((mid, qid, READY, prio, now, 0, None, grp, None, body, attrs))
            headed[grp] = True
    # sent and visible count the new rows later (Txn.fold); a delayed one is not visible
    if delayed:
        t.add(qid, "delayed", delayed)
        t.add(qid, "visible", -delayed)
    if rows:
        t.stored(qid, len(rows), ids[-1])
    t.op_notify.add(q.name)
    return list(ids), rows


def advance_group(t: Txn, q: QueueRow, grp: str) -> None:
    """The head of FIFO group ``grp`` is gone: the next blocked message becomes the head."""
    conn = t.conn
    nxt = conn.execute(
        "SELECT id, avail_at FROM fairq_messages WHERE queue_id = ? AND grp = ? AND state = 2 "
        "ORDER BY id LIMIT 1",
        (q.id, grp),
    ).fetchone()
    if nxt is None:
        conn.execute("DELETE FROM fairq_fifo_heads WHERE queue_id = ? AND grp = ?", (q.id, grp))
        return
    conn.execute(
        "UPDATE fairq_fifo_heads SET msg_id = ? WHERE queue_id = ? AND grp = ?", (nxt[0], q.id, grp)
    )
    if nxt[1] > t.now:
        conn.execute("UPDATE fairq_messages SET state = 1 WHERE id = ?", (nxt[0],))
        t.waiting_until(nxt[1])
        t.add(q.id, "visible", -1)
        t.add(q.id, "delayed", 1)
    else:
        conn.execute("UPDATE fairq_messages SET state = 0 WHERE id = ?", (nxt[0],))


def unref_bodies(t: Txn, refs: Counter[int]) -> None:
    """Messages sharing a published body are gone: drop the bodies nobody refers to."""
    if not refs:
        return
    t.conn.executemany(
        "UPDATE fairq_bodies SET refs = refs - ? WHERE id = ?",
        [(n, ref) for ref, n in refs.items()],
    )
    for chunk in chunks(list(refs)):
        t.conn.execute(
            f"DELETE FROM fairq_bodies WHERE id IN ({marks(len(chunk))}) AND refs <= 0", chunk
        )


def delete_all(t: Txn, q: QueueRow) -> int:
    """Delete every message row of ``q``, releasing their shared bodies; how many."""
    conn = t.conn
    (top,) = conn.execute(
        "SELECT max(id) FROM fairq_messages WHERE queue_id = ?", (q.id,)
    ).fetchone()
    if top is None:
        return 0
    unref_queue(t, q)
    t.deleted(top)
    return conn.execute("DELETE FROM fairq_messages WHERE queue_id = ?", (q.id,)).rowcount


def unref_queue(t: Txn, q: QueueRow) -> None:
    """Before a queue's messages are deleted wholesale: release their shared bodies."""
    refs = Counter(
        {
            ref: n
            for ref, n in t.conn.execute(
                "SELECT body_ref, COUNT(*) FROM fairq_messages "
                "WHERE queue_id = ? AND body_ref IS NOT NULL GROUP BY body_ref",
                (q.id,),
            )
        }
    )
    unref_bodies(t, refs)


def delete(t: Txn, q: QueueRow, rows: Sequence[Row]) -> None:
    """Delete messages of ``q`` (any state), keeping counts, FIFO heads and shared bodies
    right."""
    t.fold(q.id)  # the rows about to go are counted as sent first
    for chunk in chunks([r[ID] for r in rows]):
        t.conn.execute(f"DELETE FROM fairq_messages WHERE id IN ({marks(len(chunk))})", chunk)
    deleted(t, q, rows)


def deleted(t: Txn, q: QueueRow, rows: Sequence[Row]) -> None:
    """Messages of ``q`` were just deleted: keep counts, FIFO heads and shared bodies right."""
    if not rows:
        return
    t.deleted(max(r[ID] for r in rows))
    refs = [r[BODY_REF] for r in rows if r[BODY_REF] is not None]
    if refs:
        unref_bodies(t, Counter(refs))
    qid = q.id
    visible = delayed = in_flight = 0
    for r in rows:
        if r[STATE] != WAITING:
            visible -= 1
        elif r[LEASE] is None:
            delayed -= 1
        else:
            in_flight -= 1
    t.add(qid, "visible", visible)
    t.add(qid, "delayed", delayed)
    t.add(qid, "in_flight", in_flight)
    if q.config.fifo:
        for r in rows:
            if r[STATE] != BLOCKED and r[GRP] is not None:
                advance_group(t, q, r[GRP])
    t.op_notify.add(q.name)


# an ack of a few: a row whose receive is not counted yet takes ACKED_LEASE (schema 12), any
# other becomes ACKED; just after an upgrade (Txn.new_formats) both move as before schema 12.
# Each statement as (with RETURNING id, without): one id needs no RETURNING (_hits)
def _mark(sql: str) -> tuple[str, str]:
    return sql + " RETURNING id", sql


# leased in place (schema 13): current while its end, avail_at + LEASED_OFFSET (computed so
# wherever it is read: the stored end may be a microsecond off the one asked for), is past now
_MARK_IN_PLACE = _mark(
    f"UPDATE fairq_messages SET lease = {ACKED_LEASE} WHERE id IN ({{marks}}) AND lease = ? "
    f"AND queue_id = ? AND state = 0 AND avail_at < -1 AND avail_at + {LEASED_OFFSET} > ?"
)
# the lease's end negated: current while -end < -now
_MARK_UNCOUNTED = _mark(
    f"UPDATE fairq_messages SET lease = {ACKED_LEASE} WHERE id IN ({{marks}}) AND lease = ? "
    "AND queue_id = ? AND state = 1 AND avail_at < ?"
)
_MARK_COUNTED = _mark(
    f"UPDATE fairq_messages SET avail_at = {ACKED}, lease = NULL WHERE id IN ({{marks}}) "
    "AND lease = ? AND queue_id = ? AND avail_at > ?"
)
_MARK_BEFORE_12 = (
    f"UPDATE fairq_messages SET avail_at = CASE WHEN avail_at < 0 THEN {ACKED_UNCOUNTED} "
    f"ELSE {ACKED} END, lease = NULL WHERE id IN ({{marks}}) AND lease = ? AND queue_id = ? "
    "AND (avail_at > ? OR (state = 1 AND avail_at < ?)) RETURNING id"
)


def _hits(
    cur: sqlite3.Cursor, sql: tuple[str, str], ids: Sequence[int], params: tuple[Any, ...]
) -> list[int]:
    """The ids among ``ids`` that UPDATE ``sql`` (a _mark pair) changed. One id needs no
    RETURNING (which costs about as much as the statement itself): the row count tells."""
    if len(ids) == 1:
        return list(ids) if cur.execute(in_list(sql[1], 1), (*ids, *params)).rowcount else []
    return [r[0] for r in cur.execute(in_list(sql[0], len(ids)), (*ids, *params))]


# an ack of many, the common rows: counted receives, no shared body, no group. Nothing to
# return, so no RETURNING (which costs about as much as the DELETE itself: 1.0 against 1.9
# us a row, bench.sqlite_hotpath's receive(100)+ack_batch); it runs under a savepoint and
# is undone when it deletes fewer rows than it names, for _DELETE_ACKED to do it again
_DELETE_PLAIN = (
    "DELETE FROM fairq_messages WHERE id IN ({marks}) AND lease = ? AND queue_id = ? "
    "AND avail_at > ? AND body_ref IS NULL AND grp IS NULL"
)
# ... and any other: (id, body_ref, grp, the attempt of a receive not counted yet) of each
# deleted row (four columns returned where six cost a fifth more)
# (a lease is current while its end is past now: avail_at > now counted, -avail_at > now in
# state 1 not counted yet, avail_at + LEASED_OFFSET > now leased in place)
_DELETE_ACKED = (
    "DELETE FROM fairq_messages WHERE id IN ({marks}) AND lease = ? AND queue_id = ? "
    "AND (avail_at > ? OR (state = 1 AND avail_at < ?) "
    f"OR (state = 0 AND avail_at < -1 AND avail_at + {LEASED_OFFSET} > ?)) "
    "RETURNING id, body_ref, grp, CASE WHEN avail_at < 0 THEN attempt END"
)


def _mark_acked(
    t: Txn, q: QueueRow, receipts: Sequence[str], leases: list[tuple[int, Sequence[int]]]
) -> tuple[int, list[str]]:
    """The ack of a few messages of a non-FIFO queue: their leased rows become acked rows,
    which :func:`settle` deletes and counts. A row whose receive is not counted yet (leased
    in place, or its lease's end negated) only takes ``ACKED_LEASE``: its page and nothing
    else is written; any other becomes ``ACKED`` (no lease), which writes its page and an
    ix_waiting page. A lease is current while it has not ended: its end is ``avail_at``,
    ``-avail_at`` (state 1) or ``avail_at + LEASED_OFFSET`` (state 0) for a receive not
    counted yet."""
    conn = t.conn
    now = t.now
    qid = q.id
    new = t.new_formats()
    # the kinds of lease, the likeliest first (a queue without priorities leases in place)
    kinds = [(_MARK_UNCOUNTED, -now), (_MARK_COUNTED, now)]
    if q.config.max_priority == 0:
        kinds.insert(0, (_MARK_IN_PLACE, now))
    gone: list[tuple[int, int]] = []
    for lease, ids in leases:
        for chunk in chunks(ids):
            if not new:
                sql = in_list(_MARK_BEFORE_12, len(chunk))
                gone += [(r[0], lease) for r in conn.execute(sql, (*chunk, lease, qid, now, -now))]
                continue
            hit: list[int] = []
            rest: Sequence[int] = chunk
            for mark, bound in kinds:
                hit += _hits(t.cur, mark, rest, (lease, qid, bound))
                if len(hit) == len(chunk):
                    break
                marked = set(hit)  # the others are of another kind (or of no current lease)
                rest = [mid for mid in chunk if mid not in marked]
                if not rest:  # (a receipt given twice)
                    break
            gone += [(mid, lease) for mid in hit]
    if len(gone) == len(receipts):
        lost: list[str] = []  # every receipt named a current lease (the common case)
    else:
        found = set(gone)
        lost = [r for r in receipts if parse_receipt(r) not in found]
    if gone:
        t.store.unsettled += len(gone)
        t.op_notify.add(q.name)
    return len(gone), lost


# what settle() deletes: rows acked before their receive was counted (ACKED_LEASE, their
# end still negated) and rows marked ACKED or (left by a fairq before schema 12)
# ACKED_UNCOUNTED; one range of ix_waiting (avail_at < 0) less the leases not counted yet
_SETTLED = "state = 1 AND avail_at < 0 AND (avail_at >= -1 OR lease = " + str(ACKED_LEASE) + ")"
# ... counted per queue and shared body, before they go: how many, how many of them had
# their receive counted here (all but ACKED), how many of those were redeliveries, and the
# greatest id; no row comes back to Python (a DELETE ... RETURNING cost a loop over each)
_SETTLED_COUNTS = (
    f"SELECT queue_id, body_ref, count(*), sum(avail_at != {ACKED}), "
    f"sum(avail_at != {ACKED} AND attempt > 1), max(id) FROM fairq_messages "
    f"WHERE {_SETTLED} GROUP BY queue_id, body_ref"
)


# rows leased in place (schema 13) of one queue named in fairq_lazy: the acked ones counted
# as above (their receives all uncounted), then deleted; the others move to state 1, their
# lease's end their due time, counted as received
_IN_PLACE_ACKED_COUNTS = (
    "SELECT queue_id, body_ref, count(*), count(*), sum(attempt > 1), max(id) "
    f"FROM fairq_messages WHERE {IN_PLACE} AND lease = {ACKED_LEASE} GROUP BY body_ref"
)
_IN_PLACE_ACKED = f"DELETE FROM fairq_messages WHERE {IN_PLACE} AND lease = {ACKED_LEASE}"
_IN_PLACE_COUNTED = (
    f"UPDATE fairq_messages SET state = 1, avail_at = avail_at + {LEASED_OFFSET} "
    f"WHERE {IN_PLACE} RETURNING attempt"
)


# the rows of one run still in state 3 (a row of the run acked by a big ack is gone)
_RUN_SETTLED = "UPDATE fairq_messages SET state = 1 WHERE id BETWEEN ? AND ? AND state = 3"


def settle(t: Txn) -> None:
    """Count what receives and acks left uncounted (of any queue, by any process): leases
    not counted yet get their due time back and move from ``visible`` to ``in_flight``;
    acked rows are deleted and move to ``acked``, shared bodies released. Before anything
    reads a queue's counters or moves a leased row otherwise, and by the writer every few
    hundred receives and acks; four index probes when there is nothing."""
    store = t.store
    store.unsettled = 0
    store.settled_at = t.now
    cur = t.cur
    # the runs leased in state 3 (schema 14) into state 1, so that what follows (and
    # everything after settle) finds every lease there (a row a small ack marked ACKED
    # since is still in its run, and is settled below with the others); then the rows
    # leased in place, queue by queue (schema 13); then of the other rows, the acked ones
    # (counted by queue, then deleted), then the leases not counted yet get their due time
    # back
    groups: list[Row] = []
    runs = cur.execute("SELECT lo, hi FROM fairq_runs").fetchall()
    if runs:
        cur.executemany(_RUN_SETTLED, runs)
        cur.execute("DELETE FROM fairq_runs")
    lazy = cur.execute("SELECT queue_id FROM fairq_lazy").fetchall()
    for (qid,) in lazy:
        acked = cur.execute(_IN_PLACE_ACKED_COUNTS, (qid,)).fetchall()
        if acked:
            cur.execute(_IN_PLACE_ACKED, (qid,))
            groups += acked
        for (attempt,) in cur.execute(_IN_PLACE_COUNTED, (qid,)).fetchall():
            _counted_receive(t, qid, attempt)
    if lazy:
        cur.execute("DELETE FROM fairq_lazy")
    store.lazy.clear()
    settled = cur.execute(_SETTLED_COUNTS).fetchall()
    groups += settled
    if settled:
        cur.execute("DELETE FROM fairq_messages WHERE " + _SETTLED)
    for qid, attempt in cur.execute(
        "UPDATE fairq_messages SET avail_at = -avail_at WHERE state = 1 AND avail_at < -1 "
        "RETURNING queue_id, attempt"
    ).fetchall():
        _counted_receive(t, qid, attempt)
    if not groups:
        return
    t.deleted(max(g[5] for g in groups))
    refs: Counter[int] = Counter()
    for qid, ref, n, received, redelivered, _ in groups:
        # each acked row: its receive counted now if it was not (visible -> in_flight),
        # then its ack (in_flight -> acked)
        t.add(qid, "visible", -received)
        t.add(qid, "in_flight", received - n)
        t.add(qid, "redelivered", redelivered)
        t.add(qid, "acked", n)
        if ref is not None:
            refs[ref] += n
    if refs:
        unref_bodies(t, refs)


def _counted_receive(t: Txn, qid: int, attempt: int) -> None:
    """What a receive of one message adds to its queue's counters (its ``attempt``-th)."""
    t.add(qid, "visible", -1)
    t.add(qid, "in_flight", 1)
    if attempt > 1:
        t.add(qid, "redelivered", 1)


def dead_letter_rows(
    t: Txn, q: QueueRow, rows: Sequence[Row], reason: str, detail: str | None = None
) -> None:
    """Move messages to ``q``'s dead-letter queue (or discard them), with their reason."""
    if not rows:
        return
    delete(t, q, rows)
    n = len(rows)
    if reason == "expired":
        t.add(q.id, "expired", n)
    target = q.config.dead_letter
    if target is None:
        t.add(q.id, "discarded", n)
        return
    t.add(q.id, "dead_lettered", n)
    dlq = t.find(target) or t.create(target, QueueConfig.for_dead_letters())
    top = dlq.config.max_priority
    items = []
    for r in rows:
        attrs = dead_letter_attributes(
            attrs_of(r[ATTRS]), reason, q.name, format_id(r[ID]), r[ATTEMPT], detail
        )
        items.append((r[BODY], blob_of(attrs), 0.0, min(r[PRIO], top), r[GRP]))
    insert(t, dlq, items)


def expire_old(t: Txn, q: QueueRow) -> None:
    """Dead-letter (reason ``expired``) messages of ``q`` older than its retention that are
    not in flight; in-flight ones are checked when their lease ends."""
    cutoff = int((t.now - q.config.retention) * 1000) << 16
    while True:
        rows = t.conn.execute(
            "SELECT " + COLS + " FROM fairq_messages WHERE queue_id = ? AND id < ? "
            "AND NOT (state = 1 AND lease IS NOT NULL) LIMIT ?",
            (q.id, cutoff, _SWEEP_BATCH),
        ).fetchall()
        if not rows:
            return
        dead_letter_rows(t, q, rows, "expired")


def oldest_age(t: Txn, queue_id: int) -> float:
    """Seconds since the oldest message in the queue was sent (0 when it is empty)."""
    (first,) = t.conn.execute(
        "SELECT MIN(id) FROM fairq_messages WHERE queue_id = ?", (queue_id,)
    ).fetchone()
    return 0.0 if first is None else max(0.0, t.now - id_time(first))


def sweep(t: Txn) -> None:
    """Bring due delays and ended leases to their next state: visible again, or
    dead-lettered after the last attempt or past retention. Runs at the start of every
    transaction, so it costs one index probe when nothing is due."""
    conn = t.conn
    now = t.now
    if now < t.store.due:
        return
    settle(t)  # every lease's end is its due time again
    while True:
        rows = conn.execute(
            "SELECT " + COLS + " FROM fairq_messages WHERE state = 1 AND avail_at >= 0 "
            "AND avail_at <= ? ORDER BY avail_at LIMIT ?",
            (now, _SWEEP_BATCH),
        ).fetchall()
        if not rows:
            break
        back: list[int] = []
        for r in rows:
            q = t.queue_by_id(r[QID])
            if q is None:  # queue deleted by an older fairq without its messages
                conn.execute("DELETE FROM fairq_messages WHERE id = ?", (r[ID],))
                t.deleted(r[ID])
                continue
            cfg = q.config
            leased = r[LEASE] is not None
            if leased and cfg.max_attempts is not None and r[ATTEMPT] >= cfg.max_attempts:
                dead_letter_rows(t, q, [r], "max_attempts")
            elif id_time(r[ID]) < now - cfg.retention:
                dead_letter_rows(t, q, [r], "expired")
            else:
                back.append(r[ID])
                t.add(q.id, "in_flight" if leased else "delayed", -1)
                t.add(q.id, "visible", 1)
                t.op_notify.add(q.name)
        for chunk in chunks(back):
            conn.execute(
                "UPDATE fairq_messages SET state = 0, lease = NULL "
                f"WHERE id IN ({marks(len(chunk))})",
                chunk,
            )
        if len(rows) < _SWEEP_BATCH:
            break
    due = next_due(conn)
    t.store.due = math.inf if due is None else due


_LEASE_COLS = "id, queue_id, state, priority, avail_at, attempt, lease, grp, body_ref"


def current_leases(
    t: Txn, q: QueueRow, receipts: Sequence[str], full: bool = False
) -> tuple[list[Row], list[str]]:
    """The rows whose current lease is named by ``receipts``, and the receipts that are not.
    Rows carry body and attributes only when ``full`` is asked for."""
    settle(t)  # every lease counted, its end its due time
    parsed = [parse_receipt(r) for r in receipts]
    cols = COLS if full else _LEASE_COLS
    found: dict[int, Row] = {}
    for chunk in chunks([p[0] for p in parsed]):
        for row in t.conn.execute(
            f"SELECT {cols} FROM fairq_messages WHERE id IN ({marks(len(chunk))})", chunk
        ):
            found[row[ID]] = row
    now = t.now
    qid = q.id
    rows: list[Row] = []
    lost: list[str] = []
    taken: set[int] = set()
    for receipt, (mid, lease) in zip(receipts, parsed, strict=True):
        row = found.get(mid)
        if row is None or row[LEASE] != lease or row[QID] != qid or row[AVAIL] <= now:
            lost.append(receipt)
        elif mid not in taken:
            taken.add(mid)
            rows.append(row)
    return rows, lost


def _ids_of(receipts: Sequence[str], tail: str) -> Sequence[int]:
    """The ids of receipts that each are 16 characters then ``tail`` (the caller checked),
    decoded together: the digits of all of them in one ``bytes.fromhex``, read as big-endian
    64-bit numbers by ``struct`` (a fifth of the time of ``int(r[:16], 16)`` each). Digits
    that are not plain hex (``int`` also takes a sign, ``_`` and spaces) go to ``int``."""
    n = len(receipts)
    try:
        raw = bytes.fromhex("".join(receipts).replace(tail, ""))
    except ValueError:
        raw = b""
    if len(raw) == 8 * n:  # (fromhex skips spaces: then fewer bytes)
        return struct.unpack(f">{n}Q", raw)
    return [int(r[:16], 16) for r in receipts]


def ack_leased(t: Txn, q: QueueRow, receipts: Sequence[str]) -> tuple[int, list[str]]:
    """Ack the messages of ``q`` whose current lease is named by ``receipts`` (one statement
    per lease token, no read first); return how many were acked and the receipts that named
    no current lease. A few receipts of a non-FIFO queue only mark their rows acked, for
    :func:`settle`; more, or a FIFO queue's (the next of each group moves up), are
    deleted at once, with the receives not counted yet of their rows."""
    t.fold(q.id)  # the rows about to go are counted as sent first
    # the receipts of one receive share their lease: parse each lease once
    leases: list[tuple[int, Sequence[int]]]
    try:
        tail = receipts[0][16:] if receipts else ""  # ".<lease>" after the id's 16 digits
        if tail[:1] == "." and all(r[16:] == tail for r in receipts):
            # the receipts of one receive (an ack_batch of what it returned): one lease
            leases = [(storable_lease(int(tail[1:], 16)), _ids_of(receipts, tail))]
        else:
            by_lease: dict[str, list[int]] = {}
            for receipt in receipts:
                head, _, tail = receipt.partition(".")
                of_lease = by_lease.get(tail)
                if of_lease is None:
                    of_lease = by_lease[tail] = []
                of_lease.append(int(head, 16))
            leases = [(storable_lease(int(tail, 16)), ids) for tail, ids in by_lease.items()]
    except (AttributeError, TypeError, ValueError):
        for receipt in receipts:
            parse_receipt(receipt)  # raises InvalidMessage naming the malformed one
        raise
    for _, ids in leases:
        if max(ids) >= INT64_END or min(ids) < 0:
            for receipt in receipts:
                parse_receipt(receipt)  # raises InvalidMessage naming the one out of range
    if len(receipts) < LAZY_BELOW and not q.config.fifo:
        return _mark_acked(t, q, receipts, leases)
    now = t.now
    qid = q.id
    conn = t.conn
    plain = not q.config.fifo and qid not in t.store.returning_acks
    rows: list[Row] = []  # the rows _DELETE_ACKED returned
    parts: list[tuple[int, list[Row]]] = []  # each of its statements' rows, with the lease
    deleted: list[tuple[int, Sequence[int]]] = []  # the ids _DELETE_PLAIN deleted, by lease
    done = 0  # rows _DELETE_PLAIN deleted
    top = -1  # the greatest id among them
    for lease, ids in leases:
        for chunk in chunks(ids):
            if plain:
                conn.execute("SAVEPOINT fairq_ack")
                sql, matched = ids_in(_DELETE_PLAIN, chunk)
                if conn.execute(sql, (*matched, lease, qid, now)).rowcount == len(chunk):
                    conn.execute("RELEASE fairq_ack")
                    done += len(chunk)
                    top = max(top, max(chunk))
                    deleted.append((lease, chunk))
                    continue
                conn.execute("ROLLBACK TO fairq_ack")
                conn.execute("RELEASE fairq_ack")
            sql = in_list(_DELETE_ACKED, len(chunk))
            got = conn.execute(sql, (*chunk, lease, qid, now, -now, now)).fetchall()
            rows += got
            parts.append((lease, got))
    gone = done + len(rows)
    if gone == len(receipts):
        lost: list[str] = []  # every receipt named a current lease (the common case)
    else:
        found = {(r[0], lease) for lease, got in parts for r in got}
        found.update((mid, lease) for lease, ids in deleted for mid in ids)
        lost = [r for r in receipts if parse_receipt(r) not in found]
    if not gone:
        return 0, lost
    t.deleted(max(top, max((r[0] for r in rows), default=-1)))
    refs = [r[1] for r in rows if r[1] is not None]
    if refs:
        unref_bodies(t, Counter(refs))
    for r in rows:
        if r[3] is not None:  # its receive not counted yet (settle)
            _counted_receive(t, qid, r[3])
    t.add(qid, "in_flight", -gone)
    t.add(qid, "acked", gone)
    grouped = False
    for r in rows:
        if r[2] is not None:  # a leased row heads its group (state 1, never blocked)
            grouped = True
            advance_group(t, q, r[2])
    if plain and (refs or grouped):  # this queue holds such rows: no plain DELETE next time
        returning = t.store.returning_acks
        if len(returning) >= 10_000:
            returning.clear()
        returning.add(qid)
    t.op_notify.add(q.name)
    return gone, lost


def received(r: Row, queue: str, receipt: str, attempt: int) -> Received:
    return Received(
        format_id(r[ID]),
        r[BODY],
        attrs_of(r[ATTRS]),
        attempt,
        id_time(r[ID]),
        r[PRIO],
        r[GRP],
        receipt,
        queue,
    )


def make_room(t: Txn, q: QueueRow, n: int) -> None:
    """Make sure ``n`` new messages fit in bounded queue ``q``: drop the oldest visible ones
    (``drop_oldest``) or raise ``QueueFull`` carrying the overflow mode."""
    cfg = q.config
    if not n or cfg.max_length is None:
        return
    if n > cfg.max_length:
        raise QueueFull(q.name, cfg.max_length, BATCH_LARGER)
    settle(t)
    t.fold(q.id)
    t.flush()
    (depth,) = t.conn.execute(
        "SELECT visible + delayed + in_flight FROM fairq_queues WHERE id = ?", (q.id,)
    ).fetchone()
    need = depth + n - cfg.max_length
    if need <= 0:
        return
    if cfg.overflow != "drop_oldest":
        raise QueueFull(q.name, cfg.max_length, "", cfg.overflow)
    victims = t.conn.execute(
        "SELECT " + COLS + " FROM fairq_messages WHERE queue_id = ? AND state != 1 "
        "ORDER BY id LIMIT ?",
        (q.id, need),
    ).fetchall()
    if len(victims) < need:
        raise QueueFull(q.name, cfg.max_length, "no visible message can be dropped", "drop_oldest")
    dead_letter_rows(t, q, victims, "overflow")


def store_copies(t: Txn, plan: CopyPlan) -> None:
    """Store published copies in their subscription queues — room is made in every queue
    first (or ``QueueFull`` raised, changing nothing), then one insert for all."""
    targets = [(t.queue(name), indices) for name, indices in plan.per_queue.items()]
    for q, indices in targets:
        make_room(t, q, len(indices))
    copies = plan.copies
    encoded: dict[int, bytes | None] = {}  # copies may share one attributes dict
    blobs = []
    for c in copies:
        blob = encoded.get(id(c.attributes), b"")
        if blob == b"":
            blob = encoded[id(c.attributes)] = blob_of(c.attributes)
        blobs.append(blob)
    # a body copied into several queues is stored once, with a count of its references
    shares = Counter(i for _, indices in targets for i in indices)
    refs: dict[int, int] = {}
    shared = [i for i, n in shares.items() if n > 1]
    if shared:
        ref_ids = t.allocate(len(shared))
        t.conn.executemany(
            "INSERT INTO fairq_bodies (id, body, refs) VALUES (?, ?, ?)",
            [(ref, copies[i].body, shares[i]) for ref, i in zip(ref_ids, shared, strict=True)],
        )
        refs = dict(zip(shared, ref_ids, strict=True))
    rows: list[Row] = []
    now = t.now
    ids = iter(t.allocate(sum(len(indices) for _, indices in targets), stored=True))
    for q, indices in targets:
        if q.config.fifo:
            items = [(copies[i].body, blobs[i], copies[i].delay, 0, None) for i in indices]
            fifo_rows = rows_for(t, q, items)[1]
            for row, i in zip(fifo_rows, indices, strict=True):
                ref = refs.get(i)  # FIFO rows are built by _rows: point them at the shared body
                rows.append(row if ref is None else (*row[:8], ref, None, row[10]))
            continue
        qid = q.id
        delayed = 0
        for i in indices:
            c = copies[i]
            ref = refs.get(i)
            body = c.body if ref is None else None
            if c.delay > 0:
                rows.append(
                    (next(ids), qid, WAITING, 0, now + c.delay, 0, None, None, ref, body, blobs[i])
                )
                t.waiting_until(now + c.delay)
                delayed += 1
            else:
                rows.append((next(ids), qid, READY, 0, now, 0, None, None, ref, body, blobs[i]))
        if delayed:  # sent and visible count the copies later (Txn.fold)
            t.add(qid, "delayed", delayed)
            t.add(qid, "visible", -delayed)
        t.stored(qid, len(indices), rows[-1][ID])
        t.op_notify.add(q.name)
    insert_rows(t.conn, _INSERT, rows)


# the earliest due time of a waiting row: a delay's or counted lease's, and a lease not
# counted yet (its end negated, below -1; or leased in place, one seek per queue named in
# fairq_lazy), or in state 3 (fairq_runs). A row acked since (ACKED_LEASE, or a run acked
# whole) still counts here until settled: at worst a long poll looks once more at what was
# its lease's end
NEXT_DUE = (
    "SELECT min(coalesce((SELECT min(until) FROM fairq_runs), 1e300), "
    "coalesce((SELECT MIN(avail_at) FROM fairq_messages "
    "WHERE state = 1 AND avail_at >= 0), 1e300), coalesce(-(SELECT MAX(avail_at) "
    "FROM fairq_messages WHERE state = 1 AND avail_at < -1), 1e300), "
    "coalesce((SELECT min((SELECT m.avail_at FROM fairq_messages m "
    "WHERE m.queue_id = l.queue_id AND m.state = 0 AND m.priority = 0 AND m.avail_at < -1 "
    f"ORDER BY m.avail_at LIMIT 1)) FROM fairq_lazy l) + {LEASED_OFFSET}, 1e300))"
)


def next_due(conn: sqlite3.Connection) -> float | None:
    row = conn.execute(NEXT_DUE).fetchone()
    return None if row is None or row[0] >= 1e300 else float(row[0])
