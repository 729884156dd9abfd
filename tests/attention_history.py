"""One random history of an attention domain run on two brokers at once, under one manual
clock: publishes, takes, slices served and ended (a rate-limited plan's with its retry
time), time passing, keys moving between tenants. The first broker is the reference — the
memory backend, which runs attention_policy.py as it is — and every take must find the
same key on the other, every receive the same number of messages and retry time, and the
end the same tenant stats. An engine that mirrors the policy (Redis in Lua, PostgreSQL in
PL/pgSQL) is refereed by it."""

from __future__ import annotations

import contextlib
import math
import random
from collections.abc import AsyncIterator
from typing import Any

import fairq
from fairq.model.attention import Plan


@contextlib.asynccontextmanager
async def paired(url: str) -> AsyncIterator[tuple[list[fairq.Broker], fairq.ManualClock]]:
    """The memory backend (the reference) and a broker on ``url``, under one manual clock."""
    clock = fairq.ManualClock()
    brokers = [
        await fairq.connect("memory://", clock=clock),
        await fairq.connect(url, clock=clock),
    ]
    try:
        yield brokers, clock
    finally:
        for b in brokers:
            await b.close()


PLANS = {
    "basic": Plan(1, 4, 60.0),
    "wide": Plan(3, 2, 60.0),
    "heavy": Plan(1, 3, 60.0, weight=2.5),
    "light": Plan(2, 5, 60.0, weight=0.5),
    "slow": Plan(1, 3, 60.0, rate=2.0, burst=2.0),
}


async def history(
    brokers: list[fairq.Broker], clock: fairq.ManualClock, seed: int, charge: str
) -> None:
    """Run the same random history on two ``brokers`` (the first the reference) and
    compare each take, each receive and the tenants' stats at the end."""
    rng = random.Random(seed)
    domains = [
        # no token lease runs out: expired slices end in token order, which is random
        await b.declare_attention("sched", plans=PLANS, charge=charge, slice_lease=1e6)  # type: ignore[arg-type]
        for b in brokers
    ]
    tenants = ["A", "B", "C", "D"]
    keys: dict[str, str] = {}
    for i in range(14):
        key, tenant = f"k{i}", rng.choice(tenants)
        keys[key] = tenant
        plan = rng.choice(list(PLANS))
        for a in domains:
            await a.set_resource(key, tenant=tenant, plan=plan)
    open_slices: list[list[Any]] = []  # one slice per broker, taken at the same step
    taken: list[str | None] = []
    for step in range(260):
        op = rng.choices(["publish", "take", "serve", "time", "move"], [3, 4, 4, 1, 0.3])[0]
        if op == "publish":
            key = rng.choice(list(keys))
            n = rng.choice([1, 1, 2, 5, 12])
            for a in domains:
                await a.publish_batch(key, [fairq.Outgoing(b"x") for _ in range(n)])
        elif op == "take":
            got = [await a._take(0) for a in domains]
            names = [s.key if s is not None else None for s in got]
            assert names[0] == names[1], (
                f"step {step}: the reference took {names[0]}, not {names[1]}"
            )
            taken.append(names[0])
            if got[0] is not None:
                # received at once, as a worker does (Redis leases them with the take),
                # and held as long as the history runs
                received = [
                    await a._receive(s, s.plan.max_messages, 1e6)
                    for a, s in zip(domains, got, strict=True)
                ]
                assert len(received[0][0]) == len(received[1][0])
                assert received[0][1] == received[1][1]
                open_slices.append([*got, received])
        elif op == "serve" and open_slices:
            *pair, got = open_slices.pop(rng.randrange(len(open_slices)))
            per_message = rng.choice([0.001, 0.01, 0.2, 1.5])
            clock.advance(per_message * len(got[0][0]))
            for a, s, (msgs, retry_at) in zip(domains, pair, got, strict=True):
                for m in msgs:
                    await m.ack()
                await a._end(s, len(msgs), retry_at)
        elif op == "time":
            clock.advance(rng.choice([0.5, 3.0, 7.0]))
        elif op == "move":
            key, tenant = rng.choice(list(keys)), rng.choice(tenants)
            keys[key] = tenant
            for a in domains:
                await a.set_resource(key, tenant=tenant)
        # Redis keeps the pending signals as a running count (no walk of every tenant's
        # list): it must follow every signal written, moved, pulled forward and taken
        pending = [(await a.stats()).signals_pending for a in domains]
        assert pending[0] == pending[1], f"step {step} ({op}): pending signals {pending}"
    assert sum(t is not None for t in taken) > 40, "the history serves slices"
    for *pair, _ in open_slices:
        for a, s in zip(domains, pair, strict=True):
            await a._end(s, 0, None)
    stats = [await a.tenant_stats() for a in domains]
    assert [t.tenant for t in stats[0]] == [t.tenant for t in stats[1]]
    for m, r in zip(*stats, strict=True):
        assert (m.slices, m.messages, m.backlog, m.keys, m.at_cap) == (
            r.slices,
            r.messages,
            r.backlog,
            r.keys,
            r.at_cap,
        ), (m, r)
        assert math.isclose(m.busy, r.busy, rel_tol=1e-9, abs_tol=1e-9), (m, r)
