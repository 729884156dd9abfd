"""Issue 16's worker-time scenarios on Redis, or on RabbitMQ with Redis as its store:
``python -m bench.attention_redis_shares [--engine amqp]``.

The processes and the measures are bench.contention's (a publisher process, a worker
process of 4 slots with 1 ms handlers, tenant stats sampled once a second), pointed at a
private redis-server (no persistence, a free port of 16500-16549) instead of a SQLite file:

  shares           tenant A: one deep key; tenant B: 2,000 keys of 10 messages; A's plan
                   lets it fan out to 4 slices. Worker-time share B/A (target 0.8-1.25).
  shares_messages  the same with charge='messages': messages B/A (target 0.8-1.25).
  capped           A's key at max_concurrency=1: A gets one worker of four (share 0.25),
                   B the rest, and the tenant stats say A is at its cap.
  rate2            Plan(rate=20, burst=1), 2,000 messages, 2 worker processes x 2 slots:
                   take attempts per handled message (target <= 1.5), the rate reached.

Each scenario runs ``--repeat`` times (default 3) on a fresh key prefix; the table gives
the medians. Results: bench/results/attention-redis-shares.json.

``--engine amqp`` runs the same on RabbitMQ (``--amqp-url``, default the local broker; a
vhost of its own per run, made and deleted through the management API), the redis-server
as its ``?store=``: the work in RabbitMQ's queues, the signals, tickets and scheduler in
Redis (docs/rabbitmq.md). The work queues share one dead-letter queue (a RabbitMQ queue
per key is enough). Results: bench/results/attention-amqp-shares.json.

    python -m bench.attention_redis_shares                 # ~6 min
    python -m bench.attention_redis_shares --quick --repeat 1
    python -m bench.attention_redis_shares --url redis://127.0.0.1:6379/0   # a given Redis
    python -m bench.attention_redis_shares --shards 8   # each domain in 8 shards
    python -m bench.attention_redis_shares --engine amqp --url redis://127.0.0.1:17100/0

``--shards N`` declares the domains with ``shards=N`` (work queues
``{domain}-{shard}.{key}.work``): B's 2,000 keys spread over every shard, A's one key
in one of them, and the shares must hold across the shards.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import secrets
import socket
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

import fairq

from .contention import WORKERS, declare, read, spawn, stop, wait_line

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
PORTS = range(16500, 16550)
SCENARIOS = ("shares", "shares_messages", "capped", "rate2")

sys.path.insert(0, str(ROOT / "tests"))
from redis_servers import RedisServer  # noqa: E402


def _free_port() -> int:
    for port in PORTS:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 16500-16549")


def _prefixed(url: str) -> str:
    sep = "&" if "?" in url else "?"
    return f"{url}{sep}prefix=bench-{secrets.token_hex(4)}:"


#: the RabbitMQ to run on with ``--engine amqp`` (empty: Redis alone)
AMQP: dict[str, str] = {}
#: what every domain is declared with besides its plans (RabbitMQ: one shared DLQ)
OPTIONS: dict[str, Any] = {}


@contextlib.contextmanager
def _engine_url(redis_url: str) -> Iterator[str]:
    """The URL of one run: a fresh key prefix on Redis; on RabbitMQ also a fresh vhost (its
    store that Redis prefix), deleted afterwards."""
    store = _prefixed(redis_url)
    if not AMQP:
        yield store
        return
    from fairq.backends.amqp.link import parse_url
    from fairq.backends.amqp.management import Management

    parsed = parse_url(AMQP["url"] + "?store=memory://")
    api = Management(parsed.management or "", parsed.user, parsed.password, timeout=600.0)
    vhost = f"fairq-bench-{secrets.token_hex(4)}"
    try:
        api.add_vhost(vhost, parsed.user)
        yield f"{AMQP['url'].rstrip('/')}/{vhost}?timeout=60&store={quote(store, safe='')}"
    finally:
        api.delete_vhost(vhost)


def _sharded(shards: int) -> dict[str, Any]:
    return {**OPTIONS, "shards": shards} if shards > 1 else dict(OPTIONS)


async def shares(
    url: str, tmp: Path, quick: bool, capped: bool, charge: str, shards: int = 1
) -> dict[str, Any]:
    """bench.contention.shares on ``url``: the backlogs first, then the workers; worker
    time by the backend's tenant stats over a window that starts 2 s in."""
    plans = {"basic": fairq.Plan(WORKERS, 50, 20.0), "one": fairq.Plan(1, 50, 20.0)}
    await declare(url, "ab", plans, charge=charge, **_sharded(shards))
    window = 5.0 if quick else 10.0
    deep, keys = (30_000, 1_000) if quick else (60_000, 2_000)
    spec = {
        "kind": "backlog",
        "domain": "ab",
        "keys": [["A-0", "A", "one" if capped else None, deep]]
        + [[f"B-{i}", "B", None, 10] for i in range(keys)],
    }
    publisher = spawn("publish", url, json.dumps(spec))
    wait_line(publisher, "published", timeout=300)
    publisher.wait()
    out = tmp / "work.json"
    spec_w = {"slots": WORKERS, "domain": "ab", "seconds": 600, "sample": True}
    worker = spawn("work", url, json.dumps(spec_w), str(out))
    wait_line(worker, "ready")
    t0 = time.time() + 2.0
    await asyncio.sleep(2.0 + window)
    stop(worker)
    got = read(out)
    in_window = [(t, tag) for t, tag, _ in got["seen"] if t0 <= t < t0 + window]
    messages = Counter(tag for _, tag in in_window)
    busy = Counter(got["busy"])
    rows = got["samples"]
    first = min(rows, key=lambda r: abs(r[0] - t0))
    last = min(rows, key=lambda r: abs(r[0] - (t0 + window)))
    gain = {
        t["tenant"]: t["busy"]
        - next((x["busy"] for x in first[1] if x["tenant"] == t["tenant"]), 0.0)
        for t in last[1]
    }
    total = sum(gain.values())
    window_rows = [r for r in rows if t0 <= r[0] <= t0 + window]
    flags = [any(x["tenant"] == "A" and x["at_cap"] for x in r[1]) for r in window_rows]
    return {
        "messages": dict(messages),
        "messages_per_s": sum(messages.values()) / window,
        "messages_B_per_A": messages["B"] / max(1, messages["A"]),
        "worker_s": gain,
        "worker_B_per_A": gain.get("B", 0.0) / max(1e-9, gain.get("A", 0.0)),
        "handler_B_per_A": busy["B"] / max(1e-9, busy["A"]),
        "share_A": gain.get("A", 0.0) / total if total else 0.0,
        "A_at_cap_fraction": sum(flags) / len(flags) if flags else 0.0,
    }


async def rate2(url: str, tmp: Path, quick: bool, shards: int = 1) -> dict[str, Any]:
    """bench.contention.rate2 on ``url``."""
    n, rate = (200, 20.0) if quick else (2_000, 20.0)
    plans = {"basic": fairq.Plan(1, 100, 20.0, rate=rate, burst=1.0)}
    await declare(url, "limited", plans, **_sharded(shards))
    outs = [tmp / f"w{i}.json" for i in range(2)]
    spec = json.dumps({"slots": 2, "domain": "limited", "seconds": 0})
    workers = [spawn("work", url, spec, str(o)) for o in outs]
    for w in workers:
        wait_line(w, "ready")
    pub = {"kind": "backlog", "domain": "limited", "keys": [["api", None, None, n]]}
    publisher = spawn("publish", url, json.dumps(pub))
    wait_line(publisher, "published")
    publisher.wait()
    async with await fairq.connect(url) as broker:
        q = await broker.attention("limited").queue("api")
        while (await q.stats()).acked < n:  # noqa: ASYNC110 - the benchmark's progress poll
            await asyncio.sleep(0.5)
    for w in workers:
        stop(w)
    got = [read(o) for o in outs]
    stamps = sorted(t for g in got for t, _, _ in g["seen"])
    takes = sum(g["takes"] for g in got)
    return {
        "messages": len(stamps),
        "takes": takes,
        "takes_per_message": takes / max(1, len(stamps)),
        "rate": (len(stamps) - 1) / (stamps[-1] - stamps[0]),
        "per_process": [len(g["seen"]) for g in got],
    }


async def one(name: str, base: str, quick: bool, shards: int) -> dict[str, Any]:
    with _engine_url(base) as url, tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        if name == "rate2":
            return await rate2(url, tmp, quick, shards)
        charge = "messages" if name == "shares_messages" else "time"
        return await shares(url, tmp, quick, name == "capped", charge, shards)


def _median(runs: list[dict[str, Any]], field: str) -> float:
    return statistics.median(float(r[field]) for r in runs)


def checks(med: dict[str, dict[str, float]]) -> list[tuple[str, bool]]:
    out = []
    if "shares" in med:
        x = med["shares"]
        out.append(
            (
                f"shares: worker time B/A = {x['worker_B_per_A']:.2f} (target 0.8-1.25); "
                f"handler time B/A {x['handler_B_per_A']:.2f}; messages B/A "
                f"{x['messages_B_per_A']:.2f}; {x['messages_per_s']:.0f} msgs/s",
                0.8 <= x["worker_B_per_A"] <= 1.25,
            )
        )
    if "shares_messages" in med:
        x = med["shares_messages"]
        out.append(
            (
                f"shares, charge='messages': messages B/A = {x['messages_B_per_A']:.2f} "
                "(target 0.8-1.25)",
                0.8 <= x["messages_B_per_A"] <= 1.25,
            )
        )
    if "capped" in med:
        x = med["capped"]
        out.append(
            (
                f"capped: A's share {x['share_A']:.2f} (one worker of 4: 0.25), B the rest; "
                f"stats say A at cap in {x['A_at_cap_fraction']:.0%} of samples",
                abs(x["share_A"] - 0.25) <= 0.05 and x["A_at_cap_fraction"] >= 0.9,
            )
        )
    if "rate2" in med:
        x = med["rate2"]
        out.append(
            (
                f"rate=20, burst=1, 2 processes x 2: {x['takes_per_message']:.2f} take attempts "
                f"per message (target <= 1.5), {x['rate']:.2f}/s (target 20 ± 5 %)",
                x["takes_per_message"] <= 1.5 and abs(x["rate"] - 20) <= 1.0,
            )
        )
    return out


_FIELDS = {
    "shares": (
        "worker_B_per_A",
        "handler_B_per_A",
        "messages_B_per_A",
        "messages_per_s",
        "share_A",
        "A_at_cap_fraction",
    ),
    "rate2": ("takes_per_message", "rate"),
}


async def run(
    names: Sequence[str], base: str, quick: bool, repeat: int, shards: int = 1
) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for i in range(repeat):  # the scenarios interleaved, so drift hits them alike
        for name in names:
            print(f"{name} run {i + 1}/{repeat} ...", flush=True)
            runs[name].append(await one(name, base, quick, shards))
    medians = {
        n: {f: _median(runs[n], f) for f in _FIELDS["rate2" if n == "rate2" else "shares"]}
        for n in names
    }
    return {"runs": runs, "medians": medians}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.attention_redis_shares", description=__doc__
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", default=",".join(SCENARIOS))
    parser.add_argument("--url", help="a Redis to use (default: a private redis-server)")
    parser.add_argument("--shards", type=int, default=1, help="shards of each domain")
    parser.add_argument("--engine", choices=("redis", "amqp"), default="redis")
    parser.add_argument("--amqp-url", default="amqp://guest:guest@127.0.0.1:5672")
    args = parser.parse_args(argv)
    if args.engine == "amqp":
        AMQP["url"] = args.amqp_url
        OPTIONS["queue_options"] = {"dead_letter": "bench.dlq"}
    names = [n for n in args.only.split(",") if n]
    for n in names:
        if n not in SCENARIOS:
            parser.error(f"unknown scenario {n!r}")
    started = time.time()
    server = None
    if args.url:
        base = args.url
    else:
        workdir = Path(tempfile.mkdtemp(prefix="fairq-shares-"))
        server = RedisServer(workdir, _free_port(), "--appendonly", "no").start()
        base = server.url
    try:
        results = asyncio.run(run(names, base, args.quick, args.repeat, args.shards))
    finally:
        if server is not None:
            server.kill()
    entry = {
        "at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
        "wall_s": round(time.time() - started, 1),
        "engine": args.engine,
        "redis": "private redis-server" if server is not None else "given URL",
        "repeat": args.repeat,
        "quick": args.quick,
        "shards": args.shards,
        **results,
        "checks": [{"text": t, "holds": ok} for t, ok in checks(results["medians"])],
    }
    RESULTS.mkdir(exist_ok=True)
    stem = "attention-amqp-shares" if args.engine == "amqp" else "attention-redis-shares"
    name = stem + (f"-{args.shards}shards" if args.shards > 1 else "")
    path = RESULTS / (name + ("-quick.json" if args.quick else ".json"))
    path.write_text(json.dumps(entry, indent=2))
    for c in entry["checks"]:
        print(("holds " if c["holds"] else "FAILS ") + c["text"])
    print(json.dumps(results["medians"], indent=2))
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
