"""Taking turns at SQLite's write lock across processes, so no writer is starved.

SQLite's write lock is not fair: a connection that finds it taken (SQLITE_BUSY) can only
try again later, and a process committing one transaction after another in a tight loop
leaves gaps of a few microseconds, which a waiter trying every few milliseconds almost
never hits (issue 16: a worker process went up to a second without a commit beside a
publisher process). So the writers of one database file take turns:

* a writer that finds the lock taken **announces** that it waits: it holds a shared
  ``flock`` on ``<db>-fairq-lock`` (a file of its own: nothing here opens the database,
  its ``-wal`` or its ``-shm``, whose POSIX locks SQLite keeps) until its transaction has
  committed or failed, and tries again every millisecond;
* a writer that has just committed **looks** whether anyone waits (an exclusive
  ``flock`` it cannot take) and if so **yields**: it starts no new transaction until the
  waiters have had their turn (their shared locks are gone) or ``YIELD_MAX`` has passed,
  so a waiter that died or stalls costs the others at most that.

``flock`` locks belong to one open file description, so two backends in one process take
turns too, and the kernel drops a dead process's lock. Where ``flock`` is missing (not a
Unix) or the lock file cannot be opened, :meth:`Turns.open` returns None and the writer
retries as before, without turns.

Looking costs no system call while nobody has waited: the lock file's first byte, mapped
into memory, is set by a waiter once it holds its shared lock, and cleared by a writer
that finds (under the exclusive lock, which no waiter can hold beside it) that nobody
waits any more. A looker that reads the byte as clear before a new waiter has set it
misses that waiter for one commit, never longer: the waiter's lock and byte stay until
its turn. (A writer of a fairq older than this byte never sets it, and is seen only by
writers of its own age.)
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os

try:
    import fcntl
except ImportError:  # pragma: no cover - not on Unix
    fcntl = None  # type: ignore[assignment]

__all__ = ["RETRY", "YIELD_MAX", "YIELD_POLL", "Turns"]

log = logging.getLogger("fairq.sqlite")

RETRY = 0.001  # seconds between a waiting writer's tries while it has announced itself
YIELD_POLL = 0.001  # seconds between a yielding writer's looks at the waiters
YIELD_MAX = 0.02  # the longest a writer yields to waiters that do not take their turn
SUFFIX = "-fairq-lock"


class Turns:
    """One backend's descriptor of ``<db>-fairq-lock`` and its announcement."""

    __slots__ = ("fd", "flag", "waiting")

    def __init__(self, fd: int, flag: mmap.mmap | None = None) -> None:
        self.fd = fd
        self.flag = flag  # the file's first byte: nonzero once a waiter announced itself
        self.waiting = False  # this writer holds its shared lock: it announced a wait

    @classmethod
    def open(cls, db_path: str) -> Turns | None:
        if fcntl is None or db_path in ("", ":memory:") or db_path.startswith("file:"):
            return None
        try:
            fd = os.open(db_path + SUFFIX, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            log.info("no %s (%s): writers retry without taking turns", SUFFIX, exc)
            return None
        flag = None
        try:
            if os.fstat(fd).st_size < 1:
                os.ftruncate(fd, 1)  # two processes doing this at once both leave 1 byte
            flag = mmap.mmap(fd, 1)
        except (OSError, ValueError) as exc:  # no shared mapping here: every look locks
            log.info("%s not mapped (%s): each look at the waiters takes a lock", SUFFIX, exc)
        return cls(fd, flag)

    def announce(self) -> None:
        """This writer waits for the write lock (idempotent; a writer that cannot announce
        now, because another is just looking, announces at its next try)."""
        if not self.waiting:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError:
                return
            self.waiting = True
            if self.flag is not None:
                self.flag[0] = 1

    def done(self) -> None:
        """This writer's turn is over (committed or failed): take the announcement back."""
        if self.waiting:
            self.waiting = False
            with contextlib.suppress(OSError):  # the descriptor is ours and open
                fcntl.flock(self.fd, fcntl.LOCK_UN)

    def others_wait(self) -> bool:
        """Whether another writer announced that it waits (never true of this one: call it
        after :meth:`done`)."""
        flag = self.flag
        if flag is not None and not flag[0]:
            return False  # nobody has announced since the last look that found none
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        except OSError:
            return False
        if flag is not None:
            flag[0] = 0  # under the exclusive lock: no waiter holds its shared one
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        return False

    def close(self) -> None:
        if self.flag is not None:
            self.flag.close()
            self.flag = None
        if self.fd >= 0:
            os.close(self.fd)  # drops this description's flock
            self.fd = -1
            self.waiting = False
