"""The attention scheduler in Lua (scripts/lib/attention.lua) against its Python reference
(backends/attention_policy.py): the same arithmetic on random inputs, bit for bit; the
same slices, in the same order, as the memory backend on random histories of publishes,
takes and slice ends over tenants of several weights; what delete_attention leaves."""

from __future__ import annotations

import random
import secrets
from collections.abc import AsyncIterator, Iterator
from importlib import resources
from typing import Any

import pytest

import fairq
from attention_history import history, paired
from fairq.backends import attention_policy as policy
from fairq.model.attention import Plan
from redis_servers import drop_prefix, service_up

SHARED = ("127.0.0.1", 6379)


@pytest.fixture
def redis_url() -> Iterator[str]:
    if not service_up(*SHARED):
        import os

        if os.environ.get("FAIRQ_REQUIRE_SERVICES") == "1":
            pytest.fail("redis at 127.0.0.1:6379 is down and FAIRQ_REQUIRE_SERVICES=1")
        pytest.skip("redis at 127.0.0.1:6379 is not reachable")
    url = f"redis://127.0.0.1:6379/0?prefix=t-{secrets.token_hex(6)}:"
    yield url
    drop_prefix(url)


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[Any]:
    import redis.asyncio as aredis

    c = aredis.Redis(host=SHARED[0], port=SHARED[1])
    try:
        yield c
    finally:
        await c.aclose()


def _lib_source() -> str:
    """core.lua, queue.lua and attention.lua as the scripts get them (the pure rules need
    nothing else)."""
    root = resources.files("fairq.backends.redis").joinpath("scripts", "lib")
    parts = ["local DLQ_CONFIG = '{}'"]
    parts += [root.joinpath(f"{lib}.lua").read_text("utf-8") for lib in ("core", "queue")]
    parts.append(root.joinpath("attention.lua").read_text("utf-8"))
    return "\n".join(parts) + "\n"


# each case: 12 numbers in, the rules' results out as %.17g (exact) strings
_BODY = """
local out = {}
local function none(x) if x == '' then return nil end return tonumber(x) end
local i = 4
while ARGV[i] do
  local vt, clock, t_est, d_est = tonumber(ARGV[i]), tonumber(ARGV[i + 1]),
    none(ARGV[i + 2]), none(ARGV[i + 3])
  local weight, held, handled = tonumber(ARGV[i + 4]), tonumber(ARGV[i + 5]),
    tonumber(ARGV[i + 6])
  local charge, now, cost = ARGV[i + 7], tonumber(ARGV[i + 8]), tonumber(ARGV[i + 9])
  local old = none(ARGV[i + 10])
  local expected = estimate(t_est, d_est)
  local nvt, nclock, charged = on_take(vt, clock, expected, weight)
  local c = slice_cost(charge, held, handled)
  local row = {fmt(eligible_vt(vt, clock)), fmt(expected), fmt(nvt), fmt(nclock),
    fmt(charged), fmt(c), fmt(on_end(nvt, charged, cost, weight)),
    fmt(next_estimate(old, cost)), tostring(usage_bucket(now)), tostring(usage_since(now))}
  out[#out + 1] = table.concat(row, ' ')
  i = i + 12
end
return out
"""


def _case(rng: random.Random) -> list[Any]:
    def num() -> float:
        kind = rng.random()
        if kind < 0.1:
            return 0.0
        if kind < 0.4:
            return rng.uniform(0, 1e-3)
        if kind < 0.8:
            return rng.uniform(0, 100.0)
        return rng.uniform(0, 1e7) * rng.choice([1.0, 1.0 / 3.0])

    def maybe() -> float | None:
        return None if rng.random() < 0.2 else num()

    return [
        num(),  # vt
        num(),  # clock
        maybe(),  # the tenant's estimate
        maybe(),  # the domain's
        rng.choice([1.0, 2.0, 0.5, 3.0, 1e-3, 7.25, 1e6, rng.uniform(1e-3, 1e3)]),
        rng.uniform(-1.0, 60.0),  # held (a clock step back: negative)
        rng.randint(-1, 500),  # handled
        rng.choice(["time", "messages"]),
        rng.uniform(0, 2e9),  # now
        num(),  # the real cost
        maybe(),  # an old estimate
        0,  # padding
    ]


def _python(case: list[Any]) -> list[str]:
    vt, clock, t_est, d_est, weight, held, handled, charge, now, cost, old, _ = case
    plan = Plan(weight=weight)
    expected = policy.estimate(t_est, d_est)
    nvt, nclock, charged = policy.on_take(vt, clock, expected, plan)
    values = [
        policy.eligible_vt(vt, clock),
        expected,
        nvt,
        nclock,
        charged,
        policy.slice_cost(charge, held, handled),
        policy.on_end(nvt, charged, cost, plan),
        policy.next_estimate(old, cost),
    ]
    return [
        *(repr(float(v)) for v in values),
        str(policy.usage_bucket(now)),
        str(policy.usage_since(now)),
    ]


def _arg(v: Any) -> str:
    if v is None:
        return ""
    return repr(v) if isinstance(v, float) else str(v)


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_the_lua_rules_compute_what_the_python_ones_do(client: Any, seed: int) -> None:
    rng = random.Random(seed)
    cases = [_case(rng) for _ in range(400)]
    args = ["t-x:", "0", "0"] + [_arg(v) for c in cases for v in c]
    got = await client.eval(_lib_source() + _BODY, 1, "t-x:{x}:due", *args)
    assert len(got) == len(cases)
    for case, row in zip(cases, got, strict=True):
        lua = row.decode().split(" ")
        want = _python(case)
        # the numbers, bit for bit (%.17g reads back exactly); buckets as integers
        assert [float(x) for x in lua[:8]] == [float(x) for x in want[:8]], case
        assert [int(float(x)) for x in lua[8:]] == [int(x) for x in want[8:]], case


_PERMIT = """
local out = {}
local i = 4
while ARGV[i] do
  local plan = {rate = tonumber(ARGV[i + 1]), bucket = tonumber(ARGV[i + 2]),
    max_messages = tonumber(ARGV[i + 3])}
  out[#out + 1] = fmt(next_permit(tonumber(ARGV[i]), plan))
  i = i + 4
end
return out
"""


@pytest.mark.parametrize("seed", [1, 2])
async def test_the_lua_next_permit_is_the_python_one(client: Any, seed: int) -> None:
    """When a rate-limited key is signalled again, for the same bucket, to the bit."""
    rng = random.Random(seed)
    now = rng.uniform(1.6e9, 1.9e9)
    cases = []
    for _ in range(400):
        plan = Plan(
            1,
            rng.choice([1, 2, 3, 10, 100, rng.randint(1, 1000)]),
            20.0,
            rate=rng.choice([0.5, 20.0, 50.0, rng.uniform(0.01, 1e4)]),
            burst=rng.choice([1.0, 2.5, 10.0, rng.uniform(1.0, 1e3)]),
        )
        tokens = rng.choice([0.0, rng.uniform(0.0, plan.bucket)])
        cases.append((tokens, plan))
    args = ["t-x:", repr(now), "0"]
    for tokens, plan in cases:
        args += [repr(tokens), repr(plan.rate), repr(plan.bucket), str(plan.max_messages)]
    got = await client.eval(_lib_source() + _PERMIT, 1, "t-x:{x}:due", *args)
    want = [policy.next_permit(tokens, now, plan) for tokens, plan in cases]
    assert [float(x) for x in got] == want


# -- the scheduler as a whole: the memory backend (the Python reference) vs Redis ----------
@pytest.mark.parametrize(("seed", "charge"), [(1, "time"), (2, "time"), (3, "messages")])
async def test_redis_takes_the_slices_the_memory_backend_takes(
    redis_url: str, seed: int, charge: str
) -> None:
    """One manual clock drives both; every take must find the same key (the memory
    backend runs attention_policy.py: a different virtual time, estimate, turn or charge
    on Redis shows up as another tenant or key going next)."""
    async with paired(redis_url) as (brokers, clock):
        await history(brokers, clock, seed, charge)


async def test_delete_attention_leaves_none_of_its_keys(redis_url: str, client: Any) -> None:
    clock = fairq.ManualClock()
    b = await fairq.connect(redis_url, clock=clock)
    prefix = redis_url.rsplit("prefix=", 1)[1]
    try:
        a = await b.declare_attention("gone", plans={"basic": Plan(1, 2, 60.0, rate=5.0)})
        for i in range(6):
            await a.set_resource(f"k{i}", tenant=f"t{i % 3}")
            await a.publish_batch(f"k{i}", [fairq.Outgoing(b"x") for _ in range(4)])
        for _ in range(4):
            s = await a._take(0)
            assert s is not None
            msgs, retry_at = await a._receive(s, 2, None)
            clock.advance(0.3)
            for m in msgs:
                await m.ack()
            await a._end(s, len(msgs), retry_at)
        held = await a._take(0)  # a slice still running
        assert held is not None
        assert await a.tenant_stats()
        before = [k.decode() async for k in client.scan_iter(match=f"{prefix}*a:gone:*")]
        for kind in ("T:", "sched", "tenants", "sc", "ub", "u:"):
            assert any(f"a:gone:{kind}" in k for k in before), (kind, before)
        await b.delete_attention("gone")
        left = [k.decode() async for k in client.scan_iter(match=f"{prefix}*a:gone:*")]
        assert left == []
    finally:
        await b.close()


async def test_a_domain_of_the_layout_before_the_scheduler_goes_on(
    redis_url: str, client: Any
) -> None:
    """A domain written before the scheduler (its tenants with ready signals in a zset by
    last turn, ``A turns``, and ``A tturn``): the first sweep moves them into ``A sched``
    and every ready signal is still taken."""
    b = await fairq.connect(redis_url, clock=fairq.ManualClock())
    prefix = redis_url.rsplit("prefix=", 1)[1]
    base = f"{prefix}{{process}}:a:old:"
    try:
        a = await b.declare_attention("old", plans={"basic": Plan(1, 5, 60.0)})
        for key, tenant in (("k1", "x"), ("k2", "x"), ("k3", "y")):
            await a.set_resource(key, tenant=tenant)
            await a.publish(key, b"m")
        # back to the old layout: what the scripts before the scheduler kept
        for m in await client.zrange(base + "sched", 0, -1):
            tenant = m.decode()[32:]
            await client.zadd(base + "turns", {tenant: 7})
            await client.hset(base + "tturn", tenant, 7)
            await client.delete(base + "T:" + tenant)
        await client.delete(base + "sched", base + "tenants")
        keys = set()
        for _ in range(3):
            s = await a._take(0)
            assert s is not None
            keys.add(s.key)
            msgs, _ = await a._receive(s, 5, None)
            for m in msgs:
                await m.ack()
            await a._end(s, len(msgs), None)
        assert keys == {"k1", "k2", "k3"}
        assert await a._take(0) is None
        assert not await client.exists(base + "turns", base + "tturn")
        await a.publish("k3", b"again")
        s = await a._take(0)
        assert s is not None and s.key == "k3"
        assert await client.zcard(base + "sched") == 0
        await b.delete_attention("old")
        assert not [k async for k in client.scan_iter(match=base + "*")], "none left behind"
    finally:
        await b.close()


async def test_pending_signals_follow_a_delayed_signal_pulled_forward(redis_url: str) -> None:
    """A key whose only signal is delayed, then sent an immediate message: the delayed
    signal is pulled forward (replaced by a ready one); Redis's running count of pending
    signals must say what the memory backend counts at every step."""
    async with paired(redis_url) as (brokers, _clock):
        domains = [await b.declare_attention("pulled") for b in brokers]

        async def pending() -> list[int]:
            return [(await a.stats()).signals_pending for a in domains]

        for a in domains:
            await a.publish("k", b"later", delay=30.0)
        assert await pending() == [1, 1]
        for a in domains:
            await a.publish("k", b"now")
        assert await pending() == [1, 1]
        got = [await a._take(0) for a in domains]
        assert [s.key if s else None for s in got] == ["k", "k"]
        assert await pending() == [0, 0]


async def test_key_and_tenant_stats_read_the_backlog_in_chunks(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Key and tenant stats walk the keys with backlog a few per script (here 4): the
    busiest keys and the tenants' rows come out as the memory backend's, which reads
    everything at once; with a cap below the backlog, only a sample is read."""
    from fairq.backends.redis.attention_stats import AttentionReads

    monkeypatch.setattr(AttentionReads, "STATS_CHUNK", 4)
    async with paired(redis_url) as (brokers, _clock):
        domains = [await b.declare_attention("chunked") for b in brokers]
        # 160 keys, 128 with backlog: more than a set Redis keeps as one listpack (which
        # SSCAN returns whole, whatever COUNT says)
        for i in range(160):
            for a in domains:
                await a.set_resource(f"k{i:03}", tenant=f"t{i % 3}")
                if i % 5:
                    await a.publish_batch(f"k{i:03}", [fairq.Outgoing(b"x")] * (i % 7 + 1))
        for top in (5, 150):
            rows = [await a.key_stats(top=top) for a in domains]
            assert [(k.key, k.backlog) for k in rows[0]] == [(k.key, k.backlog) for k in rows[1]]
        tenants = [await a.tenant_stats() for a in domains]
        assert [(t.tenant, t.backlog, t.keys) for t in tenants[0]] == [
            (t.tenant, t.backlog, t.keys) for t in tenants[1]
        ]
        monkeypatch.setattr(AttentionReads, "STATS_SCAN", 8)  # 2 chunks of 4 at most
        sample = await domains[1].tenant_stats()
        assert 0 < sum(t.keys for t in sample) < sum(t.keys for t in tenants[1])
