"""The SQLite backend's queue operations, each run inside one write transaction (a
:class:`~fairq.backends.sqlite.txn.Txn`).

Everything here is synchronous; the backend (``__init__.py``) groups the operations
that arrive together into one transaction, each under its own savepoint, so one that
fails leaves the others and the database as they were. The schema, and what the
message states mean, are in ``schema.sql``.
"""

from __future__ import annotations

import math
import sqlite3
from collections import Counter
from collections.abc import Sequence

import orjson

from ...errors import LeaseLost, QueueFull
from ...message import Received, format_id, id_time, parse_receipt
from ...queue import Envelope, QueueConfig, QueueStats
from ..base import (
    CopyPlan,
    check_priorities,
    dead_letter_attributes,
    plan_dedup,
    redrive_attributes,
)
from . import idempotency
from .txn import QueueRow, Row, Txn, chunks, marks

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
_SELECT_READY = (
    "SELECT " + COLS + " FROM fairq_messages WHERE queue_id = ? AND state = 0 "
    "ORDER BY priority DESC, avail_at, id LIMIT ?"
)
_COUNTERS = ("sent", "acked", "nacked", "redelivered", "dead_lettered", "expired", "discarded")
_SWEEP_BATCH = 1000


def _category(state: int, lease: int | None) -> str:
    if state == WAITING:
        return "delayed" if lease is None else "in_flight"
    return "visible"


def _attrs(blob: bytes | None) -> dict[str, str]:
    return orjson.loads(blob) if blob else {}


def _blob(attrs: dict[str, str]) -> bytes | None:
    return orjson.dumps(attrs) if attrs else None


# -- message moves -------------------------------------------------------------------------
Item = tuple[bytes, bytes | None, float, int, str | None]  # body, attrs blob, delay, prio, group


def _insert(t: Txn, q: QueueRow, items: Sequence[Item]) -> list[int]:
    """Store new messages in ``q``; return their ids."""
    ids, rows = _rows(t, q, items)
    if len(rows) == 1:
        t.conn.execute(_INSERT, rows[0])
    else:
        t.conn.executemany(_INSERT, rows)
    return ids


def _rows(t: Txn, q: QueueRow, items: Sequence[Item]) -> tuple[list[int], list[Row]]:
    """The rows of new messages for ``q`` (FIFO heads and counters already updated); the
    caller inserts them, so copies for many queues can go in one statement."""
    now = t.now
    qid = q.id
    ids = t.allocate(len(items))
    rows = []
    visible = delayed = 0
    if not q.config.fifo:
        for mid, (body, attrs, delay, prio, grp) in zip(ids, items, strict=True):
            if delay > 0:
                rows.append((mid, qid, WAITING, prio, now + delay, 0, None, grp, None, body, attrs))
                delayed += 1
                t.waiting_until(now + delay)
            else:
                rows.append((mid, qid, READY, prio, now, 0, None, grp, None, body, attrs))
                visible += 1
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
                visible += 1
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
                    visible += 1
            headed[grp] = True
    t.add(qid, "visible", visible)
    t.add(qid, "delayed", delayed)
    t.add(qid, "sent", len(rows))
    t.op_notify.add(q.name)
    return list(ids), rows


def _advance_group(t: Txn, q: QueueRow, grp: str) -> None:
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


def _unref_bodies(t: Txn, refs: Counter[int]) -> None:
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


def _unref_queue(t: Txn, q: QueueRow) -> None:
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
    _unref_bodies(t, refs)


def _delete(t: Txn, q: QueueRow, rows: Sequence[Row]) -> None:
    """Delete messages of ``q`` (any state), keeping counts, FIFO heads and shared bodies
    right."""
    for chunk in chunks([r[ID] for r in rows]):
        t.conn.execute(f"DELETE FROM fairq_messages WHERE id IN ({marks(len(chunk))})", chunk)
    _unref_bodies(t, Counter(r[BODY_REF] for r in rows if r[BODY_REF] is not None))
    counts = {"visible": 0, "delayed": 0, "in_flight": 0}
    for r in rows:
        counts[_category(r[STATE], r[LEASE])] -= 1
    for column, n in counts.items():
        t.add(q.id, column, n)
    if q.config.fifo:
        for r in rows:
            if r[STATE] != BLOCKED and r[GRP] is not None:
                _advance_group(t, q, r[GRP])
    t.op_notify.add(q.name)


def _dead_letter(
    t: Txn, q: QueueRow, rows: Sequence[Row], reason: str, detail: str | None = None
) -> None:
    """Move messages to ``q``'s dead-letter queue (or discard them), with their reason."""
    if not rows:
        return
    _delete(t, q, rows)
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
            _attrs(r[ATTRS]), reason, q.name, format_id(r[ID]), r[ATTEMPT], detail
        )
        items.append((r[BODY], _blob(attrs), 0.0, min(r[PRIO], top), r[GRP]))
    _insert(t, dlq, items)


def _expire_old(t: Txn, q: QueueRow) -> None:
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
        _dead_letter(t, q, rows, "expired")


def sweep(t: Txn) -> None:
    """Bring due delays and ended leases to their next state: visible again, or
    dead-lettered after the last attempt or past retention. Runs at the start of every
    transaction, so it costs one index probe when nothing is due."""
    conn = t.conn
    now = t.now
    if now < t.store.due:
        return
    while True:
        rows = conn.execute(
            "SELECT " + COLS + " FROM fairq_messages WHERE state = 1 AND avail_at <= ? "
            "ORDER BY avail_at LIMIT ?",
            (now, _SWEEP_BATCH),
        ).fetchall()
        if not rows:
            break
        back: list[int] = []
        for r in rows:
            q = t.queue_by_id(r[QID])
            if q is None:  # queue deleted by an older fairq without its messages
                conn.execute("DELETE FROM fairq_messages WHERE id = ?", (r[ID],))
                continue
            cfg = q.config
            leased = r[LEASE] is not None
            if leased and cfg.max_attempts is not None and r[ATTEMPT] >= cfg.max_attempts:
                _dead_letter(t, q, [r], "max_attempts")
            elif id_time(r[ID]) < now - cfg.retention:
                _dead_letter(t, q, [r], "expired")
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


def _current_leases(
    t: Txn, q: QueueRow, receipts: Sequence[str], full: bool = False
) -> tuple[list[Row], list[str]]:
    """The rows whose current lease is named by ``receipts``, and the receipts that are not.
    Rows carry body and attributes only when ``full`` is asked for."""
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


def _received(r: Row, queue: str, receipt: str, attempt: int) -> Received:
    return Received(
        format_id(r[ID]),
        r[BODY],
        _attrs(r[ATTRS]),
        attempt,
        id_time(r[ID]),
        r[PRIO],
        r[GRP],
        receipt,
        queue,
    )


# -- operations ----------------------------------------------------------------------------
def declare_queue(t: Txn, name: str, config: QueueConfig) -> None:
    q = t.find(name)
    if q is None:
        t.create(name, config)
    else:
        q.config.check_change(name, config)
        if q.config != config:
            t.conn.execute(
                "UPDATE fairq_queues SET config = ? WHERE id = ?",
                (orjson.dumps(config.to_dict()).decode(), q.id),
            )
            t.configs_changed()
    if config.dead_letter is not None and t.find(config.dead_letter) is None:
        t.create(config.dead_letter, QueueConfig.for_dead_letters())
    t.op_notify.add(name)


def queue_config(t: Txn, name: str) -> QueueConfig:
    return t.queue(name).config


def delete_queue(t: Txn, name: str) -> bool:
    q = t.find(name)
    if q is None:
        return False
    conn = t.conn
    _unref_queue(t, q)
    conn.execute("DELETE FROM fairq_messages WHERE queue_id = ?", (q.id,))
    conn.execute("DELETE FROM fairq_fifo_heads WHERE queue_id = ?", (q.id,))
    conn.execute("DELETE FROM fairq_dedup WHERE queue_id = ?", (q.id,))
    conn.execute("DELETE FROM fairq_subscriptions WHERE queue_id = ?", (q.id,))
    conn.execute("DELETE FROM fairq_queues WHERE id = ?", (q.id,))
    t.configs_changed()
    t.op_notify.add(name)
    return True


def list_queues(t: Txn, prefix: str) -> list[str]:
    return [
        r[0]
        for r in t.conn.execute(
            "SELECT name FROM fairq_queues WHERE substr(name, 1, ?) = ? ORDER BY name",
            (len(prefix), prefix),
        )
    ]


def make_room(t: Txn, q: QueueRow, n: int) -> None:
    """Make sure ``n`` new messages fit in bounded queue ``q``: drop the oldest visible ones
    (``drop_oldest``) or raise ``QueueFull`` carrying the overflow mode."""
    cfg = q.config
    if not n or cfg.max_length is None:
        return
    if n > cfg.max_length:
        raise QueueFull(q.name, cfg.max_length, "the batch is larger than max_length")
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
    _dead_letter(t, q, victims, "overflow")


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
            blob = encoded[id(c.attributes)] = _blob(c.attributes)
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
    ids = iter(t.allocate(sum(len(indices) for _, indices in targets)))
    for q, indices in targets:
        if q.config.fifo:
            items = [(copies[i].body, blobs[i], copies[i].delay, 0, None) for i in indices]
            fifo_rows = _rows(t, q, items)[1]
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
        t.add(qid, "visible", len(indices) - delayed)
        t.add(qid, "delayed", delayed)
        t.add(qid, "sent", len(indices))
        t.op_notify.add(q.name)
    t.conn.executemany(_INSERT, rows)


def send(t: Txn, name: str, envs: list[Envelope]) -> list[str]:
    q = t.queue(name)
    cfg = q.config
    now = t.now
    conn = t.conn
    check_priorities(name, envs, cfg.max_priority)

    def sent_before(dedup_id: str) -> int | None:
        hit = conn.execute(
            "SELECT msg_id FROM fairq_dedup WHERE queue_id = ? AND dedup_id = ? AND expires_at > ?",
            (q.id, dedup_id, now),
        ).fetchone()
        return None if hit is None else int(hit[0])

    plan = plan_dedup(envs, sent_before)  # duplicates take no room and store nothing
    fresh = plan.fresh
    make_room(t, q, len(fresh))
    made = _insert(
        t, q, [(e.body, _blob(e.attributes), e.delay, e.priority, e.group) for e in fresh]
    )
    if plan.first and cfg.dedup_window > 0:
        expires = now + cfg.dedup_window
        conn.executemany(
            "INSERT OR REPLACE INTO fairq_dedup (queue_id, dedup_id, msg_id, expires_at) "
            "VALUES (?, ?, ?, ?)",
            [(q.id, d, made[i], expires) for d, i in plan.first.items()],
        )
    return plan.answer(made)


def receive(t: Txn, name: str, n: int, visibility_timeout: float | None) -> list[Received]:
    q = t.queue(name)
    cfg = q.config
    conn = t.conn
    now = t.now
    cutoff = int((now - cfg.retention) * 1000) << 16
    out: list[Received] = []
    while len(out) < n:
        rows = conn.execute(_SELECT_READY, (q.id, n - len(out))).fetchall()
        if not rows:
            break
        stale = [r for r in rows if r[ID] < cutoff]
        if stale:  # past retention: never delivered
            _dead_letter(t, q, stale, "expired")
            rows = [r for r in rows if r[ID] >= cutoff]
        if not rows:
            continue
        until = now + (cfg.visibility_timeout if visibility_timeout is None else visibility_timeout)
        lease = t.store.rng.getrandbits(62) | 1
        ids = [r[ID] for r in rows]
        conn.execute(
            "UPDATE fairq_messages SET state = 1, avail_at = ?, attempt = attempt + 1, lease = ? "
            f"WHERE id IN ({marks(len(ids))})",
            (until, lease, *ids),
        )
        t.waiting_until(until)
        k = len(rows)
        t.add(q.id, "visible", -k)
        t.add(q.id, "in_flight", k)
        redelivered = 0
        tail = f".{lease:x}"
        for r in rows:
            mid = r[0]
            attempt = r[5] + 1
            if attempt > 1:
                redelivered += 1
            hid = f"{mid:016x}"
            attrs = r[10]
            out.append(
                Received(
                    hid,
                    r[9],
                    orjson.loads(attrs) if attrs else {},
                    attempt,
                    (mid >> 16) / 1000.0,
                    r[3],
                    r[7],
                    hid + tail,
                    name,
                )
            )
        t.add(q.id, "redelivered", redelivered)
    return out


def ack(t: Txn, name: str, receipts: list[str]) -> list[str]:
    q = t.queue(name)
    rows, lost = _current_leases(t, q, receipts)
    if rows:
        _delete(t, q, rows)
        t.add(q.id, "acked", len(rows))
    return lost


def nack(t: Txn, name: str, receipt: str, delay: float) -> None:
    q = t.queue(name)
    rows, lost = _current_leases(t, q, [receipt], full=True)
    if lost:
        raise LeaseLost(lost)
    (r,) = rows
    t.add(q.id, "nacked", 1)
    cfg = q.config
    if cfg.max_attempts is not None and r[ATTEMPT] >= cfg.max_attempts:
        _dead_letter(t, q, rows, "max_attempts")
        return
    t.add(q.id, "in_flight", -1)
    if delay > 0:
        t.conn.execute(
            "UPDATE fairq_messages SET avail_at = ?, lease = NULL WHERE id = ?",
            (t.now + delay, r[ID]),
        )
        t.waiting_until(t.now + delay)
        t.add(q.id, "delayed", 1)
    else:
        t.conn.execute(
            "UPDATE fairq_messages SET state = 0, avail_at = ?, lease = NULL WHERE id = ?",
            (t.now, r[ID]),
        )
        t.add(q.id, "visible", 1)
    t.op_notify.add(name)


def extend(t: Txn, name: str, receipts: list[str], seconds: float) -> list[str]:
    q = t.queue(name)
    rows, lost = _current_leases(t, q, receipts)
    until = t.now + seconds
    if rows:
        t.waiting_until(until)  # a lease can also be shortened
    for chunk in chunks([r[ID] for r in rows]):
        t.conn.execute(
            f"UPDATE fairq_messages SET avail_at = ? WHERE id IN ({marks(len(chunk))})",
            (until, *chunk),
        )
    return lost


def release(t: Txn, name: str, receipts: list[str]) -> list[str]:
    q = t.queue(name)
    rows, lost = _current_leases(t, q, receipts)
    for chunk in chunks([r[ID] for r in rows]):
        t.conn.execute(
            "UPDATE fairq_messages SET state = 0, avail_at = ?, lease = NULL, "
            f"attempt = attempt - 1 WHERE id IN ({marks(len(chunk))})",
            (t.now, *chunk),
        )
    if rows:
        t.add(q.id, "in_flight", -len(rows))
        t.add(q.id, "visible", len(rows))
        t.op_notify.add(name)
    return lost


def dead_letter(t: Txn, name: str, receipt: str, reason: str) -> None:
    q = t.queue(name)
    rows, lost = _current_leases(t, q, [receipt], full=True)
    if lost:
        raise LeaseLost(lost)
    _dead_letter(t, q, rows, "rejected", reason)


def stats(t: Txn, name: str) -> QueueStats:
    q = t.queue(name)
    _expire_old(t, q)
    t.flush()
    row = t.conn.execute(
        "SELECT visible, delayed, in_flight, "
        + ", ".join(_COUNTERS)
        + " FROM fairq_queues WHERE id = ?",
        (q.id,),
    ).fetchone()
    (oldest_id,) = t.conn.execute(
        "SELECT MIN(id) FROM fairq_messages WHERE queue_id = ?", (q.id,)
    ).fetchone()
    oldest = 0.0 if oldest_id is None else max(0.0, t.now - id_time(oldest_id))
    slo = q.config.freshness_slo
    sent, acked, nacked, redelivered, dead_lettered, expired, discarded = row[3:]
    return QueueStats(
        visible=row[0],
        delayed=row[1],
        in_flight=row[2],
        oldest_age=oldest,
        sent=sent,
        acked=acked,
        nacked=nacked,
        redelivered=redelivered,
        dead_lettered=dead_lettered,
        expired=expired,
        discarded=discarded,
        freshness_slo=slo,
        breaching=slo is not None and oldest > slo,
    )


def purge(t: Txn, name: str) -> int:
    q = t.queue(name)
    conn = t.conn
    _unref_queue(t, q)
    n = conn.execute("DELETE FROM fairq_messages WHERE queue_id = ?", (q.id,)).rowcount
    conn.execute("DELETE FROM fairq_fifo_heads WHERE queue_id = ?", (q.id,))
    t.flush()
    conn.execute(
        "UPDATE fairq_queues SET visible = 0, delayed = 0, in_flight = 0 WHERE id = ?", (q.id,)
    )
    t.op_notify.add(name)
    return n


def peek(t: Txn, name: str, limit: int) -> list[Received]:
    q = t.queue(name)
    rows = t.conn.execute(
        "SELECT " + COLS + " FROM fairq_messages WHERE queue_id = ? ORDER BY id LIMIT ?",
        (q.id, limit),
    ).fetchall()
    return [_received(r, name, "", r[ATTEMPT]) for r in rows]


def redrive(t: Txn, name: str, to: str | None, limit: int, after: int) -> tuple[int, int | None]:
    """Move up to ``limit`` messages with ids above ``after``, oldest first; return how many
    moved and the last id looked at (None when nothing is left to look at)."""
    q = t.queue(name)
    target_fixed = t.queue(to) if to is not None else None
    rows = t.conn.execute(
        "SELECT " + COLS + " FROM fairq_messages WHERE queue_id = ? AND id > ? AND state != 1 "
        "ORDER BY id LIMIT ?",
        (q.id, after, limit),
    ).fetchall()
    by_target: dict[str, list[Row]] = {}
    for r in rows:
        target = target_fixed
        if target is None:
            source = _attrs(r[ATTRS]).get("fairq.source")
            target = t.find(source) if source else None
        if target is None or target.id == q.id:
            continue  # its source queue is gone: it stays
        by_target.setdefault(target.name, []).append(r)
    moved = 0
    for target_name, moving in by_target.items():
        target = t.queue(target_name)
        _delete(t, q, moving)
        top = target.config.max_priority
        _insert(
            t,
            target,
            [
                (
                    r[BODY],
                    _blob(redrive_attributes(_attrs(r[ATTRS]))),
                    0.0,
                    min(r[PRIO], top),
                    r[GRP],
                )
                for r in moving
            ],
        )
        moved += len(moving)
    return moved, (rows[-1][ID] if len(rows) == limit else None)


def next_due(conn: sqlite3.Connection) -> float | None:
    row = conn.execute("SELECT MIN(avail_at) FROM fairq_messages WHERE state = 1").fetchone()
    return None if row is None or row[0] is None else float(row[0])


def drop_expired_dedup(t: Txn) -> None:
    t.conn.execute("DELETE FROM fairq_dedup WHERE expires_at <= ?", (t.now,))
    t.conn.execute("DELETE FROM fairq_topic_dedup WHERE expires_at <= ?", (t.now,))
    idempotency.drop_expired(t)
