"""One write transaction of the SQLite backend, and what a connection remembers between
transactions (the queue and topic caches, the last id, the earliest due time).

The backend (``__init__.py``) runs every operation inside a :class:`Txn`; the
operations themselves are in ``queues.py`` and ``topics.py``; the schema, and what the
message states mean, in ``schema.sql``.
"""

from __future__ import annotations

import logging
import math
import sqlite3
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

import orjson

from ...errors import AttentionNotFound, BackendError, FairqError, QueueNotFound, TopicNotFound
from ...message import next_id_base
from ...model.attention import AttentionConfig
from ...model.queues import QueueConfig
from ...model.topics import Subscription, SubscriptionIndex, TopicConfig

log = logging.getLogger("fairq.sqlite")

SCHEMA_VERSION = 14
# seconds after an upgrade to schema 12, 13 or 14 before a writer uses their new row formats
# (the inbox, ACKED_LEASE, rows leased in place, state 3): four times the 0.5 s within which
# a process of an older fairq stops writing
FORMATS_GRACE = 2.0
CHUNK = 500  # ids per IN (...) list, well under SQLite's variable limit
Row = tuple[Any, ...]
# the greatest id handed out so far, as far as the file remembers it (see Store)
_LAST_ID = (
    "SELECT (SELECT value FROM fairq_meta WHERE key = 'last_id'), "
    "max(coalesce((SELECT max(id) FROM fairq_messages), 0), "
    "coalesce((SELECT max(id) FROM fairq_inbox), 0))"
)
# the inbox (schema.sql, version 12) moved into fairq_messages: its rows as visible messages
# of priority 0 that were never delivered (a row of a queue deleted since is dropped)
_DRAIN = (
    "INSERT INTO fairq_messages (id, queue_id, state, priority, avail_at, attempt, body, attrs) "
    "SELECT id, queue_id, 0, 0, avail_at, 0, body, attrs FROM fairq_inbox "
    "WHERE queue_id IN (SELECT id FROM fairq_queues) ORDER BY id"
)


# a visible message of priority 0 never delivered, as a row of fairq_messages: a batch's
# messages, and an inbox row moved under a new id (Txn._drain_clashing)
INSERT_VISIBLE = (
    "INSERT INTO fairq_messages (id, queue_id, state, priority, avail_at, attempt, body, attrs) "
    "VALUES (?, ?, 0, 0, ?, 0, ?, ?)"
)


def in_list(sql: str, n: int, _cache: dict[tuple[str, int], str] = {}) -> str:  # noqa: B006
    """``sql`` with its ``{marks}`` replaced by ``n`` placeholders; each text is built once
    (a memo), so a statement on the hot path is not formatted on every call."""
    key = (sql, n)
    text = _cache.get(key)
    if text is None:
        text = _cache[key] = sql.replace("{marks}", marks(n))
    return text


SPAN_FROM = 16  # ids_in: a list of ids at least this long may be matched as a range


def id_run(ids: Sequence[int]) -> tuple[int, int] | None:
    """``(lo, hi)`` when ``ids`` are lo..hi, each once, and at least ``SPAN_FROM`` of them;
    else None. In order (a batch's rows, and its ack) it is one comparison in C; any other
    order is checked by its bounds and a set."""
    n = len(ids)
    if n < SPAN_FROM:
        return None
    lo = ids[0]
    hi = lo + n - 1
    if ids[-1] != hi or list(ids) != list(range(lo, hi + 1)):
        lo = min(ids)
        hi = max(ids)
        if hi - lo + 1 != n or len(set(ids)) != n:
            return None
    return lo, hi


def ids_in(
    sql: str,
    ids: Sequence[int],
    _cache: dict[str, str] = {},  # noqa: B006 - deliberate memo
) -> tuple[str, Sequence[int]]:
    """``sql``, whose ``id IN ({marks})`` names ``ids``, and the parameters of that list:
    ``id BETWEEN ? AND ?`` and ``(lo, hi)`` when the ids are lo..hi, each once (the rows of
    a batch received in id order, and its ack); else the list (:func:`in_list`) and the
    ids. A range is one seek where a list is a temporary index of the values and a seek per
    id: 0.3-0.4 µs a row of a receive and its ack (tests/unit/test_sqlite_id_ranges.py)."""
    run = id_run(ids)
    if run is None:
        return in_list(sql, len(ids)), ids
    text = _cache.get(sql)
    if text is None:
        assert "id IN ({marks})" in sql, sql
        text = _cache[sql] = sql.replace("id IN ({marks})", "id BETWEEN ? AND ?")
    return text, run


def marks(n: int, _cache: dict[int, str] = {}) -> str:  # noqa: B006 - deliberate memo
    """``?,?,...`` with ``n`` placeholders."""
    s = _cache.get(n)
    if s is None:
        s = _cache[n] = ",".join("?" * n)
    return s


def chunks(items: Sequence[Any], size: int = CHUNK) -> Iterable[Sequence[Any]]:
    """``items`` in slices of at most ``size``."""
    for i in range(0, len(items), size):
        yield items[i : i + size]


_ROWS_AT_ONCE = 32  # rows per multi-row INSERT of insert_rows
_MULTI_SQL: dict[str, str] = {}


def insert_rows(conn: sqlite3.Connection, sql: str, rows: Sequence[Sequence[Any]]) -> None:
    """Run ``sql``, an ``INSERT ... VALUES (...)`` of one row, for every row: 32 rows at a
    time as one statement (``VALUES (...), (...), ...``), the rest with ``executemany``.
    One statement keeps its cursors open across its rows where ``executemany`` steps the
    statement again per row: 1.8 against 3.0 µs a row on fairq's message table."""
    n = len(rows)
    k = _ROWS_AT_ONCE
    if n < k:
        if n == 1:
            conn.execute(sql, rows[0])
        elif n:
            conn.executemany(sql, rows)
        return
    multi = _MULTI_SQL.get(sql)
    if multi is None:
        head, _, values = sql.partition(" VALUES ")
        multi = _MULTI_SQL[sql] = f"{head} VALUES " + ", ".join([values] * k)
    full = n - n % k
    for i in range(0, full, k):
        conn.execute(multi, [v for row in rows[i : i + k] for v in row])
    if full < n:
        conn.executemany(sql, rows[full:])


# columns added to tables that older files already have (CREATE TABLE IF NOT EXISTS does
# not touch an existing table): (table, column, declaration), with the version that added it
ADDED_COLUMNS = [
    ("fairq_messages", "body_ref", "INTEGER"),  # 6: bodies shared by copies
    ("fairq_att_domains", "vclock", "REAL NOT NULL DEFAULT 0"),  # 8: worker-time scheduler
    ("fairq_att_domains", "estimate", "REAL"),
    ("fairq_att_tenants", "vt", "REAL NOT NULL DEFAULT 0"),
    ("fairq_att_tenants", "estimate", "REAL"),
    ("fairq_att_slices", "tenant", "TEXT"),
    ("fairq_att_slices", "charged", "REAL NOT NULL DEFAULT 0"),
    ("fairq_att_slices", "taken_at", "REAL"),
    ("fairq_queues", "sent_upto", "INTEGER NOT NULL DEFAULT 0"),  # 9: sends counted later
    ("fairq_att_slices", "counted", "INTEGER NOT NULL DEFAULT 0"),  # 11: counted on the way
]


def _add_missing_columns(conn: sqlite3.Connection) -> None:
    """Add ADDED_COLUMNS to the tables of an older file (a table it lacks is created whole
    by schema.sql): before the script, whose indexes may name the new columns."""
    for table, column, declaration in ADDED_COLUMNS:
        have = {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
        if have and column not in have:
            conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {declaration}")


def check_schema(conn: sqlite3.Connection, path: str) -> None:
    """``BackendError`` when a newer fairq upgraded the file since this process opened it
    (the writer's checkpointer thread asks every 0.5 s; the writer then refuses)."""
    row = conn.execute("SELECT value FROM fairq_meta WHERE key = 'schema_version'").fetchone()
    version = int(row[0]) if row else 0
    if version > SCHEMA_VERSION:
        raise BackendError(
            f"sqlite:///{path} was upgraded by a newer fairq (schema {version}; this process "
            f"knows {SCHEMA_VERSION}) while this process ran: it writes nothing more — "
            "restart it with the newer fairq"
        )


def apply_schema(conn: sqlite3.Connection) -> None:
    """Create or upgrade the tables (every statement of schema.sql is idempotent); refuse
    a file written by a newer fairq."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        has_meta = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'fairq_meta'"
        ).fetchone()
        version = 0
        if has_meta:
            row = conn.execute(
                "SELECT value FROM fairq_meta WHERE key = 'schema_version'"
            ).fetchone()
            version = int(row[0]) if row else 0
        if version > SCHEMA_VERSION:
            raise FairqError(
                f"this database was written by a newer fairq (schema {version}, this fairq "
                f"knows {SCHEMA_VERSION}); upgrade fairq"
            )
        if version < SCHEMA_VERSION:
            # schema.sql is additive and idempotent: running it upgrades any older file
            script = resources.files(__package__).joinpath("schema.sql").read_text("utf-8")
            script = "\n".join(line.split("--", 1)[0] for line in script.splitlines())
            _add_missing_columns(conn)
            for statement in script.split(";"):
                if statement.strip():
                    conn.execute(statement)
            if 0 < version < SCHEMA_VERSION:
                # a process of the older fairq may write for up to 0.5 s more (it looks at
                # the schema version that often, writer._SCHEMA_LOOKS): it would take the
                # inbox's ids, read an ACKED_LEASE row as a live lease and a row leased in
                # place as ready, so those formats wait until it has stopped
                # (Store.formats_from)
                conn.execute(
                    "INSERT OR REPLACE INTO fairq_meta (key, value) VALUES ('formats_from', ?)",
                    (time.time() + FORMATS_GRACE,),
                )
            if version < 9:
                # older fairqs counted every send at once: every stored message is counted
                conn.execute(
                    "UPDATE fairq_queues SET sent_upto = "
                    "(SELECT coalesce(max(id), 0) FROM fairq_messages)"
                )
            conn.executemany(
                "INSERT OR IGNORE INTO fairq_meta (key, value) VALUES (?, ?)",
                [("last_id", 0), ("config_version", 0)],
            )
            conn.execute(
                "INSERT OR REPLACE INTO fairq_meta (key, value) VALUES ('schema_version', ?)",
                (SCHEMA_VERSION,),
            )
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


@dataclass(slots=True)
class QueueRow:
    id: int
    name: str
    config: QueueConfig


@dataclass(slots=True)
class TopicRow:
    id: int
    name: str
    config: TopicConfig
    subs: dict[str, Subscription]
    _index: SubscriptionIndex | None = None

    def index(self) -> SubscriptionIndex:
        if self._index is None:
            self._index = SubscriptionIndex(self.subs.values())
        return self._index


@dataclass(slots=True)
class DomainRow:
    id: int
    name: str
    config: AttentionConfig


class Store:
    """What one connection knows between its transactions.

    While no other connection commits (``PRAGMA data_version`` unchanged), the queue
    cache, the last message id and the earliest due time stay true, which saves a few
    statements per transaction; any commit elsewhere makes the next transaction re-read.

    Ids are never handed out twice. The last one is not written on every send: a new id
    is above every id still stored in ``fairq_messages`` or the inbox (each table's greatest
    rowid is one probe)
    and above ``fairq_meta.last_id``, which is only brought up to date by a transaction
    that deletes a message above it (or hands out ids that no message row keeps, as a
    publish does), so a deleted message's id cannot come back either.
    """

    def __init__(self) -> None:
        self.by_name: dict[str, QueueRow] = {}
        self.by_id: dict[int, QueueRow] = {}
        self.topics: dict[str, TopicRow] = {}
        self.domains: dict[str, DomainRow] = {}
        self.config_version = -1
        self.last_id: int | None = None
        self.saved_id: int | None = None  # fairq_meta.last_id as last read or written
        self.due = -math.inf  # earliest avail_at of a waiting row, -inf: unknown
        self.data_version: int | None = None
        # queue id -> (its fairq_queues.sent_upto, then how many messages this connection
        # stored above it, and the greatest of their ids): what Txn.fold adds without a
        # query, while no other connection commits
        self.uncounted: dict[int, tuple[int, int, int]] = {}
        # due times of the delayed attention signals this connection wrote, per domain: its
        # broker takes those on time, other processes a moment later (attention._take)
        self.scheduled: dict[str, dict[float, None]] = {}
        # small receives and acks this connection left uncounted, and when it last settled
        # (messages.settle): what tells the writer when to settle again
        self.unsettled = 0
        self.settled_at = -math.inf
        # queues this connection named in fairq_lazy since it last settled (schema 13): a
        # small receive adds its queue only when it is not here
        self.lazy: set[int] = set()
        # queues whose big acks last met rows that a plain DELETE cannot settle (a shared
        # body or a group): their next big ack goes straight to the DELETE ... RETURNING
        # (messages.ack_leased)
        self.returning_acks: set[int] = set()
        # rows this connection appended to fairq_inbox since it last drained it, and whether
        # the inbox may hold rows it does not know of (another connection committed, or a
        # drain was rolled back): Txn.drain looks only then
        self.inbox = 0
        self.inbox_unknown = True
        # when this file's writers may use schema 12's row formats (apply_schema), and
        # whether that time has come
        self.formats_from = 0.0
        self.new_formats = False

    def schedule(self, domain: str, due: float, now: float) -> None:
        """Remember that this connection wrote a delayed signal of ``domain`` due at ``due``."""
        dues = self.scheduled.setdefault(domain, {})
        dues[due] = None
        if len(dues) > 1000:  # forget what came due long ago (insertion order ~ due order)
            for old in [x for x in dues if x < now - 60.0]:
                del dues[old]

    def forget_queues(self) -> None:
        """Forget the cached queue and topic definitions."""
        self.by_name.clear()
        self.by_id.clear()
        self.topics.clear()
        self.domains.clear()
        self.config_version = -1
        self.uncounted.clear()
        self.inbox_unknown = True  # (a failed operation may have undone a drain)

    def forget(self) -> None:
        """Trust nothing cached (after a rolled-back transaction)."""
        self.forget_queues()
        self.last_id = None
        self.saved_id = None
        self.due = -math.inf
        self.data_version = None
        self.lazy.clear()


_COUNTER_SQL: dict[tuple[str, ...], str] = {}


def _counter_sql(columns: tuple[str, ...]) -> str:
    """The UPDATE that adds deltas to these counters of one queue (one SQL text per set of
    columns, so the connection's statement cache keeps each prepared)."""
    sql = _COUNTER_SQL.get(columns)
    if sql is None:
        sets = ", ".join(
            "sent_upto = max(sent_upto, ?)" if c == "sent_upto" else f"{c} = {c} + ?"
            for c in columns
        )
        sql = _COUNTER_SQL[columns] = f"UPDATE fairq_queues SET {sets} WHERE id = ?"
    return sql


class Txn:
    """One write transaction: its clock reading, id allocator and per-operation bookkeeping
    (counter deltas, queues to wake) that a failed operation throws away."""

    __slots__ = (
        "_deleted_top",
        "_deltas",
        "_last_id_dirty",
        "conn",
        "cur",
        "notify",
        "now",
        "op_notify",
        "store",
    )

    def __init__(
        self,
        store: Store,
        conn: sqlite3.Connection,
        now: float,
        cur: sqlite3.Cursor | None = None,
    ) -> None:
        self.store = store
        self.conn = conn
        # a cursor of conn kept for the hot statements (the writer's: Writer.cur); only
        # for statements whose rows are read at once, before the next one runs on it
        self.cur = conn.cursor() if cur is None else cur
        self.now = now
        self.notify: set[str] = set()
        self.op_notify: set[str] = set()
        self._deltas: dict[int, dict[str, int]] = {}
        self._last_id_dirty = False
        self._deleted_top = 0
        (data_version,) = self.cur.execute("PRAGMA data_version").fetchone()
        if data_version != store.data_version:
            # another connection committed: its ids, delays and leases are unknown here
            store.data_version = data_version
            store.last_id = None
            store.saved_id = None
            store.due = -math.inf
            store.uncounted.clear()
            store.inbox_unknown = True
            store.lazy.clear()  # (another connection may have settled and emptied fairq_lazy)
            (version,) = conn.execute(
                "SELECT value FROM fairq_meta WHERE key = 'config_version'"
            ).fetchone()
            if version != store.config_version:
                store.forget_queues()
                store.config_version = version

    # -- ids ---------------------------------------------------------------------------
    def _read_last_id(self) -> int:
        store = self.store
        saved, top = self.conn.execute(_LAST_ID).fetchone()
        store.saved_id = int(saved)
        # rows this transaction deleted may have held the greatest id (Txn.deleted)
        store.last_id = max(int(saved), int(top), self._deleted_top)
        return store.last_id

    def allocate(self, n: int, stored: bool = False) -> range:
        """``n`` new ids, in order. ``stored``: the caller stores each as a
        ``fairq_messages`` row in this transaction, so nothing else need remember them."""
        store = self.store
        last = store.last_id
        if last is None:
            last = self._read_last_id()
        base = next_id_base(last, self.now)
        store.last_id = base + n - 1
        if not stored:
            self._last_id_dirty = True
        return range(base, base + n)

    def deleted(self, top: int) -> None:
        """Message rows up to id ``top`` were deleted: ``fairq_meta.last_id`` keeps ids
        above it (the greatest id may have been among them, and this connection may not
        know the greatest id handed out: :meth:`finish` then reads what is left)."""
        saved = self.store.saved_id
        if saved is None or top > saved:
            self._last_id_dirty = True
            if top > self._deleted_top:
                self._deleted_top = top

    def waiting_until(self, avail_at: float) -> None:
        """A row became waiting until ``avail_at``: the sweep must look again by then."""
        if avail_at < self.store.due:
            self.store.due = avail_at

    # -- counters ----------------------------------------------------------------------
    def add(self, queue_id: int, column: str, n: int) -> None:
        if n:
            d = self._deltas.get(queue_id)
            if d is None:
                d = self._deltas[queue_id] = {}
            d[column] = d.get(column, 0) + n

    def stored(self, queue_id: int, n: int, top: int) -> None:
        """``n`` new messages (ids up to ``top``) went into the queue. They are counted in
        ``sent`` and ``visible`` later, by :meth:`fold`: a single send then writes no
        counter row (one B-tree page fewer per commit). Until then they are the queue's
        rows with ids above ``fairq_queues.sent_upto``, which a crash or another process
        cannot lose."""
        known = self.store.uncounted.get(queue_id)
        if known is not None:
            self.store.uncounted[queue_id] = (known[0], known[1] + n, top)

    def new_formats(self) -> bool:
        """Whether this transaction may write the row formats of schemas 12 to 14 (the
        inbox, ``ACKED_LEASE``, rows leased in place, state 3): not in the first seconds
        after an older file was upgraded."""
        store = self.store
        if not store.new_formats and time.time() >= store.formats_from:
            store.new_formats = True
        return store.new_formats

    def drain(self) -> None:
        """Move the inbox's rows (one-message sends, schema.sql) into ``fairq_messages``:
        before every operation that is not a send (the writer) and before a queue's rows
        are counted (:meth:`fold`). Free when this connection knows the inbox is empty."""
        store = self.store
        if not store.inbox and not store.inbox_unknown:
            return
        conn = self.conn
        n, top = conn.execute("SELECT count(*), max(id) FROM fairq_inbox").fetchone()
        if n:
            try:
                moved = conn.execute(_DRAIN).rowcount
            except sqlite3.IntegrityError:
                moved = self._drain_clashing()
            if moved < n:  # rows of deleted queues: their ids must not come back either
                self.deleted(top)
            conn.execute("DELETE FROM fairq_inbox")  # all of it: no WHERE, no scan
        store.inbox = 0
        store.inbox_unknown = False

    def _drain_clashing(self) -> int:
        """The drain when an inbox row's id is taken in ``fairq_messages`` (a fairq older
        than schema 12, still running on the file after it was upgraded, handed that id
        out): such a row moves under a new id, rather than every transaction failing."""
        conn = self.conn
        rows = conn.execute(
            "SELECT id, queue_id, avail_at, body, attrs FROM fairq_inbox "
            "WHERE queue_id IN (SELECT id FROM fairq_queues) ORDER BY id"
        ).fetchall()
        taken: set[int] = set()
        for chunk in chunks([r[0] for r in rows]):
            taken.update(
                r[0]
                for r in conn.execute(
                    f"SELECT id FROM fairq_messages WHERE id IN ({marks(len(chunk))})", chunk
                )
            )
        fresh = iter(self.allocate(len(taken), stored=True))
        self.store.uncounted.clear()  # counted again by id (Txn.fold), new ids and all
        log.warning(
            "sqlite: %d message id(s) of the inbox were taken (an older fairq wrote to the "
            "file after its upgrade): those messages got new ids",
            len(taken),
        )
        insert_rows(
            conn,
            INSERT_VISIBLE,
            [(next(fresh) if r[0] in taken else r[0], *r[1:]) for r in rows],
        )
        return len(rows)

    def fold(self, queue_id: int) -> None:
        """Count the queue's messages stored since its counters were last brought up to
        date (``sent``, ``visible``): before its rows are deleted (they would be lost to
        the count) and before its counters are read. Free when this connection knows what
        it stored since; one index range count otherwise (another process committed)."""
        self.drain()
        store = self.store
        known = store.uncounted.get(queue_id)
        if known is None:
            upto, n, top = self.conn.execute(
                "SELECT q.sent_upto, count(m.id), max(m.id) FROM fairq_queues q "
                "LEFT JOIN fairq_messages m ON m.queue_id = q.id AND m.id > q.sent_upto "
                "WHERE q.id = ?",
                (queue_id,),
            ).fetchone()
            if upto is None:  # the queue is gone
                return
            top = top or upto
        else:
            upto, n, top = known
        if n:
            d = self._deltas.get(queue_id)
            if d is None:
                d = self._deltas[queue_id] = {}
            d["sent"] = d.get("sent", 0) + n
            d["visible"] = d.get("visible", 0) + n
            d["sent_upto"] = max(d.get("sent_upto", 0), top)
        store.uncounted[queue_id] = (top, 0, top)

    def flush(self) -> None:
        """Write this operation's counter deltas (inside its savepoint): one statement per
        set of counters, for however many queues changed them."""
        deltas = self._deltas
        if not deltas:
            return
        if len(deltas) == 1:
            ((qid, d),) = deltas.items()
            self.conn.execute(_counter_sql(tuple(d)), [*d.values(), qid])
            deltas.clear()
            return
        by_columns: dict[tuple[str, ...], list[list[int]]] = {}
        for qid, d in deltas.items():
            by_columns.setdefault(tuple(d), []).append([*d.values(), qid])
        for cols, rows in by_columns.items():
            sql = _counter_sql(cols)
            if len(rows) == 1:
                self.conn.execute(sql, rows[0])
            else:
                self.conn.executemany(sql, rows)
        deltas.clear()

    def op_done(self) -> None:
        if self._deltas:
            self.flush()
        if self.op_notify:
            self.notify |= self.op_notify
            self.op_notify.clear()

    def op_failed(self) -> None:
        self._deltas.clear()
        self.op_notify.clear()
        self.store.lazy.clear()  # a fairq_lazy row it added is undone with it
        self.store.forget_queues()  # the failed operation may have cached what it undid

    def finish(self) -> None:
        """Last writes before COMMIT."""
        if self._last_id_dirty:
            store = self.store
            last = store.last_id
            if last is None:
                last = self._read_last_id()
            self.conn.execute("UPDATE fairq_meta SET value = ? WHERE key = 'last_id'", (last,))
            store.saved_id = last

    # -- queues ------------------------------------------------------------------------
    def _load(self, row: Row | None) -> QueueRow | None:
        if row is None:
            return None
        q = QueueRow(row[0], row[1], QueueConfig.from_dict(orjson.loads(row[2])))
        self.store.by_name[q.name] = q
        self.store.by_id[q.id] = q
        return q

    def _lookup(self, column: str, value: object) -> QueueRow | None:
        return self._load(
            self.conn.execute(
                f"SELECT id, name, config FROM fairq_queues WHERE {column} = ?", (value,)
            ).fetchone()
        )

    def names(self, table: str, prefix: str) -> list[str]:
        """The names in ``table`` (queues, topics, domains, rooms) starting with ``prefix``,
        sorted."""
        sql = f"SELECT name FROM {table} WHERE substr(name, 1, ?) = ? ORDER BY name"
        return [r[0] for r in self.conn.execute(sql, (len(prefix), prefix))]

    def find(self, name: str) -> QueueRow | None:
        return self.store.by_name.get(name) or self._lookup("name", name)

    def queue(self, name: str) -> QueueRow:
        q = self.find(name)
        if q is None:
            raise QueueNotFound(name)
        return q

    def queue_by_id(self, queue_id: int) -> QueueRow | None:
        return self.store.by_id.get(queue_id) or self._lookup("id", queue_id)

    def create(self, name: str, config: QueueConfig) -> QueueRow:
        cur = self.conn.execute(
            "INSERT INTO fairq_queues (name, config, created_at) VALUES (?, ?, ?)",
            (name, orjson.dumps(config.to_dict()).decode(), self.now),
        )
        self.configs_changed()
        q = QueueRow(int(cur.lastrowid or 0), name, config)
        self.store.by_name[name] = q
        self.store.by_id[q.id] = q
        self.store.uncounted[q.id] = (0, 0, 0)
        # a deleted queue's id comes back to the next queue made: not in fairq_lazy yet
        self.store.lazy.discard(q.id)
        return q

    def configs_changed(self) -> None:
        self.conn.execute("UPDATE fairq_meta SET value = value + 1 WHERE key = 'config_version'")
        (version,) = self.conn.execute(
            "SELECT value FROM fairq_meta WHERE key = 'config_version'"
        ).fetchone()
        self.store.forget_queues()
        self.store.config_version = version

    # -- topics ------------------------------------------------------------------------
    def find_topic(self, name: str) -> TopicRow | None:
        topic = self.store.topics.get(name)
        if topic is not None:
            return topic
        row = self.conn.execute(
            "SELECT id, config FROM fairq_topics WHERE name = ?", (name,)
        ).fetchone()
        if row is None:
            return None
        subs = {
            s[0]: Subscription(
                name, s[0], s[1], None if s[2] is None else orjson.loads(s[2]), s[3], s[4]
            )
            for s in self.conn.execute(
                "SELECT s.name, q.name, s.filter, s.routing, s.push FROM fairq_subscriptions s "
                "JOIN fairq_queues q ON q.id = s.queue_id WHERE s.topic_id = ?",
                (row[0],),
            )
        }
        topic = TopicRow(row[0], name, TopicConfig(**orjson.loads(row[1])), subs)
        self.store.topics[name] = topic
        return topic

    def topic(self, name: str) -> TopicRow:
        topic = self.find_topic(name)
        if topic is None:
            raise TopicNotFound(name)
        return topic

    # -- attention domains -------------------------------------------------------------
    def find_domain(self, name: str) -> DomainRow | None:
        d = self.store.domains.get(name)
        if d is not None:
            return d
        row = self.conn.execute(
            "SELECT id, config FROM fairq_att_domains WHERE name = ?", (name,)
        ).fetchone()
        if row is None:
            return None
        d = DomainRow(row[0], name, AttentionConfig.from_dict(orjson.loads(row[1])))
        self.store.domains[name] = d
        return d

    def domain(self, name: str) -> DomainRow:
        d = self.find_domain(name)
        if d is None:
            raise AttentionNotFound(name)
        return d
