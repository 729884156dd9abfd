"""The attention scheduler's rules (``attention_policy``) as pure functions, and a model of
a domain built from nothing but them: W workers, tenants with backlogs, slices of random
cost. Shares of worker time follow the plans' weights whatever the slices cost, a capped
tenant's leftovers go to the others, and idleness earns no burst of turns."""

from __future__ import annotations

import heapq
import math
import random
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fairq
from fairq.backends.attention_policy import (
    USAGE_BUCKET,
    eligible_vt,
    estimate,
    next_estimate,
    next_permit,
    on_end,
    on_take,
    order,
    refill,
    slice_cost,
    tenant_at_cap,
    usage_bucket,
    usage_since,
)
from fairq.model.attention import TENANT_WINDOW, AttentionConfig

Plan = fairq.Plan


def test_a_tenant_back_from_idle_starts_at_the_clock() -> None:
    assert eligible_vt(3.0, 10.0) == 10.0, "idle time earns no credit"
    assert eligible_vt(12.0, 10.0) == 12.0, "nor does it forgive what was used"


def test_take_charges_the_estimate_over_the_weight_and_moves_the_clock() -> None:
    vt, clock, charged = on_take(5.0, 4.0, 2.0, Plan(weight=2.0))
    assert (vt, clock, charged) == (6.0, 5.0, 1.0)
    assert on_take(5.0, 9.0, 2.0, Plan())[1] == 9.0, "the clock never goes back"


def test_end_replaces_the_estimate_with_the_cost() -> None:
    vt, _, charged = on_take(0.0, 0.0, 2.0, Plan(weight=4.0))
    assert on_end(vt, charged, 8.0, Plan(weight=4.0)) == 2.0
    assert on_end(vt, charged, 0.0, Plan(weight=4.0)) == 0.0, "an empty slice costs nothing"


def test_cost_is_time_held_or_messages_handled() -> None:
    assert slice_cost("time", 1.5, 30) == 1.5
    assert slice_cost("messages", 1.5, 30) == 30.0
    assert slice_cost("time", -0.1, 0) == 0.0, "a clock step back is no refund"


def test_estimates() -> None:
    assert estimate(None, None) == 0.0
    assert estimate(None, 3.0) == 3.0, "a new tenant's slices cost what slices here cost"
    assert estimate(1.0, 3.0) == 1.0
    assert next_estimate(None, 4.0) == 4.0
    e = 4.0
    for _ in range(50):
        e = next_estimate(e, 1.0)
    assert e == pytest.approx(1.0, abs=1e-4)


def test_order_is_virtual_time_then_turn() -> None:
    assert sorted([order(2.0, 1), order(1.0, 9), order(1.0, 3)]) == [(1.0, 3), (1.0, 9), (2.0, 1)]


def test_at_cap_means_every_backlogged_key_runs_its_limit() -> None:
    assert tenant_at_cap([(10, 1, 1)])
    assert tenant_at_cap([(10, 2, 2), (0, 0, 1)]), "a key without backlog does not count"
    assert not tenant_at_cap([(10, 1, 1), (3, 0, 1)])
    assert not tenant_at_cap([(0, 0, 1)]) and not tenant_at_cap([])


def test_the_usage_window_is_the_last_minute() -> None:
    now = 1000.0
    buckets = range(usage_since(now), usage_bucket(now) + 1)
    assert len(buckets) == math.ceil(TENANT_WINDOW / USAGE_BUCKET)
    assert usage_bucket(now - TENANT_WINDOW + USAGE_BUCKET) in buckets
    assert usage_bucket(now - TENANT_WINDOW - 0.01) not in buckets


def test_plan_weight_and_charge_are_checked() -> None:
    for bad in (0, -1, float("nan"), float("inf"), True, "2", 1e7):
        with pytest.raises(fairq.InvalidOption, match="weight"):
            Plan(weight=bad).validated("p")  # type: ignore[arg-type]
    with pytest.raises(fairq.InvalidOption, match="charge must be 'time'"):
        AttentionConfig(charge="bytes").validated("d")  # type: ignore[arg-type]
    c = AttentionConfig(plans={"p": Plan(weight=2.5)}, default_plan="p", charge="messages")
    assert AttentionConfig.from_dict(c.to_dict()) == c
    old = c.to_dict()
    del old["charge"]
    del old["plans"]["p"]["weight"]
    assert AttentionConfig.from_dict(old).charge == "time", "a config stored before 8"
    assert AttentionConfig.from_dict(old).plans["p"].weight == 1.0


def test_a_rate_limited_key_is_signalled_for_half_a_slice() -> None:
    plan = Plan(8, 100, 20.0, rate=50.0, burst=10.0)
    near = pytest.approx
    assert next_permit(0.0, 100.0, plan) == near(100.1, abs=1e-5), "5 of the bucket's 10"
    assert next_permit(4.5, 100.0, plan) == near(100.01, abs=1e-5)
    assert next_permit(7.0, 100.0, plan) == 100.0, "enough already: now"
    small = Plan(1, 3, 20.0, rate=10.0, burst=50.0)  # a slice of 3 is worth 2 (whole messages)
    assert next_permit(0.0, 0.0, small) == near(0.2, abs=1e-5)
    one = Plan(1, 100, 20.0, rate=20.0, burst=1.0)
    assert next_permit(0.25, 0.0, one) == near(0.0375, abs=1e-5), "burst=1: the next token"


@settings(max_examples=300, deadline=None)
@given(
    now=st.floats(0.0, 4e9),
    rate=st.floats(0.01, 1e4),
    burst=st.floats(1.0, 1e3),
    fill=st.floats(0.0, 1.0, exclude_max=True),
)
def test_at_the_due_time_the_bucket_holds_the_whole_permit(
    now: float, rate: float, burst: float, fill: float
) -> None:
    plan = Plan(1, 100, 20.0, rate=rate, burst=burst)
    permit = max(1.0, math.ceil(min(burst, 100.0) / 2))
    tokens = fill * permit
    due = next_permit(tokens, now, plan)
    assert due > now
    assert math.floor(refill(tokens, now, due, plan)) >= permit, "not 4.9999... of 5"


def _drain(plan: Plan, late: float, seconds: float) -> tuple[int, int]:
    """A key with endless backlog whose signals are taken ``late`` seconds after they come
    due: each slice leases what the bucket allows, finds it empty on its next receive and
    ends with the bucket's ``next_permit``. Messages handled and takes in ``seconds``."""
    assert plan.rate is not None
    tokens, at, now = plan.bucket, 0.0, 0.0
    handled = takes = 0
    while True:
        takes += 1
        tokens, at = refill(tokens, at, now, plan), now
        n = min(plan.max_messages, math.floor(tokens))
        handled += n
        tokens -= n
        now = next_permit(tokens, now, plan) + late
        if now > seconds:
            return handled, takes


@pytest.mark.parametrize("late", [0.0, 0.002, 0.04, 0.09])
def test_a_late_take_loses_none_of_the_rate(late: float) -> None:
    plan = Plan(8, 100, 20.0, rate=50.0, burst=10.0)
    handled, takes = _drain(plan, late, 60.0)
    # the burst, then the rate: a take up to (10 - 5) / 50 = 0.1 s late loses nothing
    assert 10 + 50 * 60 - 10 <= handled <= 10 + 50 * 60
    assert takes <= 60 * 50 / 5 + 1, "woken for half a bucket, not for every token"


def test_a_take_later_than_the_bucket_holds_loses_only_the_excess() -> None:
    plan = Plan(8, 100, 20.0, rate=50.0, burst=10.0)
    handled, _ = _drain(plan, 0.14, 60.0)  # 0.04 s of each cycle past the bucket's room
    assert handled == pytest.approx(60 * 10 / 0.24, rel=0.02)
    one = Plan(1, 100, 20.0, rate=20.0, burst=1.0)
    handled, takes = _drain(one, 0.0, 60.0)
    assert handled == takes == pytest.approx(1 + 20 * 60, abs=1), "burst=1: one per token"


# -- a model domain built from the rules ----------------------------------------------------
@dataclass
class Tenant:
    name: str
    plan: Plan
    cost: tuple[float, float]  # a slice costs uniform(lo, hi) seconds
    keys: int = 1  # keys with backlog (each max_concurrency slices)
    vt: float = 0.0
    est: float | None = None
    turn: int = 0
    running: int = 0
    busy: float = 0.0
    slices: int = 0
    active: bool = True

    def eligible(self) -> bool:
        return self.active and self.running < self.keys * self.plan.max_concurrency


@dataclass
class Model:
    """Workers take the eligible tenant of least (vt, turn); a slice charges an estimate and
    its end the real cost; a tenant that was not eligible comes back at the clock."""

    tenants: list[Tenant]
    workers: int
    seed: int = 1
    now: float = 0.0
    clock: float = 0.0
    dest: float | None = None
    counter: int = 0
    ends: list[tuple[float, int, Tenant, float, float]] = field(default_factory=list)
    seq: int = 0

    def run(self, until: float) -> None:
        rng = random.Random(self.seed)
        free = self.workers - len(self.ends)
        while self.now < until:
            while free:
                ready = [t for t in self.tenants if t.eligible()]
                if not ready:
                    break
                t = min(ready, key=lambda x: order(x.vt, x.turn))
                t.vt, self.clock, charged = on_take(
                    t.vt, self.clock, estimate(t.est, self.dest), t.plan
                )
                self.counter += 1
                t.turn = self.counter
                t.running += 1
                free -= 1
                cost = rng.uniform(*t.cost)
                self.seq += 1
                heapq.heappush(self.ends, (self.now + cost, self.seq, t, charged, cost))
            if not self.ends:
                break
            end, _, t, charged, cost = heapq.heappop(self.ends)
            self.now = end
            was_eligible = t.eligible()
            t.running -= 1
            t.vt = on_end(t.vt, charged, cost, t.plan)
            t.est = next_estimate(t.est, cost)
            self.dest = next_estimate(self.dest, cost)
            t.busy += cost
            t.slices += 1
            free += 1
            if not was_eligible:  # it was at its cap: back to the clock
                t.vt = eligible_vt(t.vt, self.clock)


@settings(max_examples=40, deadline=None)
@given(
    a_cost=st.floats(0.01, 1.0),
    b_cost=st.floats(0.01, 1.0),
    weight=st.sampled_from([1.0, 2.0, 3.0]),
    workers=st.integers(1, 8),
    seed=st.integers(0, 1000),
)
def test_worker_time_follows_the_weights_whatever_slices_cost(
    a_cost: float, b_cost: float, weight: float, workers: int, seed: int
) -> None:
    a = Tenant("a", Plan(max_concurrency=8, weight=weight), (a_cost * 0.5, a_cost * 1.5))
    b = Tenant("b", Plan(max_concurrency=1), (b_cost * 0.5, b_cost * 1.5), keys=1000)
    m = Model([a, b], workers, seed)
    m.run(until=400 * max(a_cost, b_cost))
    assert a.busy / b.busy == pytest.approx(weight, rel=0.15), (a.busy, b.busy, a.slices, b.slices)


def test_a_capped_tenant_leaves_the_rest_to_the_others() -> None:
    capped = Tenant("capped", Plan(max_concurrency=1), (0.05, 0.05))
    wide = Tenant("wide", Plan(max_concurrency=1), (0.01, 0.01), keys=1000)
    m = Model([capped, wide], workers=4)
    m.run(until=100.0)
    total = capped.busy + wide.busy
    assert capped.busy / total == pytest.approx(0.25, abs=0.02), "one worker of four"
    assert total == pytest.approx(4 * 100.0, rel=0.01), "no worker idles: work-conserving"


def test_idleness_earns_no_burst_of_turns() -> None:
    a = Tenant("a", Plan(), (1.0, 1.0), keys=100)
    b = Tenant("b", Plan(), (1.0, 1.0), keys=100)
    late = Tenant("late", Plan(), (1.0, 1.0), keys=100, active=False)
    m = Model([a, b, late], workers=1)
    m.run(until=100.0)
    late.active = True
    late.vt = eligible_vt(late.vt, m.clock)
    before = (a.slices, b.slices)
    m.run(until=130.0)
    assert late.slices <= 11, "a third of the next 30 slices, not all of them"
    assert a.slices - before[0] >= 9 and b.slices - before[1] >= 9
