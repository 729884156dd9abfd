"""The SQLite backend's queue operations, each run inside one write transaction (a
:class:`~fairq.backends.sqlite.txn.Txn`).

Everything here is synchronous; the backend (``__init__.py``) groups the operations
that arrive together into one transaction, each under its own savepoint, so one that
fails leaves the others and the database as they were. The schema, and what the
message states mean, are in ``schema.sql``.
"""

from __future__ import annotations

import orjson

from ...errors import LeaseLost
from ...message import Received, format_id, new_lease
from ...model.queues import QUEUE_COUNTERS, Envelope, QueueConfig, QueueStats
from ..rules import (
    check_priorities,
    plan_dedup,
    redrive_attributes,
)
from . import idempotency
from .messages import (
    ATTEMPT,
    ATTRS,
    BODY,
    COLS,
    GRP,
    ID,
    LAZY_BELOW,
    LEASED_OFFSET,
    PRIO,
    SELECT_READY,
    SELECT_READY_FLAT,
    ack_leased,
    attrs_of,
    blob_of,
    current_leases,
    dead_letter_rows,
    delete,
    delete_all,
    expire_old,
    insert,
    insert_one,
    insert_visible,
    make_room,
    oldest_age,
    received,
    rows_by_id,
    settle,
)
from .txn import Row, Txn, chunks, id_run, ids_in, in_list, marks


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
    delete_all(t, q)
    conn.execute("DELETE FROM fairq_fifo_heads WHERE queue_id = ?", (q.id,))
    conn.execute("DELETE FROM fairq_dedup WHERE queue_id = ?", (q.id,))
    conn.execute("DELETE FROM fairq_subscriptions WHERE queue_id = ?", (q.id,))
    conn.execute("DELETE FROM fairq_lazy WHERE queue_id = ?", (q.id,))
    t.store.lazy.discard(q.id)
    conn.execute("DELETE FROM fairq_queues WHERE id = ?", (q.id,))
    t.configs_changed()
    t.op_notify.add(name)
    return True


def send(t: Txn, name: str, envs: list[Envelope]) -> list[str]:
    q = t.queue(name)
    cfg = q.config
    if cfg.max_length is None and not cfg.fifo:
        if len(envs) == 1:
            env = envs[0]
            if env.dedup_id is None and not env.delay and not env.priority and env.group is None:
                return [format_id(insert_one(t, q, env.body, blob_of(env.attributes)))]
        elif all(
            e.dedup_id is None and not e.delay and not e.priority and e.group is None for e in envs
        ):
            # the common batch: visible now, priority 0, nothing to deduplicate or order
            return [f"{m:016x}" for m in insert_visible(t, q, envs)]
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
    made = insert(
        t, q, [(e.body, blob_of(e.attributes), e.delay, e.priority, e.group) for e in fresh]
    )
    if plan.first and cfg.dedup_window > 0:
        expires = now + cfg.dedup_window
        conn.executemany(
            "INSERT OR REPLACE INTO fairq_dedup (queue_id, dedup_id, msg_id, expires_at) "
            "VALUES (?, ?, ?, ?)",
            [(q.id, d, made[i], expires) for d, i in plan.first.items()],
        )
    return plan.answer(made)


# a receive's lease of the rows it takes ...
_LEASE = (
    "UPDATE fairq_messages SET state = 1, avail_at = ?, attempt = attempt + 1, lease = ? "
    "WHERE id IN ({marks})"
)
# ... or, a small receive of a queue without priorities, in place (schema.sql, version 13):
# the row's ix_ready entry moves next to its queue's head, and no ix_waiting entry is made
_LEASE_IN_PLACE = (
    "UPDATE fairq_messages SET avail_at = ?, attempt = attempt + 1, lease = ? WHERE id IN ({marks})"
)
_REGISTER = "INSERT OR IGNORE INTO fairq_lazy (queue_id) VALUES (?)"
# ... or, a big receive of one run of ids (not FIFO), in state 3 (schema.sql, version 14): out
# of ix_ready and into no index, the run named in fairq_runs
_LEASE_RUN = (
    "UPDATE fairq_messages SET state = 3, avail_at = ?, attempt = attempt + 1, lease = ? "
    "WHERE id BETWEEN ? AND ?"
)
_RUN = "INSERT INTO fairq_runs (lease, lo, hi, until) VALUES (?, ?, ?, ?)"


def receive(t: Txn, name: str, n: int, visibility_timeout: float | None) -> list[Received]:
    q = t.queue(name)
    cfg = q.config
    cur = t.cur  # (the rows of each statement are read at once)
    now = t.now
    cutoff = int((now - cfg.retention) * 1000) << 16
    until = now + (cfg.visibility_timeout if visibility_timeout is None else visibility_timeout)
    # a few messages of a plain queue: the receive leaves its counters to messages.settle
    # (the lease's end kept negated until then), one B-tree page fewer per commit; of a queue
    # without priorities it leases the rows in place, one more page fewer
    # (its end negated must stay below -1, where the acked rows' marks are: a clock at 0)
    lazy = n < LAZY_BELOW and not cfg.fifo and until > 2
    flat = cfg.max_priority == 0
    select = SELECT_READY_FLAT if flat else SELECT_READY
    new = t.store.new_formats or t.new_formats()
    in_place = lazy and flat and until < LEASED_OFFSET - 2 and new
    runs = not lazy and not cfg.fifo and new
    out: list[Received] = []
    while len(out) < n:
        lease = new_lease()
        # read, then lease: one UPDATE ... WHERE id = (SELECT ...) RETURNING measured 3x
        # slower than the two statements, on a 20,000-deep queue
        # (id, priority, attempt, grp, body, attrs): only what a delivery needs
        rows = cur.execute(select, (q.id, n - len(out))).fetchall()
        if not rows:
            break
        ids = [r[0] for r in rows]
        if min(ids) < cutoff:  # past retention: never delivered
            stale = [mid for mid in ids if mid < cutoff]
            dead_letter_rows(t, q, rows_by_id(t, stale), "expired")
            rows = [r for r in rows if r[0] >= cutoff]
            if not rows:
                continue
            ids = [r[0] for r in rows]
        qid = q.id
        if in_place:
            cur.execute(in_list(_LEASE_IN_PLACE, len(ids)), (until - LEASED_OFFSET, lease, *ids))
            lazy_queues = t.store.lazy
            if qid not in lazy_queues:  # (settle finds the rows through fairq_lazy)
                cur.execute(_REGISTER, (qid,))
                lazy_queues.add(qid)
        elif runs and (run := id_run(ids)) is not None:
            cur.execute(_LEASE_RUN, (until, lease, *run))
            cur.execute(_RUN, (lease, *run, until))
        else:  # (when runs, id_run has just found no run: the list, without asking again)
            sql, matched = (in_list(_LEASE, len(ids)), ids) if runs else ids_in(_LEASE, ids)
            cur.execute(sql, (-until if lazy else until, lease, *matched))
        t.waiting_until(until)
        k = len(rows)
        if lazy:
            t.store.unsettled += k
        else:
            t.add(qid, "visible", -k)
            t.add(qid, "in_flight", k)
        redelivered = 0
        tail = f".{lease:x}"
        loads = orjson.loads
        for mid, prio, attempt, grp, body, attrs in rows:
            attempt += 1
            if attempt > 1:
                redelivered += 1
            hid = mid.to_bytes(8, "big").hex()  # format_id(mid) in half the time
            out.append(
                Received(
                    hid,
                    body,
                    loads(attrs) if attrs else {},
                    attempt,
                    (mid >> 16) / 1000.0,
                    prio,
                    grp,
                    hid + tail,
                    name,
                )
            )
        if not lazy:
            t.add(qid, "redelivered", redelivered)
    return out


def ack(t: Txn, name: str, receipts: list[str]) -> list[str]:
    return ack_leased(t, t.queue(name), receipts)[1]


def ack_receive(
    t: Txn, name: str, receipts: list[str], n: int, visibility_timeout: float | None
) -> tuple[list[str], list[Received]]:
    """An ack, then a receive, in one transaction (a worker's consumer: the acks of the
    handlers that freed its slots, and the messages for those slots)."""
    lost = ack_leased(t, t.queue(name), receipts)[1]
    return lost, receive(t, name, n, visibility_timeout)


def nack(t: Txn, name: str, receipt: str, delay: float, error: str | None = None) -> None:
    q = t.queue(name)
    rows, lost = current_leases(t, q, [receipt], full=True)
    if lost:
        raise LeaseLost(lost)
    (r,) = rows
    t.add(q.id, "nacked", 1)
    cfg = q.config
    if cfg.max_attempts is not None and r[ATTEMPT] >= cfg.max_attempts:
        dead_letter_rows(t, q, rows, "max_attempts", error)
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
    rows, lost = current_leases(t, q, receipts)
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
    rows, lost = current_leases(t, q, receipts)
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
    rows, lost = current_leases(t, q, [receipt], full=True)
    if lost:
        raise LeaseLost(lost)
    dead_letter_rows(t, q, rows, "rejected", reason)


def stats(t: Txn, name: str) -> QueueStats:
    q = t.queue(name)
    settle(t)
    expire_old(t, q)
    t.fold(q.id)
    t.flush()
    row = t.conn.execute(
        "SELECT visible, delayed, in_flight, "
        + ", ".join(QUEUE_COUNTERS)
        + " FROM fairq_queues WHERE id = ?",
        (q.id,),
    ).fetchone()
    oldest = oldest_age(t, q.id)
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
    settle(t)  # what is purged was not acked
    t.fold(q.id)  # and was sent
    n = delete_all(t, q)
    conn.execute("DELETE FROM fairq_fifo_heads WHERE queue_id = ?", (q.id,))
    t.flush()
    conn.execute(
        "UPDATE fairq_queues SET visible = 0, delayed = 0, in_flight = 0 WHERE id = ?", (q.id,)
    )
    t.op_notify.add(name)
    return n


def peek(t: Txn, name: str, limit: int) -> list[Received]:
    q = t.queue(name)
    settle(t)
    rows = t.conn.execute(
        "SELECT " + COLS + " FROM fairq_messages WHERE queue_id = ? ORDER BY id LIMIT ?",
        (q.id, limit),
    ).fetchall()
    return [received(r, name, "", r[ATTEMPT]) for r in rows]


def redrive(t: Txn, name: str, to: str | None, limit: int, after: int) -> tuple[int, int | None]:
    """Move up to ``limit`` messages with ids above ``after``, oldest first; return how many
    moved and the last id looked at (None when nothing is left to look at)."""
    q = t.queue(name)
    target_fixed = t.queue(to) if to is not None else None
    settle(t)  # a row leased in place is in state 0 until then
    rows = t.conn.execute(
        "SELECT " + COLS + " FROM fairq_messages WHERE queue_id = ? AND id > ? AND state != 1 "
        "ORDER BY id LIMIT ?",
        (q.id, after, limit),
    ).fetchall()
    by_target: dict[str, list[Row]] = {}
    for r in rows:
        target = target_fixed
        if target is None:
            source = attrs_of(r[ATTRS]).get("fairq.source")
            target = t.find(source) if source else None
        if target is None or target.id == q.id:
            continue  # its source queue is gone: it stays
        by_target.setdefault(target.name, []).append(r)
    moved = 0
    for target_name, moving in by_target.items():
        target = t.queue(target_name)
        delete(t, q, moving)
        top = target.config.max_priority
        insert(
            t,
            target,
            [
                (
                    r[BODY],
                    blob_of(redrive_attributes(attrs_of(r[ATTRS]))),
                    0.0,
                    min(r[PRIO], top),
                    r[GRP],
                )
                for r in moving
            ],
        )
        moved += len(moving)
    return moved, (rows[-1][ID] if len(rows) == limit else None)


def drop_expired_dedup(t: Txn) -> None:
    t.conn.execute("DELETE FROM fairq_dedup WHERE expires_at <= ?", (t.now,))
    t.conn.execute("DELETE FROM fairq_topic_dedup WHERE expires_at <= ?", (t.now,))
    idempotency.drop_expired(t)
