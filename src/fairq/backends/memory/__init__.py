"""``memory://``: everything in this process's memory; for tests and single-process use.

Nothing survives the process. Each backend method runs without awaiting in between, so
each is one atomic step, as on the durable engines. Each capability lives in its own
module and class, stacked into :class:`MemoryBackend`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from .attention import MemoryAttention
from .counts import MemoryCounts
from .idempotency import MemoryIdempotency
from .topics import MemoryTopics
from .waitingroom import MemoryWaitingRoom

__all__ = ["MemoryBackend"]


class MemoryBackend(
    MemoryAttention, MemoryIdempotency, MemoryTopics, MemoryWaitingRoom, MemoryCounts
):
    """All state in this process; see the module docstring."""

    # the capability table (base.Backend.missing): what this backend does not do by design
    missing: ClassVar[Mapping[str, str]] = {
        "persistence": "nothing survives the broker: every connect() to memory:// starts "
        "empty and no other broker or process sees its queues",
    }
