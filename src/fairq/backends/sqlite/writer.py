"""The one connection of a :class:`SQLiteBackend` that writes, and its group commit.

Operations run on the event loop's thread, grouped: everything asked for during one
pass of the loop runs in ONE ``BEGIN IMMEDIATE`` transaction, each operation under its
own savepoint, so sixteen tasks sending one message each share a commit instead of
paying sixteen; adjacent sends (receives, acks) to one queue even run as one operation.
The connection never waits on SQLite's lock: when another process holds the write lock,
the batch is retried a moment later without blocking the loop (up to ``busy_timeout``),
and the writers of one file take turns (``turns.py``): a writer that has to wait says so,
and one that has just committed yields to it, so a tight loop of commits in one process
cannot starve another.

WAL checkpoints (copying the log back into the database file, with an fsync) run on a
background thread with a connection of its own, never on the loop, so a send does not
stall behind one.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from ...clock import Clock
from ...errors import BackendError, ConnectionError, FairqError
from ...message import Received
from ..base import Wakeups
from . import messages
from . import queues as store
from .turns import RETRY, YIELD_MAX, YIELD_POLL, Turns
from .txn import Store, Txn, apply_schema, check_schema

__all__ = ["Writer", "engine_error"]

log = logging.getLogger("fairq.sqlite")
T = TypeVar("T")
_MAX_BATCH = 512
_DEDUP_CLEANUP_EVERY = 60.0
_RETRY_FIRST = 0.0005
_RETRY_MAX = 0.02
_TURNS_FOR = 1.0  # seconds a writer that announced itself keeps trying every RETRY
_CHECKPOINT_EVERY = 0.1  # seconds between looks at the WAL on the background thread
# commits of this writer between checkpoints (about 4 WAL frames each): a checkpoint that
# empties the WAL makes the next commit restart it, which fsyncs the new WAL header under
# the write lock, so checkpointing a nearly empty WAL every 0.1 s put an fsync into one
# commit in ten. The count is kept here, not read from the ``-shm`` file: a process that
# opens and closes any descriptor of that file drops the POSIX locks SQLite holds on it,
# and another process would then rebuild the WAL index under this one's feet.
_CHECKPOINT_COMMITS = 1000
_CHECKPOINT_IDLE = 2.0  # seconds after which what little was committed is copied back
# A WAL starts over (new frames overwrite old ones) only when a writer begins while every
# frame has been copied back. Under steady load from two processes (a producer and a
# worker, 1,000 msgs/s) a PASSIVE checkpoint never catches up with the commits made while
# it runs, so the WAL grew without end (270 MB in 15 s). Past this many frames (64 MB of
# 4 KB pages) the checkpointer follows its PASSIVE pass with a RESTART one: it copies the
# few frames left while holding off writers, then the next commit starts the WAL over.
_RESTART_FRAMES = 16384
# ... and a WAL this large is copied back whatever the number of commits: a few big
# batches write thousands of frames each and never reach _CHECKPOINT_COMMITS (back-to-back
# batches of 20,000 grew a WAL to 2 GB). os.stat of the -wal file opens nothing (no lock
# of SQLite's is touched).
_CHECKPOINT_BYTES = 16 * 1024 * 1024
# After a checkpoint let the WAL start over, SQLite cuts the file down to this size (it
# only ever reuses a WAL file, so one burst left it at its largest for good). Below
# _CHECKPOINT_BYTES, so that a file that large always holds that many new frames (a file
# left larger by a burst would set off a checkpoint at every look)
_JOURNAL_SIZE_LIMIT = 4 * 1024 * 1024
_RESTART_WAIT_MS = 20  # the longest a RESTART checkpoint waits for the lock or readers
# A small receive or ack leaves its counters uncounted (schema.sql); a transaction settles
# them (messages.settle) once this writer has left this many, or when this long has passed
# since the last settle — which also finds what another process left (it died, or closed
# while the lock was taken)
_SETTLE_ROWS = 256
# the checkpointer thread looks at the file's schema version every this many of its looks
# (0.5 s): a newer fairq that upgraded the file while this process runs stops this one's
# writes (an older process misreads rows of a newer schema: acked messages were delivered
# again), with no work on the loop's transactions but an attribute test
_SCHEMA_LOOKS = 5
_SETTLE_EVERY = 1.0
# Sends leave the inbox (schema.sql, version 12) for the next operation that is not a send,
# until this writer has appended this many rows there: then its next transaction drains it,
# so a producer that nothing else follows keeps the inbox, and each drain, small
_INBOX_ROWS = 256

Job = tuple[Callable[..., Any], tuple[Any, ...], "asyncio.Future[Any]"]


def engine_error(exc: BaseException) -> BaseException:
    if isinstance(exc, FairqError | asyncio.CancelledError):
        return exc
    if isinstance(exc, sqlite3.Error):
        err = BackendError(f"sqlite: {exc}")
        err.__cause__ = exc
        return err
    return exc


def _open_hint(path: str) -> str:
    """Why a file could not be opened, when the path says it: a directory, or a directory
    that does not exist (with the four-slash URL of an absolute path that would)."""
    where = Path(path)
    if where.is_dir():
        return f" (a directory: name a file in it, e.g. sqlite:///{where / 'fairq.db'})"
    if where.parent.exists():
        return ""
    hint = f" (directory {str(where.parent)!r} does not exist"
    if not where.is_absolute() and (Path("/") / where).parent.is_dir():
        # sqlite:///tmp/x.db is tmp/x.db here; the absolute path takes four
        hint += f"; for the absolute path /{path} write sqlite:////{path}"
    return hint + ")"


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return (code & 0xFF) in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
    return "locked" in str(exc) or "busy" in str(exc)


_MERGEABLE = (store.send, store.receive, store.ack)


def _merge(batch: list[Job]) -> list[list[Job]]:
    """Split a batch into units: runs of adjacent sends (or receives with one lease length,
    or acks with distinct receipts) to the same queue, and single jobs."""
    units: list[list[Job]] = []
    seen: set[str] = set()  # the receipts of the last unit, when it is a run of acks
    for job in batch:
        fn, args, _ = job
        if units and fn in _MERGEABLE:
            last = units[-1]
            pfn, pargs, _ = last[0]
            if pfn is fn and pargs[0] == args[0]:
                if fn is store.send:
                    last.append(job)
                    continue
                if fn is store.receive and pargs[2] == args[2]:
                    last.append(job)
                    continue
                if fn is store.ack and seen.isdisjoint(args[1]):
                    seen.update(args[1])
                    last.append(job)
                    continue
        units.append([job])
        if fn is store.ack:
            seen = set(args[1])
    return units


class Writer:
    """The write connection of one backend: open/close, the checkpointer thread, and
    :meth:`call`, which runs ``fn(txn, *args)`` in the next group commit."""

    def __init__(
        self,
        path: str,
        synchronous: str,
        busy_timeout: float,
        clock: Clock,
        wakeups: Wakeups,
        page_size: int | None = None,
        secure_delete: str = "FAST",
    ) -> None:
        self.path = path
        self._page_size = page_size  # for a file this writer creates (None: SQLite's 4096)
        self._secure_delete = secure_delete  # ON, FAST or OFF (the URL option)
        self.clock = clock
        self.wakeups = wakeups
        self._synchronous = synchronous
        self._busy_timeout = busy_timeout
        self._loop: asyncio.AbstractEventLoop | None = None
        self._store = Store()
        self.conn: sqlite3.Connection | None = None
        # one cursor of conn for the statements every transaction runs (BEGIN, COMMIT, the
        # data version) and the hot ones of receive and ack: conn.execute makes a cursor
        # per call, 0.3 us each, nine times per receive+ack pair (Txn.cur)
        self.cur: sqlite3.Cursor | None = None
        self._pending: list[Job] = []
        self._scheduled = False
        self._busy_since: float | None = None
        self._retry_delay = _RETRY_FIRST
        self._last_dedup_cleanup = 0.0
        self._outdated: FairqError | None = None  # a newer fairq upgraded the file
        self._checkpointer: threading.Thread | None = None
        self._stop_checkpoints = threading.Event()
        self.commits = 0  # since open; read by the checkpointer thread (an int: no lock)
        self._turns: Turns | None = None
        self._yield_until = 0.0  # loop time until which this writer yields to waiters
        self.yields = 0  # times this writer yielded its next transaction to a waiter

    # -- lifecycle -------------------------------------------------------------------------
    def _connect(self, busy_ms: int, page_size: int | None = None) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.path, isolation_level=None, timeout=busy_ms / 1000, check_same_thread=False
        )
        conn.execute(f"PRAGMA busy_timeout = {busy_ms}")
        if page_size is not None:  # takes effect only while the file is still empty
            conn.execute(f"PRAGMA page_size = {int(page_size)}")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(f"PRAGMA synchronous = {self._synchronous}")
        conn.execute("PRAGMA temp_store = MEMORY")
        conn.execute("PRAGMA cache_size = -32000")
        # deleted rows zeroed on the pages a commit writes anyway, not on pages freed whole
        # (FAST, the default: ON, as Debian builds SQLite, writes those too, about three
        # pages more a receive(100)+ack_batch pair; docs/backends.md)
        conn.execute(f"PRAGMA secure_delete = {self._secure_delete}")
        conn.execute(f"PRAGMA journal_size_limit = {int(_JOURNAL_SIZE_LIMIT)}")
        return conn

    async def open(self) -> None:
        self._loop = asyncio.get_running_loop()
        try:
            # schema set-up may wait for another process: do it off the loop, with waiting
            self.conn = await asyncio.to_thread(self._open_conn)
        except (sqlite3.Error, OSError, FairqError) as exc:
            hint = _open_hint(self.path)
            raise ConnectionError(f"cannot open sqlite:///{self.path}{hint}: {exc}") from exc
        self.cur = self.conn.cursor()
        self.conn.execute("PRAGMA busy_timeout = 0")  # from now on: retried off the loop
        self.conn.execute("PRAGMA wal_autocheckpoint = 0")  # the checkpointer thread does it
        self._turns = Turns.open(self.path)
        self._checkpointer = threading.Thread(
            target=self._checkpoint_loop, name=f"fairq-checkpoint:{self.path}", daemon=True
        )
        self._checkpointer.start()

    def _checkpoint_loop(self) -> None:
        """Copy the WAL back into the database now and then, off the event loop. PASSIVE
        never blocks writers or readers; it does what it can and tries again later."""
        try:
            conn = self._connect(1000)
            conn.execute(f"PRAGMA busy_timeout = {_RESTART_WAIT_MS}")
        except sqlite3.Error:
            log.warning(
                "no checkpoint connection; SQLite's own checkpoints take over", exc_info=True
            )
            if self.conn is not None and self._loop is not None:
                self._loop.call_soon_threadsafe(self._autocheckpoint)
            return
        done = 0  # commits copied back by the last checkpoint
        seen, quiet = 0, 0.0  # commits at the last look, and for how long no new one came
        looks = 0
        try:
            while not self._stop_checkpoints.wait(_CHECKPOINT_EVERY):
                looks += 1
                if looks % _SCHEMA_LOOKS == 0 and self._outdated is None:
                    try:
                        check_schema(conn, self.path)
                    except FairqError as exc:
                        self._outdated = exc  # every transaction from now on refuses
                    except sqlite3.Error:
                        pass
                commits = self.commits
                quiet = quiet + _CHECKPOINT_EVERY if commits == seen else 0.0
                seen = commits
                new = commits - done
                if (
                    new < _CHECKPOINT_COMMITS
                    and not (new and quiet >= _CHECKPOINT_IDLE)
                    and not (new and self._wal_bytes() >= _CHECKPOINT_BYTES)
                ):
                    continue
                done = commits
                try:
                    _, frames, _ = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                    if frames >= _RESTART_FRAMES:
                        conn.execute("PRAGMA wal_checkpoint(RESTART)").fetchone()
                except sqlite3.Error as exc:
                    log.debug("checkpoint skipped: %s", exc)
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        except sqlite3.Error:
            pass
        finally:
            conn.close()

    def _wal_bytes(self) -> int:
        try:
            return os.stat(f"{self.path}-wal").st_size
        except OSError:
            return 0

    def _autocheckpoint(self) -> None:
        if self.conn is not None:
            self.conn.execute("PRAGMA wal_autocheckpoint = 1000")

    def _open_conn(self) -> sqlite3.Connection:
        conn = self._connect(int(self._busy_timeout * 1000), self._page_size)
        try:
            if self._page_size is not None:
                (size,) = conn.execute("PRAGMA page_size").fetchone()
                if size != self._page_size:
                    log.warning(
                        "%s keeps the page size it was created with (%d bytes, not %d)",
                        self.path,
                        size,
                        self._page_size,
                    )
            apply_schema(conn)
            row = conn.execute("SELECT value FROM fairq_meta WHERE key = 'formats_from'").fetchone()
            self._store.formats_from = float(row[0]) if row else 0.0
        except BaseException:
            conn.close()
            raise
        return conn

    async def close(self) -> None:
        self._yield_until = 0.0
        if self._pending and self.conn is not None:
            self._flush()
        if self._store.unsettled and self.conn is not None:
            self._settle(self.conn)
        conn, self.conn, self.cur = self.conn, None, None
        if self._turns is not None:
            self._turns.close()
            self._turns = None
        if self._checkpointer is not None:
            self._stop_checkpoints.set()
            await asyncio.to_thread(self._checkpointer.join, 5)
            self._checkpointer = None
        for _, _, fut in self._pending:
            if not fut.done():
                fut.set_exception(BackendError("the sqlite backend is closed"))
        self._pending = []
        if conn is not None:
            conn.close()

    def _settle(self, conn: sqlite3.Connection) -> None:
        """Settle what this writer left uncounted, in a transaction of its own (when
        closing). If another process holds the lock, whoever writes next settles it."""
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError:
            return
        try:
            t = Txn(self._store, conn, self.clock.now())
            messages.settle(t)
            t.op_done()
            t.finish()
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            log.debug("acked rows left for the next writer: %s", exc)
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            self._store.forget()

    # -- group commit ----------------------------------------------------------------------
    def call(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        loop = self._loop
        conn = self.conn
        if conn is None or loop is None:
            raise BackendError("the sqlite backend is closed")
        fut: asyncio.Future[T] = loop.create_future()
        if (
            not self._scheduled
            and not self._pending
            and not self._yield_until
            and not getattr(loop, "_ready", True)
        ):
            # nothing else is ready to run in this pass of the loop, so nothing could join
            # this transaction: run it now instead of one loop pass later
            self._run_now(conn, fn, args, fut)
            return fut
        self._pending.append((fn, args, fut))
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._flush)
        return fut

    def _run_now(
        self,
        conn: sqlite3.Connection,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        fut: asyncio.Future[Any],
    ) -> None:
        """One operation alone in its transaction: the path of one task calling at a time,
        without the batch's merging, savepoints and result lists."""
        cur = self.cur
        assert cur is not None
        try:
            cur.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            self._pending.append((fn, args, fut))
            if _is_busy(exc):
                self._wait_for_lock(exc)
            else:
                self._fail_pending(exc)
            return
        self._busy_since = None
        self._retry_delay = _RETRY_FIRST
        try:
            t = self._begin(conn)
            if fn is not store.send:
                t.drain()  # (the inbox: schema.sql)
            value = fn(t, *args)
            t.op_done()
            t.finish()
            cur.execute("COMMIT")
            self.commits += 1
        except Exception as exc:
            self._turn_over()
            self._rolled_back(conn, exc, [(fn, args, fut)])
            return
        self._turn_over()
        if fut.cancelled():  # (a receive given up: _resolve hands its leases back)
            self._resolve([(fut, value, None)], t.notify)
            return
        fut.set_result(value)
        if t.notify:
            self.wakeups.notify(t.notify)

    def _turn_over(self) -> None:
        """After a transaction: take back this writer's announcement, and yield the next
        turn if another writer waits for the lock."""
        turns = self._turns
        if turns is not None:
            turns.done()
            if turns.others_wait():
                assert self._loop is not None
                self._yield_until = self._loop.time() + YIELD_MAX
                self.yields += 1

    def _flush(self) -> None:
        self._scheduled = False
        conn = self.conn
        if conn is None or not self._pending:
            if self._turns is not None:
                self._turns.done()  # nothing left to wait for
            return
        if self._yield_until:
            loop = self._loop
            assert loop is not None and self._turns is not None
            if loop.time() < self._yield_until and self._turns.others_wait():
                self._scheduled = True  # a waiter's turn: look again in a moment
                loop.call_later(YIELD_POLL, self._flush)
                return
            self._yield_until = 0.0
        try:
            assert self.cur is not None
            self.cur.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            if _is_busy(exc):
                self._wait_for_lock(exc)
            else:
                self._fail_pending(exc)
            return
        self._busy_since = None
        self._retry_delay = _RETRY_FIRST
        batch = self._pending[:_MAX_BATCH]
        del self._pending[:_MAX_BATCH]
        self._run_batch(conn, batch)
        self._turn_over()
        if self._pending and not self._scheduled:
            self._scheduled = True
            assert self._loop is not None
            self._loop.call_soon(self._flush)

    def _wait_for_lock(self, exc: sqlite3.OperationalError) -> None:
        """Another process holds the write lock: try again soon, without blocking the loop."""
        loop = self._loop
        assert loop is not None
        now = loop.time()
        if self._busy_since is None:
            self._busy_since = now
        elif now - self._busy_since > self._busy_timeout:
            self._busy_since = None
            # out of reach, as a server that does not answer is: a Worker waits it out
            # (a sqlite3 shell left in a transaction, a process frozen holding the lock)
            err = ConnectionError(
                f"sqlite:///{self.path}: another process held the write lock for more than "
                f"busy_timeout ({self._busy_timeout:g} s): {exc}"
            )
            err.__cause__ = exc
            self._fail_pending(err)
            return
        self._scheduled = True
        turns = self._turns
        if turns is not None and now - self._busy_since < _TURNS_FOR:
            # say that we wait, so the holder yields after its commit; then try often
            turns.announce()
            if turns.waiting:
                loop.call_later(RETRY, self._flush)
                return
        loop.call_later(self._retry_delay, self._flush)
        self._retry_delay = min(self._retry_delay * 2, _RETRY_MAX)

    def _fail_pending(self, exc: BaseException) -> None:
        if self._turns is not None:
            self._turns.done()
        err = engine_error(exc)
        pending, self._pending = self._pending, []
        for _, _, fut in pending:
            if not fut.done():
                fut.set_exception(err)

    def _begin(self, conn: sqlite3.Connection) -> Txn:
        """The transaction just begun, with what every transaction does first: due delays
        and leases brought to their next state, acked rows settled, expired dedup ids
        dropped now and then, and the inbox drained once this writer has left
        ``_INBOX_ROWS`` there (each operation but a send drains it too: _run_now,
        _run_batch)."""
        if self._outdated is not None:  # (the checkpointer thread looks: _checkpoint_loop)
            raise self._outdated
        known = self._store
        now = self.clock.now()
        t = Txn(known, conn, now, self.cur)
        if known.inbox >= _INBOX_ROWS:
            t.drain()
        if now >= known.due:  # (most transactions: nothing due, nothing to sweep)
            messages.sweep(t)
        if known.unsettled >= _SETTLE_ROWS or now - known.settled_at >= _SETTLE_EVERY:
            messages.settle(t)
        t.op_done()
        if now - self._last_dedup_cleanup > _DEDUP_CLEANUP_EVERY:
            self._last_dedup_cleanup = now
            store.drop_expired_dedup(t)
        return t

    def _rolled_back(self, conn: sqlite3.Connection, exc: Exception, batch: list[Job]) -> None:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        self._store.forget()
        if not isinstance(exc, FairqError):
            log.warning("sqlite transaction failed: %s", exc)
        err = engine_error(exc)
        self._resolve([(fut, None, err) for _, _, fut in batch], set())

    def _run_batch(self, conn: sqlite3.Connection, batch: list[Job]) -> None:
        """Run ``batch`` in the transaction just begun, then commit and hand out results."""
        results: list[tuple[asyncio.Future[Any], Any, BaseException | None]] = []
        units = _merge(batch)
        single = len(units) == 1 and len(units[0]) == 1
        try:
            t = self._begin(conn)
            for unit in units:
                if unit[0][0] is not store.send:
                    # whatever is not a send sees every send before it, this transaction's
                    # too (a delete_queue after a send must take its message)
                    t.drain()
                if single:
                    fn, args, fut = unit[0]
                    value = fn(t, *args)  # a failure rolls back the whole transaction
                    t.op_done()
                    results.append((fut, value, None))
                elif len(unit) == 1 or not self._run_merged(t, unit, results):
                    for job in unit:
                        self._run_one(t, job, results)
            t.finish()
            t.cur.execute("COMMIT")
            self.commits += 1
        except Exception as exc:
            self._rolled_back(conn, exc, batch)
            return
        self._resolve(results, t.notify)

    def _run_one(
        self, t: Txn, job: Job, results: list[tuple[asyncio.Future[Any], Any, BaseException | None]]
    ) -> None:
        fn, args, fut = job
        conn = t.conn
        conn.execute("SAVEPOINT op")
        try:
            value = fn(t, *args)
            t.op_done()
        except Exception as exc:
            if not conn.in_transaction:
                raise
            conn.execute("ROLLBACK TO op")
            conn.execute("RELEASE op")
            t.op_failed()
            results.append((fut, None, engine_error(exc)))
        else:
            conn.execute("RELEASE op")
            results.append((fut, value, None))

    def _run_merged(
        self,
        t: Txn,
        unit: list[Job],
        results: list[tuple[asyncio.Future[Any], Any, BaseException | None]],
    ) -> bool:
        """Run same-kind jobs on one queue as ONE operation (one insert, one counter update);
        False (and nothing changed) if it fails, so each can run alone and fail alone."""
        fn, first_args, _ = unit[0]
        conn = t.conn
        conn.execute("SAVEPOINT merged")
        try:
            if fn is store.send:
                envs = [e for _, args, _ in unit for e in args[1]]
                ids = store.send(t, first_args[0], envs)
                values: list[Any] = []
                k = 0
                for _, args, _ in unit:
                    values.append(ids[k : k + len(args[1])])
                    k += len(args[1])
            elif fn is store.receive:
                want = [args[1] for _, args, _ in unit]
                got = store.receive(t, first_args[0], sum(want), first_args[2])
                values = []
                k = 0
                for n in want:
                    values.append(got[k : k + n])
                    k += n
            else:  # store.ack
                receipts = [r for _, args, _ in unit for r in args[1]]
                lost = set(store.ack(t, first_args[0], receipts))
                values = [[r for r in args[1] if r in lost] for _, args, _ in unit]
            t.op_done()
        except Exception:
            if not conn.in_transaction:
                raise
            conn.execute("ROLLBACK TO merged")
            conn.execute("RELEASE merged")
            t.op_failed()
            return False
        conn.execute("RELEASE merged")
        for (_, _, fut), value in zip(unit, values, strict=True):
            results.append((fut, value, None))
        return True

    def _resolve(
        self, results: list[tuple[asyncio.Future[Any], Any, BaseException | None]], notify: set[str]
    ) -> None:
        for fut, value, exc in results:
            if fut.cancelled():
                if exc is None and isinstance(value, tuple) and len(value) == 2:
                    value = value[1]  # (an ack_receive: its acks stand, its receive not)
                if (
                    exc is None
                    and isinstance(value, list)
                    and value
                    and isinstance(value[0], Received)
                ):
                    # the receiver gave up while its receive ran: hand the leases back
                    self.call(store.release, value[0].queue, [m.receipt for m in value])
                continue
            if exc is not None:
                fut.set_exception(exc)
            else:
                fut.set_result(value)
        if notify:
            self.wakeups.notify(notify)
