"""Heaps of due times whose entries go stale, kept from growing with what went through them.

A backend that keeps its own deadlines (the memory backend's delays and leases, the
RabbitMQ backend's visibility timeouts) pushes an entry per lease onto a heap and does not
look for it again when the lease ends early (acked, extended, given back): the entry goes
stale and is dropped when it reaches the top. Under a worker that never runs out of work
those entries would pile up for a whole visibility timeout — one per message handled —
so :func:`push` drops every stale entry whenever the heap has doubled since it last did:
amortised O(1) per push, and the heap stays within twice its live entries.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["COMPACT_MIN", "push"]

T = TypeVar("T", bound=tuple[Any, ...])

COMPACT_MIN = 1024  # a heap of up to this many entries is never compacted


def push(heap: list[T], entry: T, limit: int, live: Callable[[T], bool]) -> int:
    """Push ``entry``; once ``heap`` holds more than ``limit`` entries, keep only those
    ``live`` says are current — in place, so a caller popping from this list goes on with
    the compacted one — and return the next limit (twice what is left, at least
    ``COMPACT_MIN``). Start with ``limit=COMPACT_MIN``."""
    heapq.heappush(heap, entry)
    if len(heap) <= limit:
        return limit
    heap[:] = [e for e in heap if live(e)]
    heapq.heapify(heap)
    return max(COMPACT_MIN, 2 * len(heap))
