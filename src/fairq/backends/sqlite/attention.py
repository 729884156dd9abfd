"""The SQLite backend's attention operations, each inside one transaction.

Keys, tenants, signals and slices are tables (``schema.sql``, versions 4 and 8); the
decisions come from :mod:`fairq.backends.attention_policy`, shared with every backend.
Taking a signal reads the tenant with a ready signal and the lowest virtual time through a
partial index, then that tenant's oldest signal — two index probes, however many keys
exist; the slice charges the tenant an estimate, which its end corrects to the real cost.
"""

from __future__ import annotations

import math
import secrets

import orjson

from ...errors import InvalidOption, LeaseLost
from ...message import Received
from ...model.attention import (
    AttentionConfig,
    Plan,
    Slice,
)
from ...model.queues import Envelope
from ..attention_policy import (
    KeyRow,
    KeyView,
    check_change,
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
    usage_bucket,
    usage_since,
)
from . import queues
from .messages import settle
from .txn import DomainRow, Txn

_MAX_SIGNALS_PER_TAKE = 256
_KEY_COLS = (
    "key, queue, tenant, plan, state, parked, pending, active, tokens, tokens_at, backlog_since"
)


class _Key(KeyRow):
    """A key's row, written back with :meth:`save`."""

    __slots__ = ()

    def save(self, t: Txn, d: DomainRow, processed: int = 0) -> None:
        t.conn.execute(
            "UPDATE fairq_att_keys SET tenant = ?, plan = ?, state = ?, parked = ?, pending = ?, "
            "active = ?, tokens = ?, tokens_at = ?, backlog_since = ?, "
            "processed = processed + ? WHERE domain_id = ? AND key = ?",
            (
                self.tenant,
                self.plan,
                self.state,
                int(self.parked),
                self.pending,
                self.active,
                None if self.tokens == math.inf else self.tokens,
                self.tokens_at,
                self.backlog_since,
                processed,
                d.id,
                self.key,
            ),
        )


def _load_key(t: Txn, d: DomainRow, key: str) -> _Key | None:
    row = t.conn.execute(
        f"SELECT {_KEY_COLS} FROM fairq_att_keys WHERE domain_id = ? AND key = ?", (d.id, key)
    ).fetchone()
    return None if row is None else _Key(row)


def _key(t: Txn, d: DomainRow, key: str) -> _Key:
    k = _load_key(t, d, key)
    if k is None:
        t.conn.execute(
            "INSERT INTO fairq_att_keys (domain_id, key, queue, tenant, plan, tokens_at) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (d.id, key, d.config.queue_for(d.name, key), key, d.config.default_plan, t.now),
        )
        k = _load_key(t, d, key)
        assert k is not None
    return k


def _plan(d: DomainRow, k: _Key) -> Plan:
    return d.config.plans.get(k.plan) or d.config.plans[d.config.default_plan]


def _count(t: Txn, d: DomainRow, counter: str, n: int = 1) -> None:
    if n:
        t.conn.execute(
            f"UPDATE fairq_att_domains SET {counter} = {counter} + ? WHERE id = ?", (n, d.id)
        )


def _view(t: Txn, d: DomainRow, k: _Key) -> KeyView:
    """The key as the policy sees it, its work queue's counts read from the queue row."""
    q = t.find(k.queue)
    if q is not None:
        settle(t)
        t.fold(q.id)
    t.flush()
    row = t.conn.execute(
        "SELECT id, visible, delayed, in_flight FROM fairq_queues WHERE name = ?", (k.queue,)
    ).fetchone()
    visible = waiting_due = None
    if row is not None:
        visible = row[1]
        if not visible and (row[2] or row[3]):
            (waiting_due,) = t.conn.execute(
                "SELECT MIN(avail_at) FROM fairq_messages WHERE queue_id = ? AND state = 1",
                (row[0],),
            ).fetchone()
    tokens = refill(k.tokens, k.tokens_at, t.now, _plan(d, k))
    return KeyView(k.state, k.active, k.pending, visible or 0, waiting_due, tokens)


def _signal(t: Txn, d: DomainRow, k: _Key, due: float) -> None:
    """A signal for ``k`` at the tail of its tenant, or delayed until ``due``."""
    ready = due <= t.now
    cur = t.conn.execute(
        "INSERT INTO fairq_att_signals (domain_id, tenant, key, due, ready) VALUES (?, ?, ?, ?, ?)",
        (d.id, k.tenant, k.key, due, int(ready)),
    )
    k.pending += 1
    if ready:
        _tenant_ready(t, d, k.tenant, int(cur.lastrowid or 0), 1)
    else:
        t.waiting_until(due)
        t.store.schedule(d.name, due, t.now)
    t.op_notify.add(f"attention:{d.name}")


def _tenant_ready(t: Txn, d: DomainRow, tenant: str, signal_id: int, n: int) -> None:
    """``n`` more ready signals for ``tenant``; one that had none starts at
    ``eligible_vt(vt, clock)`` (``max``, the domain's virtual clock as ``excluded.vt``)."""
    t.conn.execute(
        "INSERT INTO fairq_att_tenants (domain_id, tenant, ready, since, vt) "
        "VALUES (?, ?, ?, ?, (SELECT vclock FROM fairq_att_domains WHERE id = ?)) "
        "ON CONFLICT (domain_id, tenant) DO UPDATE SET ready = ready + excluded.ready, "
        "since = CASE WHEN ready = 0 THEN excluded.since ELSE since END, "
        "vt = CASE WHEN ready = 0 THEN max(vt, excluded.vt) ELSE vt END",
        (d.id, tenant, n, signal_id, d.id),
    )


def _note_backlog(t: Txn, d: DomainRow, k: _Key, has_backlog: bool) -> None:
    if has_backlog and k.backlog_since is None:
        k.backlog_since = t.now
    elif not has_backlog and k.backlog_since is not None:
        t.conn.execute(
            "UPDATE fairq_att_domains SET clear_sum = clear_sum + ?, clear_count = clear_count + 1 "
            "WHERE id = ?",
            (t.now - k.backlog_since, d.id),
        )
        k.backlog_since = None


def sweep_domain(t: Txn, d: DomainRow) -> None:
    """Delayed signals that came due join their tenant; expired slices free their token."""
    conn, now = t.conn, t.now
    due = conn.execute(
        "SELECT id, tenant FROM fairq_att_signals WHERE ready = 0 AND due <= ? AND domain_id = ? "
        "ORDER BY due",
        (now, d.id),
    ).fetchall()
    for sid, tenant in due:
        conn.execute("UPDATE fairq_att_signals SET ready = 1 WHERE id = ?", (sid,))
        _tenant_ready(t, d, tenant, sid, 1)
    for (token,) in conn.execute(
        "SELECT token FROM fairq_att_slices WHERE lease_until <= ? AND domain_id = ?", (now, d.id)
    ).fetchall():
        _end_slice(t, d, token, 0, None, expired=True)


def _end_slice(
    t: Txn,
    d: DomainRow,
    token: str,
    processed: int,
    retry_at: float | None,
    expired: bool = False,
) -> bool:
    row = t.conn.execute(
        "DELETE FROM fairq_att_slices WHERE token = ? "
        "RETURNING key, tenant, charged, taken_at, counted",
        (token,),
    ).fetchone()
    if row is None:  # expired and ended by the sweep, with what it had counted
        return False
    counted = row[4]
    # the domain counts every message once: what an expired slice counted on the way, else
    # all it handled; its key has the counted ones already
    _count(t, d, "processed", counted if expired else processed)
    k = _load_key(t, d, row[0])
    if k is None:
        return True
    tenant, charged, taken_at = row[1:4]
    if tenant is not None and taken_at is not None and not expired:
        # a dead worker's slice (expired) keeps its estimate: its real cost is unknown
        _charge(t, d, tenant, charged, t.now - taken_at, processed, _plan(d, k))
    k.active -= 1
    view = _view(t, d, k)
    when, counter = on_slice_end(view, _plan(d, k), t.now, retry_at)
    if when is not None and counter is not None:
        _count(t, d, counter)
        _signal(t, d, k, when)
    _note_backlog(t, d, k, bool(view.visible or view.waiting_due is not None))
    k.save(t, d, 0 if expired else max(0, processed - counted))
    return True


def _charge(
    t: Txn, d: DomainRow, tenant: str, charged: float, held: float, handled: int, plan: Plan
) -> None:
    """A slice of ``tenant`` ended: its real cost replaces the estimate charged at take,
    feeds the tenant's and the domain's estimates, and counts in the usage history."""
    conn = t.conn
    cost = slice_cost(d.config.charge, held, handled)
    row = conn.execute(
        "SELECT vt, estimate FROM fairq_att_tenants WHERE domain_id = ? AND tenant = ?",
        (d.id, tenant),
    ).fetchone()
    if row is not None:
        conn.execute(
            "UPDATE fairq_att_tenants SET vt = ?, estimate = ? WHERE domain_id = ? AND tenant = ?",
            (on_end(row[0], charged, cost, plan), next_estimate(row[1], cost), d.id, tenant),
        )
    (old,) = conn.execute("SELECT estimate FROM fairq_att_domains WHERE id = ?", (d.id,)).fetchone()
    conn.execute(
        "UPDATE fairq_att_domains SET estimate = ? WHERE id = ?", (next_estimate(old, cost), d.id)
    )
    conn.execute(
        "INSERT INTO fairq_att_usage (domain_id, bucket, tenant, busy, slices, messages) "
        "VALUES (?, ?, ?, ?, 1, ?) ON CONFLICT (domain_id, bucket, tenant) DO UPDATE SET "
        "busy = busy + excluded.busy, slices = slices + 1, messages = messages + excluded.messages",
        (d.id, usage_bucket(t.now), tenant, max(0.0, held), handled),
    )


# -- domains -------------------------------------------------------------------------------
def declare_attention(t: Txn, name: str, config: AttentionConfig) -> None:
    data = orjson.dumps(config.to_dict()).decode()
    d = t.find_domain(name)
    if d is None:
        t.conn.execute(
            "INSERT INTO fairq_att_domains (name, config, created_at) VALUES (?, ?, ?)",
            (name, data, t.now),
        )
    elif d.config != config:
        has_keys = t.conn.execute(
            "SELECT 1 FROM fairq_att_keys WHERE domain_id = ? LIMIT 1", (d.id,)
        ).fetchone()
        check_change(name, d.config, config, has_keys is not None)
        t.conn.execute("UPDATE fairq_att_domains SET config = ? WHERE id = ?", (data, d.id))
    else:
        return
    t.configs_changed()


def attention_config(t: Txn, name: str) -> AttentionConfig:
    return t.domain(name).config


def delete_attention(t: Txn, name: str) -> bool:
    d = t.find_domain(name)
    if d is None:
        return False
    for table in (
        "fairq_att_keys",
        "fairq_att_tenants",
        "fairq_att_signals",
        "fairq_att_slices",
        "fairq_att_usage",
    ):
        t.conn.execute(f"DELETE FROM {table} WHERE domain_id = ?", (d.id,))
    t.conn.execute("DELETE FROM fairq_att_domains WHERE id = ?", (d.id,))
    t.configs_changed()
    return True


# -- the slice cycle -----------------------------------------------------------------------
def publish(t: Txn, domain: str, key: str, envs: list[Envelope]) -> list[str]:
    d = t.domain(domain)
    sweep_domain(t, d)
    k = _load_key(t, d, key)
    if k is not None and k.state == "removed":
        raise InvalidOption(
            f"key {key!r} of {domain!r} was removed; set_resource(key, state='active') first"
        )
    name = d.config.queue_for(domain, key)
    if t.find(name) is None:
        from ...model.queues import queue_config_from_options

        queues.declare_queue(t, name, queue_config_from_options(name, dict(d.config.queue_options)))
    ids = queues.send(t, name, envs)
    k = k or _key(t, d, key)
    view = _view(t, d, k)
    _note_backlog(t, d, k, bool(view.visible or view.waiting_due is not None))
    if k.pending == 0:
        if resignal_allowed(_plan(d, k), k.active, 0) and publish_signals(k.state, k.parked):
            _signal(t, d, k, t.now if view.visible else (view.waiting_due or t.now))
    elif view.visible:
        _pull_forward(t, d, k)
    k.save(t, d)
    return ids


def _pull_forward(t: Txn, d: DomainRow, k: _Key) -> None:
    """An immediate message must not wait behind the key's delayed signals only."""
    conn = t.conn
    if conn.execute(
        "SELECT 1 FROM fairq_att_signals WHERE domain_id = ? AND key = ? AND ready = 1",
        (d.id, k.key),
    ).fetchone():
        return
    row = conn.execute(
        "SELECT id FROM fairq_att_signals WHERE domain_id = ? AND key = ? AND ready = 0 "
        "ORDER BY due LIMIT 1",
        (d.id, k.key),
    ).fetchone()
    if row is not None:
        conn.execute("DELETE FROM fairq_att_signals WHERE id = ?", (row[0],))
        k.pending -= 1
        _signal(t, d, k, t.now)


def take(t: Txn, domain: str) -> Slice | None:
    d = t.domain(domain)
    sweep_domain(t, d)
    conn = t.conn
    for _ in range(_MAX_SIGNALS_PER_TAKE):
        turn = conn.execute(
            "SELECT tenant, vt, estimate FROM fairq_att_tenants WHERE domain_id = ? "
            "AND ready > 0 ORDER BY vt, turn, since LIMIT 1",
            (d.id,),
        ).fetchone()
        if turn is None:
            return None
        tenant, vt, tenant_estimate = turn
        sig = conn.execute(
            "SELECT id, key FROM fairq_att_signals "
            "WHERE domain_id = ? AND tenant = ? AND ready = 1 ORDER BY id LIMIT 1",
            (d.id, tenant),
        ).fetchone()
        if sig is None:  # a count out of step (cannot happen in one transaction): mend it
            conn.execute(
                "UPDATE fairq_att_tenants SET ready = 0 WHERE domain_id = ? AND tenant = ?",
                (d.id, tenant),
            )
            continue
        conn.execute("DELETE FROM fairq_att_signals WHERE id = ?", (sig[0],))
        k = _load_key(t, d, sig[1])
        got: Slice | None = None
        charged = 0.0
        if k is not None:
            got, charged = _take_signal(t, d, k, tenant, vt, tenant_estimate)
        # the tenant's turn, and its charge, after the decision: until then the signal taken
        # still counts as ready, so a re-signal in between is no return from idle
        (counter,) = conn.execute(
            "UPDATE fairq_att_domains SET turn_counter = turn_counter + 1, "
            "vclock = max(vclock, coalesce(?, vclock)) WHERE id = ? RETURNING turn_counter",
            (vt if got is not None else None, d.id),
        ).fetchone()
        conn.execute(
            "UPDATE fairq_att_tenants SET ready = ready - 1, turn = ?, vt = vt + ? "
            "WHERE domain_id = ? AND tenant = ?",
            (counter, charged, d.id, tenant),
        )
        if got is not None:
            return got
    return None


def _take_signal(
    t: Txn, d: DomainRow, k: _Key, tenant: str, vt: float, tenant_estimate: float | None
) -> tuple[Slice | None, float]:
    """Decide what the signal of ``k`` just taken does (rule 3): a slice or None, and what
    it charges ``tenant`` (at virtual time ``vt``; the caller moves the clock)."""
    conn, now = t.conn, t.now
    k.pending -= 1
    plan = _plan(d, k)
    view = _view(t, d, k)
    decision = on_signal(view, plan, now)
    action = decision.action
    if action == "drop":
        conn.execute(
            "UPDATE fairq_att_domains SET discarded = json_set(discarded, '$.' || ?, "
            "coalesce(json_extract(discarded, '$.' || ?), 0) + 1) WHERE id = ?",
            (k.state, k.state, d.id),
        )
    elif action == "park":
        k.parked = True
        _count(t, d, "parked")
    elif action != "slice":
        _count(t, d, "blocked" if action == "block" else action)
        if action == "rate_limited":
            k.tokens, k.tokens_at = view.tokens, now
        if action == "empty" and decision.resignal_at is None:
            _note_backlog(t, d, k, view.waiting_due is not None)
    if decision.resignal_at is not None:
        _signal(t, d, k, decision.resignal_at)
    if action != "slice":
        k.save(t, d)
        return None, 0.0
    domain_estimate = None
    if tenant_estimate is None:  # a tenant's first slices: what slices here cost
        (domain_estimate,) = conn.execute(
            "SELECT estimate FROM fairq_att_domains WHERE id = ?", (d.id,)
        ).fetchone()
    _, _, charged = on_take(vt, vt, estimate(tenant_estimate, domain_estimate), plan)
    token = secrets.token_hex(12)
    lease_until = now + d.config.slice_lease
    conn.execute(
        "INSERT INTO fairq_att_slices (token, domain_id, key, lease_until, tenant, charged, "
        "taken_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
        (token, d.id, k.key, lease_until, tenant, charged, now),
    )
    t.waiting_until(lease_until)
    k.active += 1
    k.tokens, k.tokens_at = view.tokens, now
    if decision.fan_out:
        _signal(t, d, k, now)
    k.save(t, d)
    return Slice(d.name, k.key, k.queue, token, plan), charged


def _live_slice(t: Txn, d: DomainRow, token: str) -> str | None:
    row = t.conn.execute(
        "SELECT key FROM fairq_att_slices WHERE token = ? AND domain_id = ? AND lease_until > ?",
        (token, d.id, t.now),
    ).fetchone()
    return None if row is None else str(row[0])


def receive(
    t: Txn, domain: str, token: str, n: int, visibility_timeout: float | None
) -> tuple[list[Received], float | None]:
    d = t.domain(domain)
    key = _live_slice(t, d, token)
    if key is None:
        raise LeaseLost([token], "the slice's concurrency token expired")
    k = _load_key(t, d, key)
    assert k is not None
    plan = _plan(d, k)
    tokens = refill(k.tokens, k.tokens_at, t.now, plan)
    allowed = n if tokens == math.inf else min(n, int(tokens))
    if allowed < 1:
        k.tokens, k.tokens_at = tokens, t.now
        k.save(t, d)
        return [], next_permit(tokens, t.now, plan)
    if t.find(k.queue) is None:
        return [], None
    got = queues.receive(t, k.queue, allowed, visibility_timeout)
    if tokens != math.inf:
        k.tokens, k.tokens_at = tokens - len(got), t.now
        k.save(t, d)
    return got, None


def extend(t: Txn, domain: str, token: str) -> bool:
    d = t.domain(domain)
    until = t.now + d.config.slice_lease
    changed = t.conn.execute(
        "UPDATE fairq_att_slices SET lease_until = ? WHERE token = ? AND domain_id = ? "
        "AND lease_until > ?",
        (until, token, d.id, t.now),
    ).rowcount
    return changed == 1


def count(t: Txn, domain: str, token: str, key: str, n: int) -> None:
    """``n`` acked messages of the slice ``token`` counted for ``key`` now, and remembered
    with the slice (its end counts only the rest)."""
    d = t.find_domain(domain)
    if d is None or n <= 0:
        return
    t.conn.execute(
        "UPDATE fairq_att_keys SET processed = processed + ? WHERE domain_id = ? AND key = ?",
        (n, d.id, key),
    )
    changed = t.conn.execute(
        "UPDATE fairq_att_slices SET counted = counted + ? WHERE token = ? AND domain_id = ?",
        (n, token, d.id),
    ).rowcount
    if not changed:  # ended already (its token expired): the domain's count now
        _count(t, d, "processed", n)


def progress(
    t: Txn, domain: str, token: str, key: str, queue: str, receipts: list[str]
) -> list[str]:
    """Ack a running slice's handled messages and count the acked ones, in one transaction."""
    lost = queues.ack(t, queue, receipts)
    count(t, domain, token, key, len(set(receipts) - set(lost)))
    return lost


def end(t: Txn, domain: str, token: str, processed: int, retry_at: float | None) -> None:
    d = t.domain(domain)
    sweep_domain(t, d)
    _end_slice(t, d, token, processed, retry_at)


# -- resources -----------------------------------------------------------------------------
def set_resource(
    t: Txn, domain: str, key: str, plan: str | None, state: str | None, tenant: str | None
) -> None:
    d = t.domain(domain)
    sweep_domain(t, d)
    if plan is not None and plan not in d.config.plans:
        raise InvalidOption(f"no plan {plan!r} in {domain!r} (plans: {', '.join(d.config.plans)})")
    k = _key(t, d, key)
    if plan is not None:
        k.plan = plan
    if tenant is not None and tenant != k.tenant:
        _move_tenant(t, d, k, tenant)
    if state is not None:
        k.state = state
        if state == "active":
            k.parked = False
            view = _view(t, d, k)
            if k.pending == 0 and resignal_allowed(_plan(d, k), k.active, 0):
                if view.visible:
                    _signal(t, d, k, t.now)
                elif view.waiting_due is not None:
                    _signal(t, d, k, view.waiting_due)
    k.save(t, d)


def _move_tenant(t: Txn, d: DomainRow, k: _Key, tenant: str) -> None:
    conn = t.conn
    ready = conn.execute(
        "SELECT COUNT(*) FROM fairq_att_signals WHERE domain_id = ? AND key = ? AND ready = 1",
        (d.id, k.key),
    ).fetchone()[0]
    conn.execute(
        "UPDATE fairq_att_signals SET tenant = ? WHERE domain_id = ? AND key = ?",
        (tenant, d.id, k.key),
    )
    if ready:
        conn.execute(
            "UPDATE fairq_att_tenants SET ready = ready - ? WHERE domain_id = ? AND tenant = ?",
            (ready, d.id, k.tenant),
        )
        first = conn.execute(
            "SELECT MIN(id) FROM fairq_att_signals WHERE domain_id = ? AND key = ? AND ready = 1",
            (d.id, k.key),
        ).fetchone()[0]
        _tenant_ready(t, d, tenant, first, ready)
    k.tenant = tenant


def reconcile(t: Txn, domain: str) -> int:
    """One query finds the keys to signal: no per-key round trips, however many keys."""
    d = t.domain(domain)
    sweep_domain(t, d)
    settle(t)
    t.flush()
    lost = t.conn.execute(
        "SELECT k.key FROM fairq_att_keys k JOIN fairq_queues q ON q.name = k.queue "
        "WHERE k.domain_id = ? AND k.state = 'active' AND k.pending = 0 AND k.active = 0 "
        "AND EXISTS (SELECT 1 FROM fairq_messages m WHERE m.queue_id = q.id)",
        (d.id,),
    ).fetchall()
    n = 0
    for (key,) in lost:
        k = _load_key(t, d, key)
        assert k is not None
        view = _view(t, d, k)
        due = t.now if view.visible else view.waiting_due
        if due is None:
            continue
        _signal(t, d, k, due)
        k.save(t, d)
        n += 1
    _count(t, d, "reconciled", n)
    prune_usage(t, d)
    return n


def prune_usage(t: Txn, d: DomainRow) -> None:
    """Forget the usage buckets that left the window (the last minute)."""
    t.conn.execute(
        "DELETE FROM fairq_att_usage WHERE domain_id = ? AND bucket < ?",
        (d.id, usage_since(t.now)),
    )
