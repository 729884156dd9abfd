"""Where one message's send and receive+ack go on SQLite: fairq's own Python (every SQL
statement answered by a stub), and the raw SQL of fairq's schema beside leaner variants
(docs/benchmarks.md, issue 14's sixth round).

    python -m bench.sqlite_hotpath python               # fairq's Python per operation
    python -m bench.sqlite_hotpath floor --dir /dev/shm  # the SQL of each schema variant
    python -m bench.sqlite_hotpath bodies --rounds 5     # a (queue, id)-keyed table by body size

Each figure is the minimum over ``--rounds`` rounds of ``--n`` operations, in CPU time of
the calling thread, so the machine's noise (other tenants of the host) moves it least; pin
the process to one core (``taskset -c 1``) for steadier figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import fairq

BODY = os.urandom(100).hex().encode()  # 200 bytes, as in bench.queues


# -- fairq's Python, the SQL stubbed out -----------------------------------------------------
class _Rows:
    __slots__ = ("rowcount", "rows")

    def __init__(self, rows: list[tuple[Any, ...]], rowcount: int = 0) -> None:
        self.rows = rows
        self.rowcount = rowcount  # 0 unless given: the inbox's drain moves no row

    def fetchall(self) -> list[tuple[Any, ...]]:
        return self.rows

    def fetchone(self) -> tuple[Any, ...] | None:
        return self.rows[0] if self.rows else None

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return iter(self.rows)


class _StubConnection:
    """Answers the statements of a plain queue's send, receive and ack with canned rows
    (one message that is always there); anything else goes to the real connection."""

    def __init__(self, real: sqlite3.Connection) -> None:
        self.real = real
        self.in_transaction = False
        self.lease = 0
        self.msg_id = int(time.time() * 1000) << 16
        self.data_version = real.execute("PRAGMA data_version").fetchall()

    def execute(self, sql: str, params: Sequence[Any] = ()) -> _Rows:
        if sql.startswith("PRAGMA data_version"):
            return _Rows(self.data_version)
        if sql.startswith("SELECT id, priority"):
            return _Rows([(self.msg_id, 0, 0, None, BODY, None)])
        if sql.startswith("UPDATE fairq_messages SET state = 1"):
            self.lease = params[1]
            return _Rows([])
        if sql.startswith(  # an ack: marked (schema 12: the lease; before: the due time)
            ("UPDATE fairq_messages SET lease = -1", "UPDATE fairq_messages SET avail_at = CASE")
        ):
            # (an ack of one message reads the row count, of more the RETURNING rows)
            return _Rows([(self.msg_id,)], 1)
        if sql.startswith(
            (
                "UPDATE fairq_messages SET avail_at = -avail_at",
                "DELETE FROM fairq_messages WHERE state = 1 AND avail_at >= -1",
                "DELETE FROM fairq_messages WHERE state = 1 AND avail_at < -1",
            )
        ):
            return _Rows([])  # settling (every 256 receives and acks): nothing under the stub
        if sql.startswith("DELETE FROM fairq_messages"):
            return _Rows(
                [(self.msg_id, None, None, None)]
            )  # a big ack (id, body_ref, grp, attempt)
        if sql.startswith(("BEGIN", "COMMIT", "UPDATE", "INSERT")):
            return _Rows([])
        return _Rows(self.real.execute(sql, params).fetchall())

    def executemany(self, sql: str, rows: Any) -> _Rows:
        for _ in rows:  # consume them, as SQLite would
            pass
        return _Rows([])

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


async def _python_cost(n: int, rounds: int) -> tuple[float, float]:
    tmp = tempfile.mkdtemp(prefix="fairq-hotpath-")
    try:
        broker = await fairq.connect("sqlite:///" + os.path.join(tmp, "q.db"))
        q = await broker.declare_queue("bench")
        await q.send(BODY)
        await q.stats()  # the queue's counts known: no fold query under the stub
        writer = broker.backend._writer  # type: ignore[attr-defined]
        real, real_cur = writer.conn, writer.cur
        writer.conn = writer.cur = _StubConnection(real)
        sends, cycles = [], []
        try:
            for _ in range(rounds):
                t0 = time.thread_time()
                for _ in range(n):
                    await q.send(BODY)
                sends.append((time.thread_time() - t0) / n)
                t0 = time.thread_time()
                for _ in range(n):
                    (m,) = await q.receive()
                    await m.ack()
                cycles.append((time.thread_time() - t0) / n)
        finally:
            writer.conn, writer.cur = real, real_cur
            await broker.close()
        return min(sends), min(cycles)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# -- the raw SQL of fairq's schema and of leaner ones ---------------------------------------
_QUEUES = (
    "CREATE TABLE q (id INTEGER PRIMARY KEY, visible INT DEFAULT 0, in_flight INT DEFAULT 0, "
    "acked INT DEFAULT 0); INSERT INTO q (id) VALUES (1);"
)
_COLUMNS = (
    "queue_id INT NOT NULL, state INT NOT NULL, priority INT NOT NULL, avail_at REAL NOT NULL, "
    "attempt INT NOT NULL, lease INT, grp TEXT, body_ref INT, body BLOB, attrs BLOB"
)
_ROWID = f"CREATE TABLE m (id INTEGER PRIMARY KEY, {_COLUMNS});"
_CLUSTERED = (
    f"CREATE TABLE m (id INTEGER NOT NULL, {_COLUMNS}, PRIMARY KEY (queue_id, id)) WITHOUT ROWID;"
)
_READY = "CREATE INDEX ix_ready ON m (queue_id, priority DESC, avail_at) WHERE state = 0;"
_WAITING = "CREATE INDEX ix_waiting ON m (avail_at) WHERE state = 1;"
_PER_QUEUE = "CREATE INDEX ix_queue ON m (queue_id);"

_FAIRQ = _ROWID + _READY + _WAITING + _PER_QUEUE
_SETTLE_ROWS = 256  # as fairq's writer (backends/sqlite/writer.py)

# how receive and ack treat the counters: at once (an UPDATE of the queue's row in each),
# later (fairq since schema 10: the receive keeps its lease's end negated in state 1, the ack
# marks the row acked, a settle step every _SETTLE_ROWS counts both and deletes acked rows),
# in place (a study, not fairq: as later, but a leased row stays in state 0 — its entry in
# the delivery-order index moves to the front of its queue's range, most often on the same
# page — so a receive writes two B-tree pages instead of three; the receive seeks past
# those entries, and the settle step needs a small table naming the queues it must visit),
# or not at all
# or as schema 12 does it (later, plus: a one-message send appends to an inbox table with no
# index, moved into the message table every _SETTLE_ROWS sends and by the first receive; an
# ack of a receive not counted yet only sets the row's lease to -1, and settling deletes those)
# or schema 12 leased in place next to the head (a study: as schema 12, but a small receive
# leaves its row in state 0 with the lease's end kept as end - _HEAD_OFFSET, below every
# ready entry and above every older lease, so its delivery-order entry moves next to the
# queue's head, on the page the receive already writes; settling visits the queues the small
# table names)
AT_ONCE, LATER, IN_PLACE, NONE, INBOX = "at once", "later", "in place", "none", "inbox"
HEAD = "in place, next to the head"
_HEAD_OFFSET = 1e10
# name: (schema, counting)
_INBOX = (
    "CREATE TABLE inbox (id INTEGER PRIMARY KEY, queue_id INT NOT NULL, avail_at REAL NOT NULL, "
    "body BLOB, attrs BLOB);"
)
_DRAIN = (
    "INSERT INTO m (id, queue_id, state, priority, avail_at, attempt, body, attrs) "
    "SELECT id, queue_id, 0, 0, avail_at, 0, body, attrs FROM inbox ORDER BY id"
)
VARIANTS: dict[str, tuple[str, str]] = {
    "fairq's schema 12 (inbox, one-page acks)": (_FAIRQ + _INBOX, INBOX),
    "schema 12 leased next to the head (a study)": (_FAIRQ + _INBOX, HEAD),
    "fairq's schema, counted later (schema 10)": (_FAIRQ, LATER),
    "fairq's schema, counted at once (schema 9)": (_FAIRQ, AT_ONCE),
    "leased in place (a study)": (_FAIRQ, IN_PLACE),
    "without the per-queue index": (_ROWID + _READY + _WAITING, AT_ONCE),
    "without the counter updates": (_FAIRQ, NONE),
    "without both": (_ROWID + _READY + _WAITING, NONE),
    "WITHOUT ROWID (queue, id), no counters": (_CLUSTERED + _READY + _WAITING, NONE),
}


def _connect(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    for pragma in ("journal_mode = WAL", "synchronous = NORMAL", "wal_autocheckpoint = 0"):
        conn.execute(f"PRAGMA {pragma}")
    return conn


def _lease_end(counting: str, end: float) -> float:
    """A lease's end as a receive of one message stores it: negated while the receive is
    not counted yet (below -1), or, leased next to the head, less _HEAD_OFFSET (below
    every ready entry, and a later end above an earlier one)."""
    if counting == HEAD:
        return end - _HEAD_OFFSET
    return -end if counting in (LATER, IN_PLACE, INBOX) else end


def _settle(ex: Callable[..., sqlite3.Cursor], counting: str, held: int) -> None:
    """What the writer does every _SETTLE_ROWS receives and acks (messages.settle): count
    the leases not counted yet and delete the acked rows, with the queue's counters."""
    if counting == HEAD:
        where = "queue_id = ? AND state = 0 AND priority = 0 AND avail_at < -1"
        for (qid,) in ex("SELECT queue_id FROM lazy").fetchall():
            (k,) = ex(f"SELECT count(*) FROM m WHERE {where} AND lease = -1", (qid,)).fetchone()
            ex(f"DELETE FROM m WHERE {where} AND lease = -1", (qid,))
            moved = ex(
                f"UPDATE m SET state = 1, avail_at = avail_at + {_HEAD_OFFSET} "
                f"WHERE {where} RETURNING queue_id, attempt",
                (qid,),
            ).fetchall()
            ex(
                "UPDATE q SET visible = visible - ?, in_flight = in_flight + ?, "
                "acked = acked + ? WHERE id = ?",
                (k + len(moved), len(moved), k, qid),
            )
        ex("DELETE FROM lazy")
        return
    if counting == INBOX:  # as messages.settle: the acked rows counted, deleted, then leases
        settled = "state = 1 AND avail_at < 0 AND (avail_at >= -1 OR lease = -1)"
        groups = ex(
            "SELECT queue_id, body_ref, count(*), sum(avail_at != -1), "
            f"sum(avail_at != -1 AND attempt > 1), max(id) FROM m WHERE {settled} "
            "GROUP BY queue_id, body_ref"
        ).fetchall()
        ex(f"DELETE FROM m WHERE {settled}")
        moved = ex(
            "UPDATE m SET avail_at = -avail_at WHERE state = 1 AND avail_at < -1 "
            "RETURNING queue_id, attempt"
        ).fetchall()
        k = sum(g[2] for g in groups)
        ex(
            "UPDATE q SET visible = visible - ?, in_flight = in_flight + ?, acked = acked + ? "
            "WHERE id = 1",
            (k + len(moved), len(moved), k),
        )
        return
    if counting == IN_PLACE:
        ex("SELECT queue_id FROM lazy").fetchall()
        ex("DELETE FROM lazy")
        k = len(
            ex(
                "UPDATE m SET state = 1, avail_at = -avail_at WHERE queue_id = 1 "
                "AND state = 0 AND priority = 0 AND avail_at < -1 "
                "RETURNING queue_id, attempt"
            ).fetchall()
        )
    else:
        k = len(
            ex(
                "UPDATE m SET avail_at = -avail_at WHERE state = 1 AND avail_at < -1 "
                "RETURNING queue_id, attempt"
            ).fetchall()
        )
    ex("UPDATE q SET visible = visible - ?, in_flight = in_flight + ? WHERE id = 1", (k, k))
    k = len(
        ex(
            f"DELETE FROM m WHERE state = {held} AND avail_at >= -1 AND avail_at < 0 "
            + ("AND queue_id = 1 AND priority = 0 " if held == 0 else "")
            + "RETURNING id, queue_id, body_ref, avail_at, attempt"
        ).fetchall()
    )
    ex("UPDATE q SET visible = visible - ?, acked = acked + ? WHERE id = 1", (k, k))


def _floor(directory: str, schema: str, counting: str, n: int) -> tuple[float, float, float, float]:
    """CPU seconds per one-message send and per receive+ack pair, as fairq issues them, and
    the WAL frames (B-tree pages) each writes: a count the machine's noise does not move."""
    tmp = tempfile.mkdtemp(prefix="fairq-floor-", dir=directory)
    conn = _connect(os.path.join(tmp, "f.db"))
    later = counting in (LATER, IN_PLACE, INBOX, HEAD)
    inbox = counting in (INBOX, HEAD)
    in_place = counting in (IN_PLACE, HEAD)
    try:
        conn.executescript(_QUEUES + schema)
        if in_place:
            conn.execute("CREATE TABLE lazy (queue_id INTEGER PRIMARY KEY)")
        ex = conn.execute
        base = int(time.time() * 1000) << 16
        t0 = time.thread_time()
        insert = (
            "INSERT INTO inbox (id, queue_id, avail_at, body) VALUES (?, 1, ?, ?)"
            if inbox
            else "INSERT INTO m (id, queue_id, state, priority, avail_at, attempt, body) "
            "VALUES (?, 1, 0, 0, ?, 0, ?)"
        )
        for i in range(n):
            ex("BEGIN IMMEDIATE")
            ex("PRAGMA data_version").fetchone()
            if inbox and i % _SETTLE_ROWS == _SETTLE_ROWS - 1:  # a producer alone drains it
                ex(_DRAIN)
                ex("DELETE FROM inbox")
            ex(insert, (base + i, time.time(), BODY))
            ex("COMMIT")
        send = (time.thread_time() - t0) / n
        # checkpoints are off, so the WAL holds every frame since it began; empty it
        sent_frames = ex("PRAGMA wal_checkpoint(PASSIVE)").fetchone()[1]
        ex("PRAGMA wal_checkpoint(TRUNCATE)")
        t0 = time.thread_time()
        unsettled = 0
        registered = False
        # the leased state, the one the receive takes from, and the ready rows' condition
        held, ready = (0, "AND priority = 0 AND avail_at >= 0") if in_place else (1, "")
        for i in range(n):
            now = time.time()
            ex("BEGIN IMMEDIATE")
            ex("PRAGMA data_version").fetchone()
            if inbox and i == 0:  # the first receive moves what the sends left in the inbox
                ex(_DRAIN)
                ex("DELETE FROM inbox")
            if later and unsettled >= _SETTLE_ROWS:  # settle: count leases, delete acked rows
                _settle(ex, counting, held)
                registered = False
                unsettled = 0
            if in_place and not registered:
                ex("INSERT OR IGNORE INTO lazy (queue_id) VALUES (1)")
                registered = True
            (row,) = ex(
                "SELECT id, priority, attempt, grp, body, attrs FROM m WHERE queue_id = 1 "
                f"AND state = 0 {ready} ORDER BY priority DESC, avail_at, id LIMIT 1"
            ).fetchall()
            ex(
                f"UPDATE m SET state = {held}, avail_at = ?, attempt = attempt + 1, lease = ? "
                "WHERE queue_id = 1 AND id = ?",
                (_lease_end(counting, now + 30), i + 1, row[0]),
            )
            if counting == AT_ONCE:
                ex("UPDATE q SET visible = visible - 1, in_flight = in_flight + 1 WHERE id = 1")
            ex("COMMIT")
            ex("BEGIN IMMEDIATE")
            ex("PRAGMA data_version").fetchone()
            if counting == HEAD:  # (the lease is current while its end is past now)
                gone = ex(
                    "UPDATE m SET lease = -1 WHERE queue_id = 1 AND id = ? AND lease = ? "
                    "AND avail_at < -1 AND avail_at > ? RETURNING id",
                    (row[0], i + 1, _lease_end(counting, now)),
                ).fetchall()
            elif inbox:
                gone = ex(
                    "UPDATE m SET lease = -1 WHERE queue_id = 1 AND id = ? AND lease = ? "
                    "AND avail_at < ? RETURNING id",
                    (row[0], i + 1, -now),
                ).fetchall()
            elif later:
                gone = ex(
                    "UPDATE m SET avail_at = CASE WHEN avail_at < 0 THEN -0.5 ELSE -1 END, "
                    "lease = NULL WHERE queue_id = 1 AND id = ? AND lease = ? "
                    "AND (avail_at > ? OR avail_at < ?) RETURNING id",
                    (row[0], i + 1, now, -now),
                ).fetchall()
            else:
                gone = ex(
                    "DELETE FROM m WHERE queue_id = 1 AND id = ? AND lease = ? AND avail_at > ? "
                    "RETURNING id",
                    (row[0], i + 1, now),
                ).fetchall()
            if not gone:
                raise RuntimeError("the ack found no lease")
            unsettled += 2
            if counting == AT_ONCE:
                ex("UPDATE q SET in_flight = in_flight - 1, acked = acked + 1 WHERE id = 1")
            ex("COMMIT")
        pair = (time.thread_time() - t0) / n
        pair_frames = ex("PRAGMA wal_checkpoint(PASSIVE)").fetchone()[1]
        return send, pair, sent_frames / n, pair_frames / n
    finally:
        conn.close()
        shutil.rmtree(tmp, ignore_errors=True)


# (body bytes, batch, messages) of the body-size comparison
_BODY_SHAPES = [
    (200, 1, 2000),
    (200, 100, 20000),
    (2000, 100, 10000),
    (20000, 1, 1000),
    (20000, 100, 2000),
]


def _bodies(directory: str, schema: str, size: int, batch: int, n: int) -> tuple[float, float]:
    """CPU seconds a message: batches of ``batch`` sends of ``size``-byte bodies, then
    receive-and-lease and delete by ids, batch by batch (no counters)."""
    tmp = tempfile.mkdtemp(prefix="fairq-floor-", dir=directory)
    conn = _connect(os.path.join(tmp, "b.db"))
    try:
        conn.executescript(_QUEUES + schema)
        ex = conn.execute
        body = os.urandom(size)
        base = int(time.time() * 1000) << 16
        t0 = time.thread_time()
        for k in range(0, n, batch):
            ex("BEGIN IMMEDIATE")
            conn.executemany(
                "INSERT INTO m (id, queue_id, state, priority, avail_at, attempt, body) "
                "VALUES (?, 1, 0, 0, ?, 0, ?)",
                [(base + k + i, time.time(), body) for i in range(batch)],
            )
            ex("COMMIT")
        send = (time.thread_time() - t0) / n
        t0 = time.thread_time()
        got = lease = 0
        while got < n:
            lease += 1
            now = time.time()
            ex("BEGIN IMMEDIATE")
            ids = [
                r[0]
                for r in ex(
                    "SELECT id, body FROM m WHERE queue_id = 1 AND state = 0 "
                    "ORDER BY priority DESC, avail_at, id LIMIT ?",
                    (batch,),
                )
            ]
            marks = ",".join("?" * len(ids))
            ex(
                f"UPDATE m SET state = 1, avail_at = ?, lease = ? WHERE queue_id = 1 "
                f"AND id IN ({marks})",
                (now + 30, lease, *ids),
            )
            ex("COMMIT")
            ex("BEGIN IMMEDIATE")
            ex(f"DELETE FROM m WHERE queue_id = 1 AND id IN ({marks}) AND lease = ?", (*ids, lease))
            ex("COMMIT")
            got += len(ids)
        return send, (time.thread_time() - t0) / n
    finally:
        conn.close()
        shutil.rmtree(tmp, ignore_errors=True)


def _peers(directory: str, n: int) -> tuple[float, float, float, float]:
    """huey's storage.enqueue, and dequeue (huey has no ack), at synchronous=NORMAL, as
    :func:`_floor` measures them."""
    from huey import SqliteHuey

    tmp = tempfile.mkdtemp(prefix="fairq-floor-huey-", dir=directory)
    try:
        storage = SqliteHuey(
            name="b", filename=os.path.join(tmp, "h.db"), journal_mode="wal"
        ).storage
        conn = storage.conn
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("PRAGMA wal_autocheckpoint = 0")
        t0 = time.thread_time()
        for _ in range(n):
            storage.enqueue(BODY)
        send = (time.thread_time() - t0) / n
        sent_frames = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()[1]
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        t0 = time.thread_time()
        for _ in range(n):
            storage.dequeue()
        taken = (time.thread_time() - t0) / n
        taken_frames = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()[1]
        return send, taken, sent_frames / n, taken_frames / n
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.sqlite_hotpath", description=__doc__)
    p.add_argument("what", choices=["python", "floor", "bodies"])
    p.add_argument("--n", type=int, default=2000, help="operations per round")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--dir", default=tempfile.gettempdir(), help="where the floor's files go")
    a = p.parse_args(argv)
    if a.what == "python":
        send, cycle = asyncio.run(_python_cost(a.n, a.rounds))
        print(f"fairq's Python: send {send * 1e6:.1f} µs, receive+ack {cycle * 1e6:.1f} µs")
        return 0
    if a.what == "bodies":  # a table keyed by (queue, id) against fairq's, by body size
        shapes = {"rowid + per-queue index": _FAIRQ}
        shapes["WITHOUT ROWID (queue, id)"] = _CLUSTERED + _READY + _WAITING
        print(f"{'body, batch':14s}" + "".join(f"{k + ' send / recv+ack':>48s}" for k in shapes))
        for size, batch, n in _BODY_SHAPES:
            runs: dict[str, list[tuple[float, float]]] = {k: [] for k in shapes}
            for _ in range(a.rounds):  # interleaved, so noise hits both alike
                for k, v in shapes.items():
                    runs[k].append(_bodies(a.dir, v, size, batch, n))
            cells = [
                f"{min(r[0] for r in v) * 1e6:10.1f} µs {min(r[1] for r in v) * 1e6:10.1f} µs"
                for v in runs.values()
            ]
            print(f"{f'{size} B, {batch}':14s}" + "".join(f"{c:>48s}" for c in cells))
        return 0
    results: dict[str, list[tuple[float, float, float, float]]] = {}
    for _ in range(a.rounds):  # the variants interleaved, so noise hits them alike
        for name, (schema, counting) in VARIANTS.items():
            results.setdefault(name, []).append(_floor(a.dir, schema, counting, a.n))
        with contextlib.suppress(ImportError):  # huey is a bench extra
            results.setdefault("huey enqueue / dequeue (no ack)", []).append(_peers(a.dir, a.n))
    print(
        f"{'variant':42s} {'send':>10s} {'recv+ack':>10s}   (min; median) in {a.dir}"
        "   WAL frames: send, recv+ack"
    )
    for name, measured in results.items():
        sends, cycles = [r[0] * 1e6 for r in measured], [r[1] * 1e6 for r in measured]
        print(
            f"{name:42s} {min(sends):8.1f} µs {min(cycles):8.1f} µs   "
            f"({statistics.median(sends):.1f}; {statistics.median(cycles):.1f})"
            f"   {statistics.median(r[2] for r in measured):.2f}, "
            f"{statistics.median(r[3] for r in measured):.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
