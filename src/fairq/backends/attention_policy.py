"""The attention rules of SPEC §5, as pure functions every backend applies the same way.

A backend reads a key's state inside its atomic step, asks :func:`on_signal` what to do
with a signal it took, :func:`on_slice_end` what to do when a slice ends, and keeps the
key's token bucket with :func:`refill`. Only the storage differs between engines.

The scheduler (rule 4) is start-time fair queueing over tenants, in virtual time; an
engine keeps, per domain, a virtual ``clock`` and a cost ``estimate``; per tenant, its
virtual time ``vt``, its own ``estimate``, its ready-signal count and a tie-break
``turn``; per running slice, the tenant it charged, the ``charged`` amount and when it was
taken. Then:

* take: among tenants with a ready signal, the smallest ``(vt, turn)`` goes next
  (:func:`order`), its oldest ready signal first (FIFO, so its keys take turns); a signal
  that yields a slice charges the tenant :func:`on_take` (an estimate, so workers taking
  at once spread over tenants) and moves the clock; every signal taken gives the tenant a
  new ``turn`` (the domain's turn counter), so equal virtual times go round robin;
* a tenant's first ready signal (ready count 0 -> 1) sets ``vt = eligible_vt(vt, clock)``:
  idleness — or a cap it could not use — earns no credit;
* slice end: :func:`on_end` replaces the estimate with the slice's real cost
  (:func:`slice_cost` — seconds held, or messages handled — over the plan's weight), and
  :func:`next_estimate` folds that cost into the tenant's and the domain's estimates.

docs/attention.md ("The scheduler") says the same for an engine author.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ..errors import ConfigConflict
from ..model.attention import (
    DROPPING_STATES,
    PARKING_STATES,
    TENANT_WINDOW,
    AttentionConfig,
    Charge,
    Plan,
    TenantStats,
)

__all__ = [
    "ESTIMATE_WEIGHT",
    "PERMIT_MARGIN",
    "USAGE_BUCKET",
    "KeyRow",
    "KeyView",
    "SignalDecision",
    "check_change",
    "eligible_vt",
    "estimate",
    "next_estimate",
    "on_end",
    "on_signal",
    "on_slice_end",
    "on_take",
    "order",
    "refill",
    "resignal_allowed",
    "slice_cost",
    "tenant_at_cap",
    "tenant_rows",
    "usage_bucket",
    "usage_since",
]

Action = Literal["drop", "park", "block", "empty", "rate_limited", "slice"]


def check_change(domain: str, old: AttentionConfig, new: AttentionConfig, has_keys: bool) -> None:
    """Redeclaring a domain may change its options, but not ``work_queue`` or ``shards``
    once it has keys: their backlog sits in the queues the old template and shard count
    named (``ConfigConflict``)."""
    if has_keys and new.work_queue != old.work_queue:
        raise ConfigConflict(
            f"work_queue of attention domain {domain!r} cannot change once it has keys "
            f"({old.work_queue!r}); delete_attention first"
        )
    if has_keys and new.shards != old.shards:
        raise ConfigConflict(
            f"shards of attention domain {domain!r} cannot change once it has keys "
            f"({old.shards}); delete_attention first"
        )


@dataclass(frozen=True, slots=True)
class KeyView:
    """What the backend knows of a key when it decides.

    ``pending`` counts the key's signals *without* the one being decided; ``visible`` and
    ``waiting_due`` describe its work queue (the earliest time a delayed or leased message
    comes back, None if there is none); ``tokens`` is the refilled bucket level.
    """

    state: str
    active: int
    pending: int
    visible: int
    waiting_due: float | None
    tokens: float


class KeyRow:
    """A key's row as the SQL engines keep it (key, queue, tenant, plan, state, parked,
    pending, active, tokens — NULL for an unlimited bucket —, tokens_at, backlog_since),
    changed in memory; each engine's subclass writes it back with ``save``."""

    __slots__ = (
        "active",
        "backlog_since",
        "key",
        "parked",
        "pending",
        "plan",
        "queue",
        "state",
        "tenant",
        "tokens",
        "tokens_at",
    )

    def __init__(self, row: tuple[Any, ...]) -> None:
        (
            self.key,
            self.queue,
            self.tenant,
            self.plan,
            self.state,
            self.parked,
            self.pending,
            self.active,
            tokens,
            self.tokens_at,
            self.backlog_since,
        ) = row
        self.tokens = math.inf if tokens is None else float(tokens)


@dataclass(frozen=True, slots=True)
class SignalDecision:
    """What to do with a signal: ``action``, and whether to put a signal back for the key —
    ``resignal_at`` (None: no; the current time: at the tail now; later: a delayed signal).
    ``fan_out`` asks for one more signal so another worker can join the slice."""

    action: Action
    resignal_at: float | None = None
    fan_out: bool = False


def resignal_allowed(plan: Plan, active: int, pending: int) -> bool:
    """SPEC §5 rule 2: pending signals plus running slices stay within max_concurrency."""
    return pending + active < plan.max_concurrency


def publish_signals(state: str, parked: bool) -> bool:
    """SPEC §5 rule 3 (a): a key parked by a signal that found it paused or in maintenance
    is signalled again when it becomes active (``set_resource``), not by each publish."""
    return not (parked and state in PARKING_STATES)


def refill(tokens: float, at: float, now: float, plan: Plan) -> float:
    """The bucket level at ``now``, given ``tokens`` at time ``at`` (inf without a rate)."""
    if plan.rate is None:
        return math.inf
    return min(plan.bucket, tokens + max(0.0, now - at) * plan.rate)


#: how much later than the exact refill a rate-limited key's signal comes due (seconds)
PERMIT_MARGIN = 1e-6


def next_permit(tokens: float, now: float, plan: Plan) -> float:
    """When the bucket holds enough for a worthwhile slice again: half of a full bucket or
    of a full slice, whichever is smaller, in whole messages (at least one).

    A worthwhile slice, so a rate-limited key wakes a few times a second, not once per
    token; half of it, so the bucket still has room when the signal comes due: tokens stop
    accruing at the bucket's cap, and a take up to ``(bucket - permit) / rate`` late (the
    take, a busy worker, a loaded engine) then loses none of its rate. The price is twice
    the takes of waiting for a full bucket. With ``burst=1`` there is no room to keep: the
    key is signalled for its next token.
    """
    assert plan.rate is not None
    want = max(1.0, min(plan.bucket, float(plan.max_messages)))
    permit = max(1.0, math.ceil(want / 2))
    if tokens >= permit:
        return now
    # a microsecond more, so that the refill at the due time (epoch seconds, rounded to a
    # double) reads the whole tokens waited for, not 4.9999...
    return now + (permit - tokens) / plan.rate + PERMIT_MARGIN


def on_signal(key: KeyView, plan: Plan, now: float) -> SignalDecision:
    """SPEC §5 rule 3, steps (a)-(d), for a signal just taken."""
    if key.state in DROPPING_STATES:
        return SignalDecision("drop")
    if key.state in PARKING_STATES:
        return SignalDecision("park")
    if key.active >= plan.max_concurrency:
        keep = resignal_allowed(plan, key.active, key.pending)
        return SignalDecision("block", now if keep else None)
    if key.visible == 0:
        # nothing to do now; if messages come back later (a delay, a dead worker's lease),
        # look again then — unless another signal or slice will
        later = key.waiting_due
        if later is not None and key.pending == 0 and key.active == 0:
            return SignalDecision("empty", later)
        return SignalDecision("empty")
    if key.tokens < 1:
        return SignalDecision("rate_limited", next_permit(key.tokens, now, plan))
    # another worker may join only if there is more than one slice of work, a token for it,
    # and (with a rate) enough in the bucket for more than this slice
    fan_out = (
        key.visible > plan.max_messages
        and resignal_allowed(plan, key.active + 1, key.pending)
        and key.tokens >= plan.max_messages + 1
    )
    return SignalDecision("slice", fan_out=fan_out)


def on_slice_end(
    key: KeyView, plan: Plan, now: float, retry_at: float | None
) -> tuple[float | None, str | None]:
    """SPEC §5 rule 3 (f): after the token is released (``key.active`` no longer counts this
    slice), when to signal the key again and which counter it goes to."""
    if key.state in DROPPING_STATES or key.state in PARKING_STATES:
        return None, None
    if not resignal_allowed(plan, key.active, key.pending):
        return None, None
    if retry_at is not None and key.visible > 0:
        return retry_at, "rate_limited"
    if key.visible > 0:
        return now, "republished"
    if key.waiting_due is not None and key.pending == 0 and key.active == 0:
        return key.waiting_due, "republished"
    return None, None


# -- the scheduler (rule 4): start-time fair queueing over tenants, in virtual time -------
#: how much one slice's cost moves a cost estimate (an exponentially weighted mean)
ESTIMATE_WEIGHT = 0.2
#: seconds per bucket of the tenants' usage history (:class:`~fairq.TenantStats`)
USAGE_BUCKET = 5.0


def order(vt: float, turn: int) -> tuple[float, int]:
    """The sort key of a tenant with a ready signal: the smallest goes next."""
    return (vt, turn)


def eligible_vt(vt: float, clock: float) -> float:
    """A tenant's virtual time when it gets a ready signal after having none: never behind
    the domain's clock, so time it spent idle (or capped) buys it no burst of turns."""
    return max(vt, clock)


def estimate(tenant: float | None, domain: float | None) -> float:
    """What a slice is expected to cost before it runs: the tenant's own estimate, else
    the domain's (a new tenant's slices cost what slices here cost), else nothing."""
    if tenant is not None:
        return tenant
    return domain if domain is not None else 0.0


def on_take(vt: float, clock: float, expected: float, plan: Plan) -> tuple[float, float, float]:
    """A signal of a tenant at virtual time ``vt`` yields a slice expected to cost
    ``expected``: the tenant's new virtual time, the domain's new clock (the virtual time
    being served, SFQ's rule) and what was charged (to correct at the end)."""
    charged = expected / plan.weight
    return vt + charged, max(clock, vt), charged


def slice_cost(charge: Charge, held: float, handled: int) -> float:
    """What a slice cost: the seconds it held a worker (backend clock, take to end) for
    ``charge="time"``, the messages it handled for ``charge="messages"``."""
    if charge == "messages":
        return float(max(0, handled))
    return max(0.0, held)


def on_end(vt: float, charged: float, cost: float, plan: Plan) -> float:
    """The tenant's virtual time once its slice's real ``cost`` replaces what was
    ``charged`` at take."""
    return vt - charged + cost / plan.weight


def next_estimate(old: float | None, cost: float) -> float:
    """An estimate after one more slice of ``cost`` (raw, before the plan's weight)."""
    if old is None:
        return cost
    return old + ESTIMATE_WEIGHT * (cost - old)


def usage_bucket(now: float) -> int:
    """The bucket of the usage history that ``now`` falls in."""
    return math.floor(now / USAGE_BUCKET)


def usage_since(now: float) -> int:
    """The oldest bucket still inside the window (the last minute) at ``now``."""
    return usage_bucket(now) - math.ceil(TENANT_WINDOW / USAGE_BUCKET) + 1


def tenant_at_cap(keys: Iterable[tuple[int, int, int]]) -> bool:
    """``keys``: (visible, active, max_concurrency) of a tenant's active keys. At cap: it
    has backlog, and every key with backlog already runs all the slices it may."""
    backlogged = [(active, cap) for visible, active, cap in keys if visible > 0]
    return bool(backlogged) and all(active >= cap for active, cap in backlogged)


def tenant_rows(
    used: Mapping[str, tuple[float, int, int]],
    keys: Mapping[str, list[tuple[int, int, int]]],
    top: int,
) -> list[TenantStats]:
    """:class:`TenantStats` from what an engine read: ``used`` — per tenant, its busy
    seconds, slices and messages over the window; ``keys`` — per tenant, (visible, active,
    max_concurrency) of its active keys with backlog. The ``top`` by share, then backlog."""
    total = sum(u[0] for u in used.values())
    rows = []
    for name in used.keys() | keys.keys():
        busy, slices, messages = used.get(name, (0.0, 0, 0))
        mine = keys.get(name, [])
        rows.append(
            TenantStats(
                name,
                busy / total if total > 0 else 0.0,
                busy,
                slices,
                messages,
                sum(v for v, _, _ in mine),
                len(mine),
                tenant_at_cap(mine),
            )
        )
    rows.sort(key=lambda r: (-r.share, -r.backlog, r.tenant))
    return rows[:top]
