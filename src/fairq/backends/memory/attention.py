"""The memory backend's attention domains: keys, signals, slices and token buckets.

Signals wait per tenant in FIFO order; tenants with a ready signal wait in a heap ordered
by virtual time, then turn (``attention_policy``'s scheduler), so a tenant with 1,000 keys
gets as much worker time as a tenant with one. Entries of that heap go stale when a
tenant's virtual time or turn changes (a fresh one is pushed) and are skipped when popped.
Delayed signals and slice leases live in heaps ordered by due time.
"""

from __future__ import annotations

import heapq
import itertools
import math
import secrets
from collections import deque
from dataclasses import dataclass, field

from ...clock import Clock
from ...errors import AttentionNotFound, InvalidOption, LeaseLost
from ...message import Received, id_time
from ...model.attention import (
    ATTENTION_COUNTERS,
    AttentionConfig,
    AttentionStats,
    KeyStats,
    Plan,
    SignalHint,
    Slice,
    TenantStats,
)
from ...model.queues import Envelope, QueueConfig
from .. import heaps
from ..attention_policy import (
    KeyView,
    check_change,
    eligible_vt,
    estimate,
    next_estimate,
    next_permit,
    on_end,
    on_signal,
    on_slice_end,
    on_take,
    publish_signals,
    refill,
    resignal_allowed,
    slice_cost,
    tenant_rows,
    usage_bucket,
    usage_since,
)
from .queues import WAITING, MemoryQueues, _Queue

_MAX_SIGNALS_PER_TAKE = 256


@dataclass(slots=True, eq=False)
class _Signal:
    seq: int
    key: str
    due: float
    live: bool = True


@dataclass(slots=True, eq=False)
class _Key:
    key: str
    tenant: str
    plan: str
    state: str = "active"
    parked: bool = False
    pending: int = 0  # live signals, ready or delayed
    delayed: int = 0  # of which in the delayed heap
    active: int = 0
    tokens: float = math.inf
    tokens_at: float = 0.0
    backlog_since: float | None = None
    processed: int = 0


@dataclass(slots=True, eq=False)
class _Tenant:
    name: str
    turn: int = 0
    vt: float = 0.0  # virtual time: worker time (or messages) used, over the plans' weights
    estimate: float | None = None  # what one of its slices costs, as measured so far
    live: int = 0  # live signals in ``ready``
    ready: deque[_Signal] = field(default_factory=deque)
    usage: deque[list[float]] = field(default_factory=deque)  # [bucket, busy, slices, msgs]


@dataclass(slots=True, eq=False)
class _SliceRec:
    token: str
    key: str
    lease_until: float
    tenant: str = ""
    charged: float = 0.0
    taken_at: float = 0.0
    counted: int = 0  # messages counted as processed before the end (attention_count)


@dataclass(slots=True, eq=False)
class _Domain:
    name: str
    config: AttentionConfig
    keys: dict[str, _Key] = field(default_factory=dict)
    tenants: dict[str, _Tenant] = field(default_factory=dict)
    turns: list[tuple[float, int, int, str]] = field(default_factory=list)  # vt, turn, seq
    clock: float = 0.0  # the domain's virtual clock: the virtual time last served
    estimate: float | None = None  # what a slice of this domain costs, as measured so far
    ready: int = 0  # live ready signals, over all tenants
    delayed: list[tuple[float, int, _Signal]] = field(default_factory=list)
    slices: dict[str, _SliceRec] = field(default_factory=dict)
    leases: list[tuple[float, str]] = field(default_factory=list)  # (lease end, token)
    leases_limit: int = heaps.COMPACT_MIN  # (heaps.push: ended or extended slices)
    turn_counter: int = 0
    counters: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ATTENTION_COUNTERS, 0))
    discarded: dict[str, int] = field(default_factory=dict)
    clear_sum: float = 0.0
    clear_count: int = 0


def _lease_end(d: _Domain, until: float, token: str) -> None:
    """Keep the slice ``token`` until ``until`` (its entry in the domain's lease heap)."""

    def current(entry: tuple[float, str]) -> bool:
        rec = d.slices.get(entry[1])
        return rec is not None and rec.lease_until == entry[0]

    d.leases_limit = heaps.push(d.leases, (until, token), d.leases_limit, current)


class MemoryAttention(MemoryQueues):
    """Attention domains on top of the memory queues."""

    def __init__(self, clock: Clock) -> None:
        super().__init__(clock)
        self._domains: dict[str, _Domain] = {}
        self._seq = itertools.count(1)

    # -- helpers ---------------------------------------------------------------------------
    def _domain(self, name: str) -> _Domain:
        self._open()
        d = self._domains.get(name)
        if d is None:
            raise AttentionNotFound(name)
        return d

    def _key(self, d: _Domain, key: str, now: float) -> _Key:
        k = d.keys.get(key)
        if k is None:
            k = d.keys[key] = _Key(key, key, d.config.default_plan, tokens_at=now)
        return k

    def _plan(self, d: _Domain, k: _Key) -> Plan:
        return d.config.plans.get(k.plan) or d.config.plans[d.config.default_plan]

    def _work_queue(self, d: _Domain, key: str) -> _Queue | None:
        return self._queues.get(d.config.queue_for(d.name, key))

    def _view(self, d: _Domain, k: _Key, now: float) -> KeyView:
        q = self._work_queue(d, k.key)
        visible = q.visible if q is not None else 0
        waiting_due = None
        if not visible and q is not None and (q.delayed or q.in_flight):  # only needed then
            waiting_due = min(m.avail_at for m in q.msgs.values() if m.state == WAITING)
        tokens = refill(k.tokens, k.tokens_at, now, self._plan(d, k))
        return KeyView(k.state, k.active, k.pending, visible, waiting_due, tokens)

    def _signal(self, d: _Domain, k: _Key, due: float, now: float) -> None:
        """Put a signal for ``k`` at the tail of its tenant (or in the delayed heap)."""
        sig = _Signal(next(self._seq), k.key, due)
        k.pending += 1
        if due > now:
            heapq.heappush(d.delayed, (due, sig.seq, sig))
            k.delayed += 1
        else:
            self._ready(d, k.tenant, sig)
        self.wakeups.notify([f"attention:{d.name}"])

    def _ready(self, d: _Domain, tenant: str, sig: _Signal) -> None:
        t = d.tenants.get(tenant)
        if t is None:
            t = d.tenants[tenant] = _Tenant(tenant, vt=d.clock)
        if not t.live:
            t.vt = eligible_vt(t.vt, d.clock)
            heapq.heappush(d.turns, (t.vt, t.turn, sig.seq, tenant))
        t.ready.append(sig)
        t.live += 1
        d.ready += 1

    def _requeue(self, d: _Domain, t: _Tenant) -> None:
        """A tenant whose virtual time or turn changed gets a fresh heap entry (if ready)."""
        while t.ready and not t.ready[0].live:
            t.ready.popleft()
        if t.live:
            heapq.heappush(d.turns, (t.vt, t.turn, t.ready[0].seq, t.name))

    def _sweep_domain(self, d: _Domain, now: float) -> None:
        """Delayed signals that came due join their tenant; expired slices free their token."""
        while d.delayed and d.delayed[0][0] <= now:
            _, _, sig = heapq.heappop(d.delayed)
            if sig.live:
                k = d.keys.get(sig.key)
                if k is not None:
                    k.delayed -= 1
                    self._ready(d, k.tenant, sig)
        while d.leases and d.leases[0][0] <= now:
            _, token = heapq.heappop(d.leases)
            rec = d.slices.get(token)
            if rec is not None and rec.lease_until <= now:
                self._end_slice(d, rec, 0, None, now, expired=True)

    def _next_signal(self, d: _Domain) -> tuple[_Tenant, _Signal] | None:
        """Pop the next tenant's oldest ready signal and give the tenant its new turn; the
        caller decides, charges, then calls :meth:`_served` (until then the signal still
        counts as ready, so a re-signal of the tenant in between is no return from idle)."""
        while d.turns:
            vt, turn, _, tenant = heapq.heappop(d.turns)
            t = d.tenants[tenant]
            while t.ready and not t.ready[0].live:
                t.ready.popleft()
            if not t.live or (t.vt, t.turn) != (vt, turn):
                continue  # stale: the tenant has a fresh entry, or no ready signal
            sig = t.ready.popleft()
            d.turn_counter += 1
            t.turn = d.turn_counter
            return t, sig
        return None

    def _served(self, d: _Domain, t: _Tenant) -> None:
        t.live -= 1
        d.ready -= 1
        self._requeue(d, t)

    def _end_slice(
        self,
        d: _Domain,
        rec: _SliceRec,
        processed: int,
        retry_at: float | None,
        now: float,
        expired: bool = False,
    ) -> None:
        del d.slices[rec.token]
        # the domain counts every message once: what the slice counted on the way when it
        # expired, else all it handled; its key has the counted ones already
        d.counters["processed"] += rec.counted if expired else processed
        k = d.keys.get(rec.key)
        if k is None:
            return
        t = d.tenants.get(rec.tenant)
        if t is not None and not expired:  # a dead worker's slice keeps its estimate
            held = now - rec.taken_at
            cost = slice_cost(d.config.charge, held, processed)
            t.vt = on_end(t.vt, rec.charged, cost, self._plan(d, k))
            t.estimate = next_estimate(t.estimate, cost)
            d.estimate = next_estimate(d.estimate, cost)
            self._requeue(d, t)
            _use(t, now, held, processed)
        k.active -= 1
        if not expired:
            k.processed += max(0, processed - rec.counted)
        view = self._view(d, k, now)
        when, counter = on_slice_end(view, self._plan(d, k), now, retry_at)
        if when is not None and counter is not None:
            d.counters[counter] += 1
            self._signal(d, k, when, now)
        self._note_backlog(d, k, view.visible + (1 if view.waiting_due is not None else 0), now)

    def _note_backlog(self, d: _Domain, k: _Key, backlog: int, now: float) -> None:
        if backlog and k.backlog_since is None:
            k.backlog_since = now
        elif not backlog and k.backlog_since is not None:
            d.clear_sum += now - k.backlog_since
            d.clear_count += 1
            k.backlog_since = None

    # -- domains ---------------------------------------------------------------------------
    async def declare_attention(self, domain: str, config: AttentionConfig) -> None:
        self._open()
        d = self._domains.get(domain)
        if d is None:
            self._domains[domain] = _Domain(domain, config)
        else:
            check_change(domain, d.config, config, bool(d.keys))
            d.config = config

    async def attention_config(self, domain: str) -> AttentionConfig:
        return self._domain(domain).config

    async def list_attention(self, prefix: str = "") -> list[str]:
        self._open()
        return sorted(n for n in self._domains if n.startswith(prefix))

    async def delete_attention(self, domain: str) -> bool:
        self._open()
        return self._domains.pop(domain, None) is not None

    # -- the slice cycle -------------------------------------------------------------------
    async def attention_publish(
        self, domain: str, key: str, envelopes: list[Envelope]
    ) -> list[str]:
        now = self.clock.now()
        self._sweep(now)
        d = self._domain(domain)
        self._sweep_domain(d, now)
        k = d.keys.get(key)
        if k is not None and k.state == "removed":
            raise InvalidOption(
                f"key {key!r} of {domain!r} was removed; set_resource(key, state='active') first"
            )
        name = d.config.queue_for(domain, key)
        q = self._queues.get(name)
        if q is None:
            from ...model.queues import queue_config_from_options

            config: QueueConfig = queue_config_from_options(name, dict(d.config.queue_options))
            await self.declare_queue(name, config)
            q = self._queues[name]
        plan, victims = self._plan_send(q, envelopes, now)  # checks before any change
        k = self._key(d, key, now)
        ids = self._apply_send(q, plan, victims, now)
        self._note_backlog(d, k, len(q.msgs), now)
        p = self._plan(d, k)
        if k.pending == 0 and not publish_signals(k.state, k.parked):
            pass  # parked while paused: set_resource(state="active") signals it
        elif k.pending == 0 and resignal_allowed(p, k.active, k.pending):
            due = (
                now
                if q.visible
                else min((m.avail_at for m in q.msgs.values() if m.state == WAITING), default=now)
            )
            self._signal(d, k, due, now)
        elif q.visible and k.delayed and k.pending == k.delayed:
            self._pull_forward(d, k, now)  # an immediate message behind delayed signals only
        return ids

    def _pull_forward(self, d: _Domain, k: _Key, now: float) -> None:
        """Replace the key's earliest delayed signal with a ready one."""
        sig = min((s for _, _, s in d.delayed if s.key == k.key and s.live), key=lambda s: s.due)
        sig.live = False
        k.pending -= 1
        k.delayed -= 1
        self._signal(d, k, now, now)

    async def attention_take(self, domain: str) -> Slice | None:
        now = self.clock.now()
        self._sweep(now)
        d = self._domain(domain)
        self._sweep_domain(d, now)
        for _ in range(_MAX_SIGNALS_PER_TAKE):
            got = self._next_signal(d)
            if got is None:
                return None
            t, sig = got
            k = d.keys.get(sig.key)
            if k is None:
                self._served(d, t)
                continue
            k.pending -= 1
            plan = self._plan(d, k)
            view = self._view(d, k, now)
            decision = on_signal(view, plan, now)
            action = decision.action
            if action == "drop":
                d.discarded[k.state] = d.discarded.get(k.state, 0) + 1
            elif action == "park":
                k.parked = True
                d.counters["parked"] += 1
            elif action in ("block", "empty", "rate_limited"):
                d.counters[action if action != "block" else "blocked"] += 1
                if action == "rate_limited":
                    k.tokens, k.tokens_at = view.tokens, now
                if action == "empty" and decision.resignal_at is None:
                    self._note_backlog(d, k, 0 if view.waiting_due is None else 1, now)
            if decision.resignal_at is not None:
                self._signal(d, k, decision.resignal_at, now)
            if action != "slice":
                self._served(d, t)
                continue
            t.vt, d.clock, charged = on_take(t.vt, d.clock, estimate(t.estimate, d.estimate), plan)
            self._served(d, t)
            token = secrets.token_hex(12)
            lease_until = now + d.config.slice_lease
            d.slices[token] = _SliceRec(token, k.key, lease_until, t.name, charged, now)
            _lease_end(d, lease_until, token)
            k.active += 1
            k.tokens, k.tokens_at = view.tokens, now
            if decision.fan_out:
                self._signal(d, k, now, now)
            return Slice(domain, k.key, d.config.queue_for(domain, k.key), token, plan)
        return None

    def _slice(self, d: _Domain, token: str, now: float) -> _SliceRec | None:
        rec = d.slices.get(token)
        return rec if rec is not None and rec.lease_until > now else None

    async def attention_receive(
        self, domain: str, token: str, n: int, visibility_timeout: float | None
    ) -> tuple[list[Received], float | None]:
        now = self.clock.now()
        self._sweep(now)
        d = self._domain(domain)
        self._sweep_domain(d, now)
        rec = self._slice(d, token, now)
        if rec is None:
            raise LeaseLost([token], "the slice's concurrency token expired")
        k = d.keys[rec.key]
        plan = self._plan(d, k)
        tokens = refill(k.tokens, k.tokens_at, now, plan)
        allowed = n if tokens == math.inf else min(n, int(tokens))
        if allowed < 1:
            k.tokens, k.tokens_at = tokens, now
            return [], next_permit(tokens, now, plan)
        name = d.config.queue_for(domain, k.key)
        if name not in self._queues:
            return [], None
        got = await self.receive(name, allowed, visibility_timeout)
        if tokens != math.inf:
            k.tokens, k.tokens_at = tokens - len(got), now
        return got, None

    async def attention_extend(self, domain: str, token: str) -> bool:
        now = self.clock.now()
        d = self._domain(domain)
        self._sweep_domain(d, now)
        rec = self._slice(d, token, now)
        if rec is None:
            return False
        rec.lease_until = now + d.config.slice_lease
        _lease_end(d, rec.lease_until, token)
        return True

    async def attention_end(
        self, domain: str, token: str, processed: int, retry_at: float | None
    ) -> None:
        now = self.clock.now()
        self._sweep(now)
        d = self._domain(domain)
        self._sweep_domain(d, now)
        rec = d.slices.get(token)
        if rec is None:  # expired and already swept, with what it had counted
            return
        self._end_slice(d, rec, processed, retry_at, now)

    async def attention_count(self, domain: str, token: str, key: str, n: int) -> None:
        d = self._domains.get(domain)
        if d is None:
            return
        k = d.keys.get(key)
        if k is not None:
            k.processed += n
        rec = d.slices.get(token)
        if rec is not None:
            rec.counted += n  # the domain takes them at the slice's end (or expiry)
        else:  # ended already (its token expired): the domain's count now
            d.counters["processed"] += n

    # -- resources -------------------------------------------------------------------------
    async def attention_set_resource(
        self, domain: str, key: str, plan: str | None, state: str | None, tenant: str | None
    ) -> None:
        now = self.clock.now()
        d = self._domain(domain)
        self._sweep_domain(d, now)
        if plan is not None and plan not in d.config.plans:
            raise InvalidOption(
                f"no plan {plan!r} in {domain!r} (plans: {', '.join(d.config.plans)})"
            )
        k = self._key(d, key, now)
        if plan is not None:
            k.plan = plan
        if tenant is not None and tenant != k.tenant:
            self._move_tenant(d, k, tenant)
        if state is not None:
            k.state = state
            if state == "active" and (k.parked or k.pending == 0):
                k.parked = False
                view = self._view(d, k, now)
                p = self._plan(d, k)
                if k.pending == 0 and resignal_allowed(p, k.active, 0):
                    if view.visible:
                        self._signal(d, k, now, now)
                    elif view.waiting_due is not None:
                        self._signal(d, k, view.waiting_due, now)

    def _move_tenant(self, d: _Domain, k: _Key, tenant: str) -> None:
        old = d.tenants.get(k.tenant)
        k.tenant = tenant
        if old is None:
            return
        moving = [s for s in old.ready if s.live and s.key == k.key]
        for s in moving:
            s.live = False
            old.live -= 1
            d.ready -= 1
            copy = _Signal(next(self._seq), s.key, s.due)
            self._ready(d, tenant, copy)

    async def attention_stats(self, domain: str) -> AttentionStats:
        now = self.clock.now()
        d = self._domain(domain)
        self._sweep_domain(d, now)
        c = d.counters
        return AttentionStats(
            signals_pending=sum(k.pending for k in d.keys.values()),
            slices=len(d.slices),
            processed=c["processed"],
            republished=c["republished"],
            blocked=c["blocked"],
            rate_limited=c["rate_limited"],
            empty=c["empty"],
            parked=c["parked"],
            reconciled=c["reconciled"],
            discarded=dict(d.discarded),
            clear_time_avg=d.clear_sum / d.clear_count if d.clear_count else 0.0,
            keys=len(d.keys),
            queue=f"attention.{domain}.work",
        )

    async def attention_key_stats(self, domain: str, top: int) -> list[KeyStats]:
        now = self.clock.now()
        self._sweep(now)
        d = self._domain(domain)
        self._sweep_domain(d, now)
        rows = []
        for k in d.keys.values():
            q = self._work_queue(d, k.key)
            backlog = (q.visible + q.delayed) if q else 0
            in_flight = q.in_flight if q else 0
            oldest = max(0.0, now - id_time(next(iter(q.msgs)))) if q and q.msgs else 0.0
            rows.append(
                KeyStats(
                    k.key,
                    k.tenant,
                    k.plan,
                    k.state,
                    backlog,
                    in_flight,
                    oldest,
                    k.active,
                    k.pending,
                    k.processed,
                )
            )
        rows.sort(key=lambda r: (-r.backlog, -r.in_flight, r.key))
        return rows[:top]

    async def attention_reconcile(self, domain: str) -> int:
        now = self.clock.now()
        self._sweep(now)
        d = self._domain(domain)
        self._sweep_domain(d, now)
        n = 0
        for k in d.keys.values():
            if k.state != "active" or k.pending or k.active:
                continue
            view = self._view(d, k, now)
            if view.visible:
                self._signal(d, k, now, now)
            elif view.waiting_due is not None:
                self._signal(d, k, view.waiting_due, now)
            else:
                continue
            n += 1
        d.counters["reconciled"] += n
        return n

    async def attention_tenant_stats(self, domain: str, top: int) -> list[TenantStats]:
        now = self.clock.now()
        self._sweep(now)
        d = self._domain(domain)
        self._sweep_domain(d, now)
        since = usage_since(now)
        used: dict[str, tuple[float, int, int]] = {}
        for t in d.tenants.values():
            _prune(t, since)
            if t.usage:
                used[t.name] = (
                    sum(u[1] for u in t.usage),
                    int(sum(u[2] for u in t.usage)),
                    int(sum(u[3] for u in t.usage)),
                )
        keys: dict[str, list[tuple[int, int, int]]] = {}
        for k in d.keys.values():
            if k.state != "active":
                continue
            q = self._work_queue(d, k.key)
            if q is not None and q.visible:
                cap = self._plan(d, k).max_concurrency
                keys.setdefault(k.tenant, []).append((q.visible, k.active, cap))
        return tenant_rows(used, keys, top)

    # -- wake-ups --------------------------------------------------------------------------
    async def attention_next(self, domain: str) -> SignalHint:
        d = self._domain(domain)
        if d.ready:
            return SignalHint(True, None)
        # stale entries (a signal pulled forward, a lease renewed since) would wake a taker
        # for nothing: drop them here
        while d.delayed and not d.delayed[0][2].live:
            heapq.heappop(d.delayed)
        while d.leases:
            rec = d.slices.get(d.leases[0][1])
            if rec is not None and rec.lease_until == d.leases[0][0]:
                break
            heapq.heappop(d.leases)
        dues = [heap[0][0] for heap in (d.delayed, d.leases) if heap]
        return SignalHint(False, min(dues) if dues else None)


def _use(t: _Tenant, now: float, busy: float, messages: int) -> None:
    """Count a slice that ended at ``now`` in the tenant's usage history."""
    bucket = usage_bucket(now)
    if t.usage and t.usage[-1][0] == bucket:
        u = t.usage[-1]
        u[1] += busy
        u[2] += 1
        u[3] += messages
    else:
        t.usage.append([bucket, busy, 1, messages])
        _prune(t, usage_since(now))


def _prune(t: _Tenant, since: int) -> None:
    while t.usage and t.usage[0][0] < since:
        t.usage.popleft()
