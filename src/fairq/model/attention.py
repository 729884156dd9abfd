"""What an attention domain is, as handles and backends both see it: plans, the domain's
options, a slice (a worker's turn on one key), key states and the counters."""

from __future__ import annotations

import math
import string
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ..errors import InvalidOption
from ..message import check_name
from .queues import queue_config_from_options

__all__ = [
    "ATTENTION_COUNTERS",
    "CHARGES",
    "DEFAULT_PLANS",
    "DROPPING_STATES",
    "LONGEST_KEY",
    "MAX_SHARDS",
    "PARKING_STATES",
    "RESOURCE_STATES",
    "SHARDED_WORK_QUEUE",
    "TENANT_WINDOW",
    "AttentionConfig",
    "AttentionStats",
    "Charge",
    "KeyStats",
    "Plan",
    "ResourceState",
    "SignalHint",
    "Slice",
    "TenantStats",
    "check_work_queue",
    "default_work_queue",
    "shard_of",
]


ResourceState = Literal["active", "paused", "maintenance", "disabled", "removed"]


RESOURCE_STATES: tuple[ResourceState, ...] = (
    "active",
    "paused",
    "maintenance",
    "disabled",
    "removed",
)


Charge = Literal["time", "messages"]

#: what a slice costs its tenant: ``time`` (seconds the slice held a worker, the default)
#: or ``messages`` (messages it handled)
CHARGES: tuple[Charge, ...] = ("time", "messages")

#: seconds of history behind :class:`TenantStats` (the last minute)
TENANT_WINDOW = 60.0


#: states whose signals are dropped (and counted); paused/maintenance park the key instead
DROPPING_STATES = ("disabled", "removed")


PARKING_STATES = ("paused", "maintenance")


@dataclass(frozen=True, slots=True)
class Plan:
    """How much of the workers one key may use.

    ``max_concurrency`` slices of the key may run at once (1: its messages are handled one
    at a time, in order); a slice handles at most ``max_messages`` messages and runs at most
    ``max_time`` seconds; ``rate`` (messages per second, across all workers) with ``burst``
    caps the key with a token bucket kept in the backend (None: no cap). ``weight`` is the
    share of worker time a slice of the key buys its tenant: a slice is charged its cost
    divided by ``weight``, so keys on a plan of weight 2 get twice the worker time of keys
    on a plan of weight 1 when both are backlogged.
    """

    max_concurrency: int = 1
    max_messages: int = 50
    max_time: float = 20.0
    rate: float | None = None
    burst: float | None = None
    weight: float = 1.0

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
        if not _positive(self.weight) or self.weight > 1e6:
            raise InvalidOption(f"{where}: weight must be a number > 0 (at most 1e6)")
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
            "weight": self.weight,
        }


def _positive(x: object) -> bool:
    return not isinstance(x, bool) and isinstance(x, int | float) and math.isfinite(x) and x > 0


DEFAULT_PLANS = {
    "basic": Plan(1, 50, 20.0),
    "pro": Plan(3, 200, 20.0),
    "enterprise": Plan(10, 1000, 20.0),
}


#: the longest attention key (``message.check_key``): what a work queue name must fit
LONGEST_KEY = 100

#: the most shards a domain may have
MAX_SHARDS = 1024

#: the default work queue template of a domain of more than one shard: each shard's queues
#: form a family of their own (on Redis Cluster: a slot of their own)
SHARDED_WORK_QUEUE = "{domain}-{shard}.{key}.work"


def default_work_queue(shards: int) -> str:
    """The work queue template a domain of ``shards`` shards gets unless it names one."""
    return "process.{domain}.{key}.work" if shards == 1 else SHARDED_WORK_QUEUE


def shard_of(key: str, shards: int) -> int:
    """The shard of ``key`` in a domain of ``shards`` shards: CRC-32 of its UTF-8 bytes
    modulo ``shards`` — stable across processes, hosts and Python versions."""
    return zlib.crc32(key.encode("utf-8")) % shards if shards > 1 else 0


def check_work_queue(template: object, domain: str, shards: int = 1) -> None:
    """Raise ``InvalidOption`` unless ``template`` is a work queue template of ``domain``:
    text with plain ``{domain}``, ``{key}`` and ``{shard}`` fields only — no format spec,
    conversion, index or other name, since ``str.format`` would obey
    ``{key:x>99999999999}`` and allocate that much — that contains ``{key}`` (and
    ``{shard}`` when the domain has more than one shard) and makes a valid queue name for
    the longest key (100 characters)."""
    if not isinstance(template, str):
        raise InvalidOption(f"work_queue must be a string, got {template!r}")
    example = "'process.{domain}.{key}.work'"
    try:
        fields = [
            (name, spec, conversion)
            for _, name, spec, conversion in string.Formatter().parse(template)
            if name is not None
        ]
    except ValueError as exc:  # a lone brace
        raise InvalidOption(f"work_queue {template!r} is not a template ({exc})") from None
    for name, spec, conversion in fields:
        if name not in ("domain", "key", "shard") or spec or conversion:
            raise InvalidOption(
                f"work_queue {template!r} may use only plain {{domain}}, {{key}} and "
                f"{{shard}} fields (no format spec or conversion), e.g. {example}"
            )
    if not any(name == "key" for name, _, _ in fields):
        raise InvalidOption(f"work_queue must contain {{key}}, e.g. {example}")
    if shards > 1 and not any(name == "shard" for name, _, _ in fields):
        raise InvalidOption(
            f"work_queue {template!r} of a domain of {shards} shards must contain {{shard}} "
            f"(each key's queue is named with its shard), e.g. {SHARDED_WORK_QUEUE!r}"
        )
    longest = template.format(domain=domain, key="k" * LONGEST_KEY, shard=MAX_SHARDS - 1)
    if len(longest) > 200:
        raise InvalidOption(
            f"work_queue {template!r} makes names of {len(longest)} characters for the "
            f"longest keys ({LONGEST_KEY}) of domain {domain!r}; queue names have at most 200"
        )
    check_name(longest, "work queue")


@dataclass(frozen=True, slots=True)
class AttentionConfig:
    """The options of an attention domain (see ``Broker.declare_attention``)."""

    plans: Mapping[str, Plan] = field(default_factory=lambda: dict(DEFAULT_PLANS))
    default_plan: str = "basic"
    work_queue: str = "process.{domain}.{key}.work"
    queue_options: Mapping[str, Any] = field(default_factory=dict)
    slice_lease: float = 30.0
    charge: Charge = "time"
    shards: int = 1

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
        if (
            isinstance(self.shards, bool)
            or not isinstance(self.shards, int)
            or not 1 <= self.shards <= MAX_SHARDS
        ):
            raise InvalidOption(f"shards must be an integer from 1 to {MAX_SHARDS}")
        check_work_queue(self.work_queue, domain, self.shards)
        if not _positive(self.slice_lease):
            raise InvalidOption("slice_lease must be a number of seconds > 0")
        if self.charge not in CHARGES:
            raise InvalidOption(
                f"charge must be 'time' (a slice costs the seconds it holds a worker) or "
                f"'messages' (the messages it handles), got {self.charge!r}"
            )
        queue_config_from_options(self.queue_for(domain, "k"), dict(self.queue_options))
        return self

    def queue_for(self, domain: str, key: str) -> str:
        """The work queue of ``key``."""
        return self.work_queue.format(domain=domain, key=key, shard=shard_of(key, self.shards))

    def shard_queue(self, domain: str, shard: int) -> str:
        """A work queue name of shard ``shard`` (any key's: its family is the shard's)."""
        return self.work_queue.format(domain=domain, key="k", shard=shard)

    def to_dict(self) -> dict[str, Any]:
        return {
            "plans": {n: p.to_dict() for n, p in self.plans.items()},
            "default_plan": self.default_plan,
            "work_queue": self.work_queue,
            "queue_options": dict(self.queue_options),
            "slice_lease": self.slice_lease,
            "charge": self.charge,
            "shards": self.shards,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AttentionConfig:
        return cls(
            plans={n: Plan(**p) for n, p in data["plans"].items()},
            default_plan=data["default_plan"],
            work_queue=data["work_queue"],
            queue_options=dict(data.get("queue_options", {})),
            slice_lease=float(data.get("slice_lease", 30.0)),
            charge=data.get("charge", "time"),
            shards=int(data.get("shards", 1)),
        )

    def uses_worker_time_fairness(self) -> bool:
        """Whether the domain asks for more than every engine's scheduler does: a plan
        weight other than 1 or ``charge="messages"`` (capability ``worker_time_fairness``)."""
        return self.charge != "time" or any(p.weight != 1.0 for p in self.plans.values())


@dataclass(frozen=True, slots=True)
class Slice:
    """A worker's turn on one key: handle at most ``plan.max_messages`` messages of
    ``queue`` within ``plan.max_time`` seconds, under the concurrency token ``token``."""

    domain: str
    key: str
    queue: str
    token: str
    plan: Plan


@dataclass(frozen=True, slots=True)
class SignalHint:
    """What a cheap look (no write) says a take would find: ``ready`` — a signal is ready
    now; else ``due`` — when the earliest delayed signal comes due or a slice's token
    lease ends (which may free a key), None if there is neither."""

    ready: bool
    due: float | None


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


@dataclass(frozen=True, slots=True)
class TenantStats:
    """One tenant of a domain over the last minute (:data:`TENANT_WINDOW`, kept in 5 s
    buckets, so 55-60 s): ``share`` is the fraction of the domain's worker time (the time
    its slices held a worker) that went to this tenant's slices; ``busy`` those seconds,
    ``slices`` and ``messages`` the slices it ended and the messages they handled. Now:
    ``backlog`` visible messages in its active keys, ``keys`` how many of them have some,
    and ``at_cap`` — it has backlog, but every backlogged key already runs
    ``max_concurrency`` slices, so it cannot use more workers (what it leaves goes to
    the others)."""

    tenant: str
    share: float
    busy: float
    slices: int
    messages: int
    backlog: int
    keys: int
    at_cap: bool
