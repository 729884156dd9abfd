"""Attention queues: fair, on-demand consumption of very many small per-key queues.

Each key (a store, an account, a tenant's integration) has its own work queue, named
from a template (``process.{domain}.{key}.work``). Publishing to a key stores the work
message and, in the same atomic step, makes sure a small *signal* for the key is pending
in the domain's attention queue (``attention.{domain}.work``). Workers take signals, not
messages: a signal gives the worker a *slice* of the key's work queue — at most
``max_messages`` messages or ``max_time`` seconds, under a concurrency token of the key —
after which the key, if it still has backlog, is signalled again at the tail. Like a CPU
scheduler's time slices, no key monopolises the workers, and no worker polls an empty
queue.

Fairness is two-level: rounds go over tenants (least recently served first), then over
the tenant's keys in turn; a key's share is set by its :class:`Plan`, never by its
backlog. The seed is the article "Attention Queue: on-demand processing for granular
queues" (MarketHub, 50,000 stores).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from .errors import InvalidOption
from .message import Outgoing, Received, check_key, check_name
from .queue import Queue, make_envelopes, wait_for_room

if TYPE_CHECKING:
    from .backends.base import Backend

__all__ = [
    "RESOURCE_STATES",
    "Attention",
    "AttentionConfig",
    "AttentionStats",
    "KeyStats",
    "Plan",
    "ResourceState",
    "Slice",
]

ResourceState = Literal["active", "paused", "maintenance", "disabled", "removed"]
RESOURCE_STATES: tuple[ResourceState, ...] = (
    "active",
    "paused",
    "maintenance",
    "disabled",
    "removed",
)
#: states whose signals are dropped (and counted); paused/maintenance park the key instead
DROPPING_STATES = ("disabled", "removed")
PARKING_STATES = ("paused", "maintenance")


@dataclass(frozen=True, slots=True)
class Plan:
    """How much of the workers one key may use.

    ``max_concurrency`` slices of the key may run at once (1: its messages are handled one
    at a time, in order); a slice handles at most ``max_messages`` messages and runs at most
    ``max_time`` seconds; ``rate`` (messages per second, across all workers) with ``burst``
    caps the key with a token bucket kept in the backend (None: no cap).
    """

    max_concurrency: int = 1
    max_messages: int = 50
    max_time: float = 20.0
    rate: float | None = None
    burst: float | None = None

    def validated(self, name: str) -> Plan:
        where = f"plan {name!r}"
        if (
            isinstance(self.max_concurrency, bool)
            or not isinstance(self.max_concurrency, int)
            or (self.max_concurrency < 1)
        ):
            raise InvalidOption(f"{where}: max_concurrency must be an integer >= 1")
        if (
            isinstance(self.max_messages, bool)
            or not isinstance(self.max_messages, int)
            or (self.max_messages < 1)
        ):
            raise InvalidOption(f"{where}: max_messages must be an integer >= 1")
        if not _positive(self.max_time):
            raise InvalidOption(f"{where}: max_time must be a number of seconds > 0")
        if self.rate is not None and not _positive(self.rate):
            raise InvalidOption(f"{where}: rate must be messages per second > 0, or None")
        if self.burst is not None:
            if self.rate is None:
                raise InvalidOption(f"{where}: burst needs a rate")
            if not _positive(self.burst) or self.burst < 1:
                raise InvalidOption(f"{where}: burst must be a number >= 1")
        return self

    @property
    def bucket(self) -> float:
        """The token bucket's size: ``burst``, else one second of ``rate`` (at least 1)."""
        if self.rate is None:
            return math.inf
        return self.burst if self.burst is not None else max(1.0, self.rate)

    def to_dict(self) -> dict[str, Any]:
        return {
            "max_concurrency": self.max_concurrency,
            "max_messages": self.max_messages,
            "max_time": self.max_time,
            "rate": self.rate,
            "burst": self.burst,
        }


def _positive(x: object) -> bool:
    return not isinstance(x, bool) and isinstance(x, int | float) and math.isfinite(x) and x > 0


DEFAULT_PLANS = {
    "basic": Plan(1, 50, 20.0),
    "pro": Plan(3, 200, 20.0),
    "enterprise": Plan(10, 1000, 20.0),
}


@dataclass(frozen=True, slots=True)
class AttentionConfig:
    """The options of an attention domain (see ``Broker.declare_attention``)."""

    plans: Mapping[str, Plan] = field(default_factory=lambda: dict(DEFAULT_PLANS))
    default_plan: str = "basic"
    work_queue: str = "process.{domain}.{key}.work"
    queue_options: Mapping[str, Any] = field(default_factory=dict)
    slice_lease: float = 30.0

    def validated(self, domain: str) -> AttentionConfig:
        if not isinstance(self.plans, Mapping) or not self.plans:
            raise InvalidOption("plans must be a non-empty dict of name -> fairq.Plan")
        for name, plan in self.plans.items():
            check_name(name, "plan")
            if not isinstance(plan, Plan):
                raise InvalidOption(f"plan {name!r} must be a fairq.Plan, got {plan!r}")
            plan.validated(name)
        if self.default_plan not in self.plans:
            raise InvalidOption(
                f"default_plan {self.default_plan!r} is not one of the plans: "
                f"{', '.join(self.plans)}"
            )
        if "{key}" not in self.work_queue:
            raise InvalidOption("work_queue must contain {key}, e.g. 'process.{domain}.{key}.work'")
        try:
            check_name(self.work_queue.format(domain=domain, key="k"), "work queue")
        except (KeyError, IndexError, ValueError) as exc:
            raise InvalidOption(
                f"work_queue {self.work_queue!r} may use only {{domain}} and {{key}}"
            ) from exc
        if not _positive(self.slice_lease):
            raise InvalidOption("slice_lease must be a number of seconds > 0")
        from .broker import queue_config_from_options

        queue_config_from_options(self.queue_for(domain, "k"), dict(self.queue_options))
        return self

    def queue_for(self, domain: str, key: str) -> str:
        """The work queue of ``key``."""
        return self.work_queue.format(domain=domain, key=key)

    def to_dict(self) -> dict[str, Any]:
        return {
            "plans": {n: p.to_dict() for n, p in self.plans.items()},
            "default_plan": self.default_plan,
            "work_queue": self.work_queue,
            "queue_options": dict(self.queue_options),
            "slice_lease": self.slice_lease,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AttentionConfig:
        return cls(
            plans={n: Plan(**p) for n, p in data["plans"].items()},
            default_plan=data["default_plan"],
            work_queue=data["work_queue"],
            queue_options=dict(data.get("queue_options", {})),
            slice_lease=float(data.get("slice_lease", 30.0)),
        )


@dataclass(frozen=True, slots=True)
class Slice:
    """A worker's turn on one key: handle at most ``plan.max_messages`` messages of
    ``queue`` within ``plan.max_time`` seconds, under the concurrency token ``token``."""

    domain: str
    key: str
    queue: str
    token: str
    plan: Plan


#: the counters of :class:`AttentionStats` that are plain totals, as the backends keep them
ATTENTION_COUNTERS = (
    "processed",
    "republished",
    "blocked",
    "rate_limited",
    "empty",
    "parked",
    "reconciled",
)


@dataclass(frozen=True, slots=True)
class AttentionStats:
    """A domain's scheduling counters since it was declared.

    ``signals_pending`` and ``slices`` (running now) are current; the rest are totals:
    ``processed`` messages handled in slices, signals ``republished`` at the end of a slice
    with backlog left, ``blocked`` by the concurrency limit, ``rate_limited`` by a key's
    rate, ``empty`` (the queue had nothing visible), ``parked`` (paused or maintenance),
    ``reconciled`` by the reconciler, and ``discarded`` per state (disabled, removed).
    ``clear_time_avg`` is the mean seconds from a key's backlog appearing to its queue
    being empty again.
    """

    signals_pending: int = 0
    slices: int = 0
    processed: int = 0
    republished: int = 0
    blocked: int = 0
    rate_limited: int = 0
    empty: int = 0
    parked: int = 0
    reconciled: int = 0
    discarded: dict[str, int] = field(default_factory=dict)
    clear_time_avg: float = 0.0
    keys: int = 0
    queue: str = ""


@dataclass(frozen=True, slots=True)
class KeyStats:
    """One key's state: its work queue's ``backlog`` (visible + delayed), ``in_flight`` and
    ``oldest_age``, the slices running on it (``active``), its pending signals, plan,
    state and tenant."""

    key: str
    tenant: str
    plan: str
    state: str
    backlog: int
    in_flight: int
    oldest_age: float
    active: int
    pending: int
    processed: int


class Attention:
    """A handle to one attention domain; ``broker.attention(domain)`` makes one."""

    __slots__ = ("_backend", "_max_bytes", "name")

    def __init__(self, backend: Backend, name: str, max_message_bytes: int) -> None:
        self.name = check_name(name, "attention domain")
        self._backend = backend
        self._max_bytes = max_message_bytes

    def __repr__(self) -> str:
        return f"Attention({self.name!r})"

    @property
    def queue_name(self) -> str:
        """The name of the domain's attention queue."""
        return f"attention.{self.name}.work"

    async def config(self) -> AttentionConfig:
        """The options the domain is declared with."""
        return await self._backend.attention_config(self.name)

    async def queue(self, key: str) -> Queue:
        """The work queue handle of ``key`` (for stats, peeking, redrive)."""
        config = await self.config()
        return Queue(self._backend, config.queue_for(self.name, check_key(key)), self._max_bytes)

    async def publish(
        self,
        key: str,
        body: object,
        attributes: Mapping[str, str] | None = None,
        delay: float = 0.0,
        priority: int = 0,
        group: str | None = None,
        dedup_id: str | None = None,
        timeout: float | None = None,
    ) -> str:
        """Store a work message for ``key`` and make sure a signal for the key is pending,
        in one atomic step; return the message id. A key seen for the first time gets the
        default plan, state ``active`` and itself as tenant. Publishing to a ``removed``
        key raises ``InvalidOption`` (``set_resource(key, state="active")`` revives it)."""
        (mid,) = await self.publish_batch(
            key, [Outgoing(body, attributes, delay, priority, group, dedup_id)], timeout=timeout
        )
        return mid

    async def publish_batch(
        self, key: str, messages: Iterable[Outgoing], timeout: float | None = None
    ) -> list[str]:
        """Publish many work messages for one key in one atomic step."""
        check_key(key)
        envs = make_envelopes(messages, self._max_bytes, "publish_batch")
        if not envs:
            return []
        backend = self._backend
        return await wait_for_room(
            backend, None, timeout, lambda: backend.attention_publish(self.name, key, envs)
        )

    async def set_resource(
        self,
        key: str,
        plan: str | None = None,
        state: ResourceState | None = None,
        tenant: str | None = None,
    ) -> None:
        """Set a key's plan, state and/or tenant (creating the key if new). A key made
        ``active`` again after ``paused``/``maintenance`` is signalled if it has backlog."""
        check_key(key)
        if state is not None and state not in RESOURCE_STATES:
            raise InvalidOption(f"state must be one of {', '.join(RESOURCE_STATES)}, got {state!r}")
        if tenant is not None:
            check_key(tenant, "tenant")
        if plan is not None and not isinstance(plan, str):
            raise InvalidOption(f"plan must be a plan name, got {plan!r}")
        await self._backend.attention_set_resource(self.name, key, plan, state, tenant)

    async def remove(self, key: str, purge: bool = False) -> None:
        """Mark ``key`` removed: its signals are dropped (counted) and nobody consumes its
        queue; ``purge=True`` also deletes the messages waiting in it."""
        check_key(key)
        await self._backend.attention_set_resource(self.name, key, None, "removed", None)
        if purge:
            q = await self.queue(key)
            if q.name in await self._backend.list_queues(q.name):
                await q.purge()

    async def stats(self) -> AttentionStats:
        """The domain's counters."""
        return await self._backend.attention_stats(self.name)

    async def key_stats(self, top: int = 50) -> list[KeyStats]:
        """The ``top`` keys by backlog (then in-flight), busiest first."""
        if isinstance(top, bool) or not isinstance(top, int) or top < 1:
            raise InvalidOption(f"top must be a positive integer, got {top!r}")
        return await self._backend.attention_key_stats(self.name, top)

    async def reconcile(self) -> int:
        """Signal every active key that has backlog, no pending signal and no running slice
        (a lost signal); return how many. Workers run this every ``reconcile_interval``."""
        return await self._backend.attention_reconcile(self.name)

    # -- for the worker runtime ------------------------------------------------------------
    async def _take(self, wait: float) -> Slice | None:
        """Take the next signal and its slice, waiting up to ``wait`` seconds for one."""
        backend = self._backend
        wakeups = backend.wakeups
        token_name = f"attention:{self.name}"
        import asyncio

        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        while True:
            token = wakeups.token(token_name)
            got = await backend.attention_take(self.name)
            if got is not None or wait <= 0:
                return got
            remaining = deadline - loop.time()
            if remaining <= 0:
                return None
            await wakeups.wait(token, remaining)

    async def _receive(
        self, s: Slice, n: int, visibility_timeout: float | None
    ) -> tuple[list[Received], float | None]:
        """Lease up to ``n`` messages of the slice's queue (fewer if the key's rate allows
        fewer); when none, also say when the rate allows more (None: the queue is empty)."""
        msgs, retry_at = await self._backend.attention_receive(
            self.name, s.token, n, visibility_timeout
        )
        q = Queue(self._backend, s.queue, self._max_bytes)
        for m in msgs:
            m._queue = q
            m.key = s.key
        return msgs, retry_at

    async def _extend(self, s: Slice) -> bool:
        """Keep the slice's concurrency token; False if it was lost."""
        return await self._backend.attention_extend(self.name, s.token)

    async def _end(self, s: Slice, processed: int, retry_at: float | None) -> None:
        """End the slice: release the token; signal the key again if it has backlog left
        (at ``retry_at`` when the key's rate ran out)."""
        await self._backend.attention_end(self.name, s.token, processed, retry_at)
