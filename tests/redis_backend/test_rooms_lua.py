"""The waiting room's rules in Lua (scripts/lib/room.lua) against their Python reference
(backends/room_policy.py, as the memory backend runs it), and every step's atomicity under
many concurrent connections and processes."""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import secrets
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

import fairq
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


def _same(a: Any, b: Any) -> bool:
    """Equal, floats to 1e-9 relative (Lua's expm1 is written out; the rest is exact)."""
    if isinstance(a, float) and isinstance(b, float):
        return a == pytest.approx(b, rel=1e-9, abs=1e-9)
    if isinstance(a, tuple | list) and isinstance(b, tuple | list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if hasattr(a, "__dataclass_fields__") and type(a) is type(b):
        return all(_same(getattr(a, f), getattr(b, f)) for f in a.__dataclass_fields__)
    return bool(a == b)


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_lua_rules_match_the_python_reference(
    redis_url: str, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    """A random run of joins (before and after opening), admission steps by two admitters
    with leases that lapse, admits, consumes, rate changes, expiring tokens under a
    max_active cap, then sold out: every answer of Redis equals the memory backend's, which
    runs room_policy.py (the draw's seed is made the same on both)."""
    rng = random.Random(seed)
    draw_seed = rng.randbytes(32)
    monkeypatch.setattr(secrets, "token_bytes", lambda n=32: draw_seed[:n])
    clock = fairq.ManualClock()
    start = clock.now()
    brokers = [
        await fairq.connect("memory://", clock=clock),
        await fairq.connect(redis_url, clock=clock),
    ]
    try:
        opts = dict(admit_rate=40.0, token_ttl=3.0, opens_at=start + 2.0, max_active=60)
        rooms = [await b.waiting_room("ev", secret=b"k" * 32, **opts) for b in brokers]
        seqs: list[int] = []
        fans = 0
        for i in range(300):
            op = rng.choices(
                ["join", "rejoin", "tick", "admit", "status", "consume", "rate", "time"],
                [6, 1, 5, 1, 4, 2, 1, 4],
            )[0]
            if op == "join":
                batch = [f"fan-{fans + k}" for k in range(rng.randint(1, 8))]
                fans += len(batch)
                got = [await b.backend.room_join("ev", batch) for b in brokers]
                seqs += [p.seq for p in got[0] if p.seq is not None]
            elif op == "rejoin" and fans:
                batch = [f"fan-{rng.randrange(fans)}" for _ in range(3)]
                got = [await b.backend.room_join("ev", batch) for b in brokers]
            elif op == "tick":
                holder, lease = rng.choice("ab"), rng.choice([0.3, 1.0])
                got = [await b.backend.room_tick("ev", holder, lease) for b in brokers]
            elif op == "admit":
                n = rng.randint(0, 5)
                got = [await b.backend.room_admit("ev", n) for b in brokers]
            elif op == "status" and seqs:
                s = rng.choice(seqs)
                got = [await b.backend.room_status("ev", s) for b in brokers]
            elif op == "consume" and seqs:
                s = rng.choice(seqs)
                got = [await b.backend.room_consume("ev", s) for b in brokers]
            elif op == "rate":
                r = rng.choice([0.0, 15.0, 40.0, 120.5])
                got = [await rm.set_rate(r) for rm in rooms]
            elif op == "time":
                clock.advance(rng.choice([0.01, 0.05, 0.2, 0.7, 1.5]))
                got = [await b.backend.room_stats("ev") for b in brokers]
            else:
                continue
            assert _same(got[0], got[1]), (i, op, got)
        got = [await b.backend.room_sold_out("ev") for b in brokers]
        assert got[0] == got[1]
        stats = [await b.backend.room_stats("ev") for b in brokers]
        assert _same(stats[0], stats[1]), stats
        assert stats[0].admitted > 50 and stats[0].used > 0 and stats[0].fence > 1
        assert stats[0].pre_queue_size and stats[0].pre_queue_size > 1
    finally:
        for b in brokers:
            await b.close()


_WORKER = """
import asyncio, json, random, sys, time, fairq

async def main(url, me, steps):
    rng = random.Random(me)
    ticks, consumed, admitted = [], [], 0
    async with await fairq.connect(url) as broker:
        be = broker.backend

        async def one_task(t):
            nonlocal admitted
            for i in range(steps):
                op = rng.random()
                if op < 0.4:
                    fans = [f"fan-{rng.randrange(4000)}" for _ in range(rng.randint(1, 20))]
                    await be.room_join("ev", fans)
                elif op < 0.75 and t == 0 and int(time.time() * 10) % 4 == me:
                    # one admitter loop per process (as run_admitter), ticking in its own
                    # 0.1 s windows, so the lease changes hands (a newcomer is refused until
                    # the last holder's lease lapsed)
                    t0 = time.time()
                    r = await be.room_tick("ev", f"p{me}", 0.05)
                    ticks.append([r.fence, f"p{me}", r.admitted, t0, time.time()])
                elif op < 0.8:
                    st = await be.room_status("ev", rng.randint(1, 400))
                    assert st.state in ("waiting", "admitted", "used", "expired"), st
                else:
                    seq = rng.randint(1, 400)
                    if await be.room_consume("ev", seq) == "ok":
                        consumed.append(seq)
                    st = await be.room_stats("ev")
                    assert st.max_active is None or st.active <= st.max_active, st

        await asyncio.gather(*(one_task(t) for t in range(4)))
    print(json.dumps({"ticks": ticks, "consumed": consumed, "admitted": admitted}))

asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
"""


def test_concurrent_steps_from_many_processes_keep_every_invariant(redis_url: str) -> None:
    """Four processes × four connections join, tick (each process one admitter loop, with
    a lease short enough to change hands), read statuses and consume on one room at once. Then: the
    arrival numbers are 1..joined, each fan once; the admitted fans are exactly the sum of
    what every step said it admitted (no step lost or counted twice); each fencing number
    belongs to one holder; no token was consumed twice; capacity was never exceeded."""
    with fairq.connect_sync(redis_url) as broker:
        broker.waiting_room("ev", admit_rate=2000.0, token_ttl=0.5, max_active=150)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, redis_url, str(me), "300"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for me in range(4)
    ]
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=180)
            assert p.returncode == 0, err
            outs.append(json.loads(out))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    ticks = [t for o in outs for t in o["ticks"]]
    consumed = [s for o in outs for s in o["consumed"]]

    async def read() -> tuple[Any, list[int]]:
        async with await fairq.connect(redis_url) as b:
            st = await b.backend.room_stats("ev")
            be: Any = b.backend
            fans = await be.command("HVALS", be._rkey("ev")[:-3] + "fans")
            return st, sorted(int(s) for s in fans)

    st, fan_seqs = asyncio.run(read())
    assert fan_seqs == list(range(1, st.joined + 1))  # one number per fan, none skipped
    assert st.joined > 1000
    held = [t for t in ticks if t[0] is not None]
    assert st.admitted == sum(t[2] for t in held)
    assert all(t[2] == 0 for t in ticks if t[0] is None)  # a refused step admits nobody
    owner: dict[int, str] = {}
    first_end: dict[int, float] = {}
    last_start: dict[int, float] = {}
    for fence, holder, _, t0, t1 in held:
        assert owner.setdefault(fence, holder) == holder, (fence, holder, owner[fence])
        first_end[fence] = min(first_end.get(fence, t1), t1)
        last_start[fence] = max(last_start.get(fence, t0), t0)
    assert len(owner) > 1  # the lease did change hands
    # one admitter at a time: the next fence was granted only after the lease of the one
    # before lapsed (its last renewal + 0.05 s; the scripts run on the callers' clocks, one
    # machine's); a fence seen by nobody is a lease taken and lost in between
    fences = sorted(owner)
    for f, g in itertools.pairwise(fences):
        assert first_end[g] >= last_start[f] + 0.05, (f, g, owner[f], owner[g])
    assert len(consumed) == len(set(consumed)) and st.used == len(consumed)
    assert st.active <= 150
