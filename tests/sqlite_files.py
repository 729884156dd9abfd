"""Looking into a SQLite file from a test, beside the fairq connections that write it: the
rows a statement reads (a connection of its own, closed again) and how many WAL frames (B-tree
pages committed) the file's WAL holds. ``from sqlite_files import rows, wal_frames``."""

from __future__ import annotations

import sqlite3
from pathlib import Path


def rows(db: Path, sql: str) -> list[tuple[object, ...]]:
    """What ``sql`` reads from the file ``db`` now."""
    conn = sqlite3.connect(db)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def wal_frames(db: Path, page_size: int = 4096) -> int:
    """The frames in ``db``'s WAL: each commit appends one per page it changed."""
    wal = Path(f"{db}-wal")
    return wal.stat().st_size // (page_size + 24) if wal.exists() else 0
