"""The attention rules of SPEC §5, as pure functions every backend applies the same way.

A backend reads a key's state inside its atomic step, asks :func:`on_signal` what to do
with a signal it took, :func:`on_slice_end` what to do when a slice ends, and keeps the
key's token bucket with :func:`refill`. Only the storage differs between engines.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from ..errors import ConfigConflict
from ..model.attention import DROPPING_STATES, PARKING_STATES, AttentionConfig, Plan

__all__ = [
    "KeyView",
    "SignalDecision",
    "check_change",
    "on_signal",
    "on_slice_end",
    "refill",
    "resignal_allowed",
]

Action = Literal["drop", "park", "block", "empty", "rate_limited", "slice"]


def check_change(domain: str, old: AttentionConfig, new: AttentionConfig, has_keys: bool) -> None:
    """Redeclaring a domain may change its options, but not ``work_queue`` once it has
    keys: their backlog sits in the queues the old template named (``ConfigConflict``)."""
    if has_keys and new.work_queue != old.work_queue:
        raise ConfigConflict(
            f"work_queue of attention domain {domain!r} cannot change once it has keys "
            f"({old.work_queue!r}); delete_attention first"
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


def refill(tokens: float, at: float, now: float, plan: Plan) -> float:
    """The bucket level at ``now``, given ``tokens`` at time ``at`` (inf without a rate)."""
    if plan.rate is None:
        return math.inf
    return min(plan.bucket, tokens + max(0.0, now - at) * plan.rate)


def next_permit(tokens: float, now: float, plan: Plan) -> float:
    """When the bucket holds enough for a worthwhile slice again: a full bucket or a full
    slice, whichever is smaller (so a rate-limited key wakes a few times a second, not once
    per token, and still gets exactly its rate)."""
    assert plan.rate is not None
    want = max(1.0, min(plan.bucket, float(plan.max_messages)))
    return now + max(0.0, want - tokens) / plan.rate


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
