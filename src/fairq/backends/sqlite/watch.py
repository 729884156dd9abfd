"""Seeing other processes' commits on a SQLite file in milliseconds, without polling.

Every commit appends frames to the ``-wal`` file with ``write()``, so on Linux an inotify
watch on that file (``IN_MODIFY``) makes a file descriptor readable the moment any
process — this one included — writes a transaction. The backend reads it from the event
loop (``loop.add_reader``) and then asks ``PRAGMA data_version`` whether the change was
another connection's. Elsewhere (no inotify, or the watch cannot be set) the backend
polls ``data_version`` instead.

A commit writes its frames before it publishes them in the shared WAL index, so the
first event can come a moment before the commit is visible: :class:`WalWatch` users look
again a few milliseconds later when the first look saw nothing new (``RECHECKS``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import os
import sys

__all__ = ["RECHECKS", "WalWatch"]

log = logging.getLogger("fairq.sqlite")

IN_MODIFY = 0x00000002
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_IGNORED = 0x00008000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC
#: seconds after an event that saw no new commit at which to look again
RECHECKS = (0.0005, 0.002, 0.005)

_libc: ctypes.CDLL | None = None


def _load_libc() -> ctypes.CDLL | None:
    global _libc
    if _libc is None and sys.platform.startswith("linux"):
        try:
            lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            lib.inotify_init1.argtypes = [ctypes.c_int]
            lib.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
            lib.inotify_rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]
            _libc = lib
        except (OSError, AttributeError):
            return None
    return _libc


class WalWatch:
    """An inotify descriptor watching ``<db>-wal`` for writes (Linux only).

    :meth:`open` returns None where inotify is not available or the file cannot be
    watched; the caller then polls.
    """

    def __init__(self, fd: int, wal: str, libc: ctypes.CDLL) -> None:
        self.fd = fd
        self.wal = wal
        self._libc = libc
        self._wd = -1

    @classmethod
    def open(cls, db_path: str) -> WalWatch | None:
        libc = _load_libc()
        if libc is None:
            return None
        fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            log.info("no inotify (%s): polling for other processes' commits", _errno_text())
            return None
        watch = cls(fd, db_path + "-wal", libc)
        if not watch.rewatch():
            watch.close()
            return None
        return watch

    def rewatch(self) -> bool:
        """(Re)place the watch on the WAL file; False if it cannot be watched."""
        wd = self._libc.inotify_add_watch(
            self.fd, os.fsencode(self.wal), IN_MODIFY | IN_DELETE_SELF | IN_MOVE_SELF
        )
        if wd < 0:
            log.info("cannot watch %s (%s): polling instead", self.wal, _errno_text())
            self._wd = -1
            return False
        self._wd = wd
        return True

    def drain(self) -> bool:
        """Read every pending event; False if the watch is gone (the WAL file was deleted or
        replaced) and could not be placed again."""
        lost = False
        while True:
            try:
                data = os.read(self.fd, 4096)
            except BlockingIOError:
                break
            except OSError:
                return False
            if not data:
                break
            # struct inotify_event: int wd; uint32 mask, cookie, len; char name[len]
            i = 0
            while i + 16 <= len(data):
                mask = int.from_bytes(data[i + 4 : i + 8], sys.byteorder)
                if mask & (IN_IGNORED | IN_DELETE_SELF | IN_MOVE_SELF):
                    lost = True
                i += 16 + int.from_bytes(data[i + 12 : i + 16], sys.byteorder)
        return not lost or self.rewatch()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _errno_text() -> str:
    code = ctypes.get_errno()
    return errno.errorcode.get(code, str(code))
