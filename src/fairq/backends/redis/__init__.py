"""``redis://``, ``rediss://`` and ``redis+cluster://``: fairq on Redis and Redis Cluster,
shared by any number of processes on any number of hosts.

Every seam method is one Lua script (``scripts/``, helpers in ``scripts/lib/``), loaded
once and called by SHA; the key layout is in ``KEYS.md``. Each capability lives in its
own module and class, stacked into :class:`RedisBackend`.
"""

from __future__ import annotations

from ...clock import Clock
from .attention import RedisAttention
from .conn import parse_url

__all__ = ["RedisBackend", "open_redis"]


class RedisBackend(RedisAttention):
    """fairq on Redis; see the module docstring."""


def open_redis(url: str, clock: Clock) -> RedisBackend:
    """The backend for a Redis URL (not connected yet: ``await backend.open()``)."""
    return RedisBackend(parse_url(url), clock)
