"""The store's side of RabbitMQ's attention domains (``attention.py``): tickets — one small
message per work message, in the store's queue ``fairq:<work queue>`` — the store's domain
that uses them as its work queues, and the wake-ups taken from the store.
"""

from __future__ import annotations

import asyncio
import re
import string
from collections.abc import Iterable
from dataclasses import replace

from ...message import Received
from ...model.attention import LONGEST_KEY, MAX_SHARDS, AttentionConfig
from ...model.queues import MAX_RETENTION, Envelope, queue_config_from_options
from ..base import Backend, Wakeups
from . import topology

__all__ = [
    "MARGIN",
    "MISSES",
    "StoreWakeups",
    "due_of",
    "key_pattern",
    "store_config",
    "ticket",
    "tickets_of",
]

MARGIN = 2.0  # seconds a ticket's lease outlives its message's
MISSES = 10  # looks that found no message for a ticket before it is dropped
_RETENTION_MARGIN = 60.0  # seconds a ticket is kept past its message's retention


def tickets_of(queue: str) -> str:
    """The store's ticket queue of work queue ``queue``."""
    return topology.RESERVED + queue


def ticket(due: float, delay: float = 0.0) -> Envelope:
    """A ticket for a message that becomes available at ``due`` (``delay`` from now)."""
    return Envelope(b"%.6f" % due, {}, delay=delay)


def due_of(t: Received) -> float:
    """When a ticket's message was to become available."""
    try:
        return float(t.body)
    except ValueError:
        return t.enqueued_at


def store_config(domain: str, config: AttentionConfig) -> AttentionConfig:
    """The store's domain: the same plans and options, the ticket queues as work queues
    (``InvalidOption`` if the template leaves no room for the ``fairq:`` prefix)."""
    from ...errors import InvalidOption

    work = queue_config_from_options(config.queue_for(domain, "k"), dict(config.queue_options))
    template = topology.RESERVED + config.work_queue
    longest = template.format(domain=domain, key="k" * LONGEST_KEY, shard=MAX_SHARDS - 1)
    if len(longest) > 200:
        raise InvalidOption(
            f"work_queue {config.work_queue!r} of {domain!r}: on RabbitMQ a work queue name "
            f"must leave room for the {len(topology.RESERVED)} characters of its tickets' "
            f"queue in the store (at most {200 - len(topology.RESERVED)} for the longest keys)"
        )
    options = {
        "visibility_timeout": work.visibility_timeout + MARGIN,
        "max_attempts": None,
        "dead_letter": None,
        "retention": min(MAX_RETENTION, work.retention + _RETENTION_MARGIN),
        "dedup_window": 0.0,
    }
    return replace(config, work_queue=template, queue_options=options)


def key_pattern(domain: str, template: str) -> re.Pattern[str]:
    """A regular expression matching the work queues of ``domain``, the key as group 1
    (Python's and RabbitMQ's regular expressions alike)."""
    parts = []
    for literal, name, _, _ in string.Formatter().parse(template):
        parts.append(re.escape(literal))
        if name == "domain":
            parts.append(re.escape(domain))
        elif name == "key":
            parts.append(rf"([A-Za-z0-9_.:-]{{1,{LONGEST_KEY}}})")
        elif name == "shard":
            parts.append("[0-9]{1,4}")
    return re.compile("^" + "".join(parts) + "$")


class StoreWakeups(Wakeups):
    """A RabbitMQ backend's wake-ups, with the attention domains' (``attention:<domain>``)
    taken from the store, which is where signals are written and where other processes'
    writes are heard."""

    def __init__(self, backend: Backend, store: Wakeups) -> None:
        super().__init__(backend, backend.clock)
        self._store = store

    @staticmethod
    def _theirs(name: str) -> bool:
        return name.startswith("attention:")

    def token(self, queue: str) -> asyncio.Event:
        return self._store.token(queue) if self._theirs(queue) else super().token(queue)

    def lead(self, name: str) -> asyncio.Lock:
        return self._store.lead(name) if self._theirs(name) else super().lead(name)

    def notify(self, queues: Iterable[str]) -> None:
        mine: list[str] = []
        theirs: list[str] = []
        for q in queues:
            (theirs if self._theirs(q) else mine).append(q)
        super().notify(mine)
        if theirs:
            self._store.notify(theirs)

    def notify_all(self) -> None:
        super().notify_all()
        self._store.notify_all()

    async def wait(self, token: asyncio.Event, timeout: float | None) -> None:
        if any(token is e for e in self._store._events.values()):
            await self._store.wait(token, timeout)
        else:
            await super().wait(token, timeout)
