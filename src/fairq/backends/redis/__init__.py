"""``redis://``, ``rediss://`` and ``redis+cluster://``: fairq on Redis and Redis Cluster,
shared by any number of processes on any number of hosts.

Every seam method is one Lua script (``scripts/``, helpers in ``scripts/lib/``), loaded
once and called by SHA; the key layout is in ``KEYS.md``. Each capability lives in its
own module and class, stacked into :class:`RedisBackend`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from ...clock import Clock
from ..attention_policy import SCHEDULER_NOT_PORTED
from .attention import RedisAttention
from .conn import parse_url

__all__ = ["RedisBackend", "open_redis"]


class RedisBackend(RedisAttention):
    """fairq on Redis; see the module docstring."""

    #: attention's worker-time scheduler and tenant usage are on memory and SQLite so far
    missing: ClassVar[Mapping[str, str]] = SCHEDULER_NOT_PORTED


def open_redis(url: str, clock: Clock) -> RedisBackend:
    """The backend for a Redis URL (not connected yet: ``await backend.open()``)."""
    return RedisBackend(parse_url(url), clock)
