"""The memory backend's counters for other engines (``Backend.add_counts``): a dict per scope."""

from __future__ import annotations

from collections.abc import Mapping

from ...clock import Clock
from .queues import MemoryQueues

__all__ = ["MemoryCounts"]


class MemoryCounts(MemoryQueues):
    """Named counters per scope, in this process's memory."""

    def __init__(self, clock: Clock) -> None:
        super().__init__(clock)
        self._counts: dict[str, dict[str, int]] = {}

    async def add_counts(self, scope: str, counts: Mapping[str, int]) -> None:
        self._open()
        mine = self._counts.setdefault(scope, {})
        for name, n in counts.items():
            mine[name] = mine.get(name, 0) + n

    async def read_counts(self, scope: str) -> dict[str, int]:
        self._open()
        return dict(self._counts.get(scope, {}))

    async def drop_counts(self, scope: str) -> None:
        self._open()
        self._counts.pop(scope, None)
