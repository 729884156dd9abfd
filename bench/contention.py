"""Attention under real contention (issue 16), measured on SQLite: the publisher runs in
a process of its own, the workers in others; 4 workers (slots), 1 ms handlers.

  shares   tenant A: one deep key; tenant B: 2,000 keys of 10 messages; one plan that lets
           A fan out (4 slices). Worker-time share B/A (target 0.8-1.25), charged in time
           and, as a second run, in messages.
  capped   the same with A's key at max_concurrency=1: A gets one worker of four, B the
           rest (work-conserving), and the tenant stats say A is at its cap.
  burst    a deep key keeps the workers busy; 500 small keys x 2 messages arrive at once:
           the small keys' wait (publish to handler start), with the burst published from
           the workers' own process and from another process (SQLite's write lock); and
           the same messages from another process into one shared queue consumed by the
           same Worker. Targets: cross-process p99 <= 3x in-process; shared queue >= 20x
           the cross-process attention p99. ``--runs N`` repeats the three (medians).
  rate2    Plan(rate=20, burst=1), 2,000 messages, 2 worker processes x 2 slots: take
           attempts (attention_take calls) per handled message (target <= 1.5) and the
           rate reached (target 20/s within 5 %).
  chaos    kill -9 of a worker process 100 times while a publisher feeds 1,000 msgs/s: the
           messages delivered again per kill, attention slices vs a plain queue consumer
           (target <= 2x), and "lease ... lost" warnings (target 0).

    python -m bench.contention                        # every scenario (~8 min)
    python -m bench.contention --quick                # short runs (~2 min)
    python -m bench.contention --only shares,rate2
    python -m bench.contention --only burst --runs 3       # the burst's medians of 3
    python -m bench.contention --fairq-src /tmp/old/src --label before   # another fairq

Each scenario runs its processes on a fresh SQLite file. Results: a table, and
bench/results/attention-contention.json (``--quick``: attention-contention-quick.json);
``--plot`` draws docs/bench-attention-contention.png from the JSON. ``--fairq-src`` runs
every process of the scenarios on another fairq (a ``git archive`` of an older commit):
what the scheduler measured before this one (it needs no tenant stats or charge modes).
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import fairq

from .contention_report import BURSTS, WORKERS, checks, plot

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
PNG = ROOT / "docs" / "bench-attention-contention.png"
SCENARIOS = ("shares", "capped", "burst", "rate2", "chaos")
HANDLER = 0.001  # seconds every handler takes (an awaited sleep, like an API call)
LOST = ("is lost while it runs", "were lost before the ack", "was lost before it was settled")


# -- the processes -------------------------------------------------------------------------
def spawn(role: str, *args: str, stderr: Any = None) -> subprocess.Popen[bytes]:
    """A process of this module in ``role`` (same interpreter, same PYTHONPATH)."""
    cmd = [sys.executable, "-m", "bench.contention", "--role", role, *args]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=stderr)


def wait_line(proc: subprocess.Popen[bytes], word: str, timeout: float = 60.0) -> None:
    """Wait until ``proc`` prints a line starting with ``word``."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline().decode()
        if line.startswith(word):
            return
        if not line and proc.poll() is not None:
            raise RuntimeError(f"a {word!r} process ended early (exit {proc.returncode})")
    raise RuntimeError(f"no {word!r} line within {timeout} s")


def stop(proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    proc.wait(timeout)


def body(tag: str) -> bytes:
    return f"{tag}|{time.time():.6f}".encode()


def tag_of(msg: fairq.Received) -> tuple[str, float]:
    tag, sent = msg.body.split(b"|", 1)
    return tag.decode(), float(sent)


async def role_publish(url: str, spec: dict[str, Any]) -> None:
    """Publish what ``spec`` says, then print "published" (and for ``feed``, go on)."""
    async with await fairq.connect(url) as broker:
        kind = spec["kind"]
        if kind == "feed":  # a steady feed until SIGTERM
            await feed(broker, spec)
            return
        if spec.get("queue"):  # the burst into one shared queue
            await shared_burst(broker.queue(spec["queue"]), spec)
            print("published", flush=True)
            return
        a = broker.attention(spec["domain"])
        for key, tenant, plan, n in spec["keys"]:
            if tenant or plan:
                await a.set_resource(key, tenant=tenant, plan=plan)
            for i in range(0, n, 1000):
                await a.publish_batch(
                    key, [fairq.Outgoing(body(tenant or key)) for _ in range(min(1000, n - i))]
                )
        if kind == "burst":
            await asyncio.sleep(spec["after"])
            await burst(a, spec["small"])
        print("published", flush=True)


async def burst(a: Any, small: int) -> None:
    """500 small keys x 2 messages, as many concurrent publishes (API requests) do."""

    async def one(i: int) -> None:
        await a.publish_batch(f"small-{i}", [fairq.Outgoing(body("small")) for _ in range(2)])

    for start in range(0, small, 50):
        await asyncio.gather(*(one(i) for i in range(start, min(small, start + 50))))


async def shared_burst(q: fairq.Queue, spec: dict[str, Any]) -> None:
    """The burst scenario's messages into one shared queue: the noisy backlog, then (after
    ``after`` seconds) the small keys' sends, 50 at a time, as :func:`burst` publishes."""
    for key, _, _, n in spec["keys"]:
        for i in range(0, n, 1000):
            await q.send_batch([fairq.Outgoing(body(key)) for _ in range(min(1000, n - i))])
    await asyncio.sleep(spec["after"])

    async def one() -> None:
        await q.send_batch([fairq.Outgoing(body("small")) for _ in range(2)])

    for start in range(0, spec["small"], 50):
        await asyncio.gather(*(one() for _ in range(start, min(spec["small"], start + 50))))


async def feed(broker: fairq.Broker, spec: dict[str, Any]) -> None:
    """``rate`` messages per second (in batches of 10) until SIGTERM."""
    stopping = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopping.set)
    rng = random.Random(1)
    print("published", flush=True)
    t0, sent = time.monotonic(), 0
    while not stopping.is_set():
        due = t0 + sent / spec["rate"]
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        batch = [fairq.Outgoing(body("c")) for _ in range(10)]
        if spec["domain"]:
            await broker.attention(spec["domain"]).publish_batch(
                f"k{rng.randrange(spec['keys'])}", batch
            )
        else:
            await broker.queue(spec["queue"]).send_batch(batch)
        sent += 10


async def role_work(url: str, spec: dict[str, Any]) -> dict[str, Any]:
    """A worker process: handlers of 1 ms (a few slow ones for ``chaos``); what it saw,
    once SIGTERM (or ``seconds``) ends it."""
    broker = await fairq.connect(url)
    backend = broker.backend
    takes = 0
    take = backend.attention_take

    async def counted(domain: str) -> Any:
        nonlocal takes
        takes += 1
        return await take(domain)

    backend.attention_take = counted  # type: ignore[method-assign]
    seen: list[tuple[float, str, float]] = []  # (handler start, tag, sent)
    busy: Counter[str] = Counter()
    worker = fairq.Worker(broker, concurrency=spec["slots"], poll_wait=1.0)
    slow = spec.get("slow", 0)

    async def handle(msg: fairq.Received) -> None:
        started = time.time()
        tag, sent = tag_of(msg)
        seen.append((started, tag, sent))
        if slow and hash(msg.id) % slow == 0:
            await asyncio.sleep(0.6)  # past half the lease: the keeper extends it
        else:
            await asyncio.sleep(HANDLER)
        busy[tag] += time.time() - started

    if spec.get("queue"):
        worker.queue(spec["queue"], concurrency=spec["slots"])(handle)
    else:
        worker.attention(spec["domain"])(handle)
    samples: list[tuple[float, list[dict[str, Any]]]] = []

    async def sample() -> None:  # the tenant stats, once a second
        a = broker.attention(spec["domain"])
        while hasattr(a, "tenant_stats"):
            await asyncio.sleep(1.0)
            rows = await a.tenant_stats(top=5)
            samples.append((time.time(), [_row(t) for t in rows]))

    sampler = asyncio.create_task(sample()) if spec.get("sample") else None
    run = asyncio.create_task(worker.run())
    print("ready", flush=True)
    if spec.get("burst_here"):
        await asyncio.sleep(spec["after"])
        await burst(broker.attention(spec["domain"]), spec["small"])
    if spec.get("seconds"):
        await asyncio.wait([run], timeout=spec["seconds"])
        worker.stop()
    await run
    if sampler is not None:
        sampler.cancel()
    await broker.close()
    return {"takes": takes, "seen": seen, "busy": busy, "samples": samples}


def _row(t: Any) -> dict[str, Any]:
    return {
        "tenant": t.tenant,
        "share": t.share,
        "busy": t.busy,
        "slices": t.slices,
        "messages": t.messages,
        "at_cap": t.at_cap,
        "backlog": t.backlog,
    }


# -- the scenarios -------------------------------------------------------------------------
async def declare(url: str, domain: str, plans: dict[str, fairq.Plan], **kw: Any) -> None:
    async with await fairq.connect(url) as broker:
        if kw.get("charge", "time") == "time":
            kw.pop("charge", None)  # a fairq from before charge modes
        await broker.declare_attention(domain, plans=plans, **kw)


def _text(path: Path) -> str:
    return path.read_text(errors="replace")


def read(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


async def shares(tmp: Path, quick: bool, capped: bool, charge: str = "time") -> dict[str, Any]:
    url = f"sqlite:///{tmp}/shares.db"
    plans = {"basic": fairq.Plan(WORKERS, 50, 20.0), "one": fairq.Plan(1, 50, 20.0)}
    await declare(url, "ab", plans, charge=charge)
    window = 5.0 if quick else 10.0
    deep, keys = (30_000, 1_000) if quick else (60_000, 2_000)
    spec = {
        "kind": "backlog",
        "domain": "ab",
        "keys": [["A-0", "A", "one" if capped else None, deep]]
        + [[f"B-{i}", "B", None, 10] for i in range(keys)],
    }
    # the backlogs first, then the workers: the window measures the scheduler, not slices
    # stalled on the write lock of a publisher that shares the file (that is burst's)
    publisher = spawn("publish", url, json.dumps(spec))
    wait_line(publisher, "published", timeout=300)
    publisher.wait()
    out = tmp / "work.json"
    spec_w = {"slots": WORKERS, "domain": "ab", "seconds": 600, "sample": True}
    worker = spawn("work", url, json.dumps(spec_w), str(out))
    wait_line(worker, "ready")
    t0 = time.time() + 2.0  # the window starts once every worker has been busy a while
    await asyncio.sleep(2.0 + window)
    stop(worker)
    got = read(out)
    in_window = [(t, tag) for t, tag, _ in got["seen"] if t0 <= t < t0 + window]
    messages = Counter(tag for _, tag in in_window)
    result: dict[str, Any] = {
        "charge": charge,
        "capped": capped,
        "window_s": window,
        "messages": dict(messages),
        "messages_B_per_A": messages["B"] / max(1, messages["A"]),
    }
    # worker time by the backend's tenant stats: busy seconds gained over the window
    rows = got["samples"]
    if rows:
        first = min(rows, key=lambda r: abs(r[0] - t0))
        last = min(rows, key=lambda r: abs(r[0] - (t0 + window)))
        gain = {
            t["tenant"]: t["busy"]
            - next((x["busy"] for x in first[1] if x["tenant"] == t["tenant"]), 0.0)
            for t in last[1]
        }
        result["worker_s"] = gain
        result["worker_B_per_A"] = gain.get("B", 0.0) / max(1e-9, gain.get("A", 0.0))
        total = sum(gain.values())
        result["share_A"] = gain.get("A", 0.0) / total if total else 0.0
        result["B_backlog_at_end"] = next((x["backlog"] for x in last[1] if x["tenant"] == "B"), 0)
        window_rows = [r for r in rows if t0 <= r[0] <= t0 + window]
        flags = [any(x["tenant"] == "A" and x["at_cap"] for x in r[1]) for r in window_rows]
        result["A_at_cap_fraction"] = sum(flags) / len(flags) if flags else None
    else:  # a fairq without tenant stats: the handlers' own time per tenant
        busy = Counter(got["busy"])
        result["handler_B_per_A"] = busy["B"] / max(1e-9, busy["A"])
        total_m = sum(messages.values())
        result["share_A"] = messages["A"] / total_m if total_m else 0.0
    return result


async def burst_wait(tmp: Path, quick: bool, cross: bool, shared: bool = False) -> dict[str, Any]:
    """The burst: the small keys' waits with the publisher in the workers' process, in
    another (``cross``), or (``shared``) the same messages from another process into one
    shared queue that the same Worker consumes."""
    url = f"sqlite:///{tmp}/burst.db"
    if shared:
        async with await fairq.connect(url) as broker:
            await broker.declare_queue("burst", dead_letter=None)
    else:
        await declare(url, "burst", {"basic": fairq.Plan(1, 50, 20.0)})
    small = 200 if quick else 500
    out = tmp / "work.json"
    spec: dict[str, Any] = {"slots": WORKERS, "seconds": 600}
    spec.update({"queue": "burst"} if shared else {"domain": "burst"})
    if not cross:
        spec.update(burst_here=True, after=3.0, small=small)
    worker = spawn("work", url, json.dumps(spec), str(out))
    wait_line(worker, "ready")
    pub: dict[str, Any] = {"kind": "burst" if cross else "backlog", "domain": "burst"}
    pub.update(keys=[["noisy", None, None, 50_000]], small=small, after=2.0)
    if shared:
        pub["queue"] = "burst"
    publisher = spawn("publish", url, json.dumps(pub))
    wait_line(publisher, "published", timeout=300)
    publisher.wait()
    await asyncio.sleep(2.0 if cross else 3.0)
    async with await fairq.connect(url) as broker:  # until every small message started
        for _ in range(1200 if shared else 600):
            if shared:  # the small messages are the queue's last: it is empty then
                s = await broker.queue("burst").stats()
                if s.visible + s.in_flight == 0:
                    break
            else:
                keys = await broker.attention("burst").key_stats(top=10_000)
                rows = [k for k in keys if k.key.startswith("small")]
                if len(rows) == small and sum(k.backlog + k.in_flight for k in rows) == 0:
                    break
            await asyncio.sleep(0.1)
    stop(worker)
    got = read(out)
    waits = sorted(t - sent for t, tag, sent in got["seen"] if tag == "small")
    return {
        "publisher": "another process" if cross else "the workers' process",
        "consumer": "one shared queue" if shared else "attention",
        "small_messages": len(waits),
        "p50_s": waits[len(waits) // 2] if waits else None,
        "p99_s": waits[min(len(waits) - 1, int(len(waits) * 0.99))] if waits else None,
        "max_s": waits[-1] if waits else None,
    }


async def rate2(tmp: Path, quick: bool) -> dict[str, Any]:
    url = f"sqlite:///{tmp}/rate.db"
    n, rate = (200, 20.0) if quick else (2_000, 20.0)
    await declare(url, "limited", {"basic": fairq.Plan(1, 100, 20.0, rate=rate, burst=1.0)})
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
        "target_rate": rate,
        "per_process": [len(g["seen"]) for g in got],
    }


async def chaos(tmp: Path, quick: bool, queue: bool) -> dict[str, Any]:
    url = f"sqlite:///{tmp}/chaos.db"
    kills = 10 if quick else 100
    async with await fairq.connect(url) as broker:
        if queue:
            await broker.declare_queue("chaos", visibility_timeout=1.0, dead_letter=None)
        else:
            await broker.declare_attention(
                "chaos",
                plans={"basic": fairq.Plan(1, 50, 20.0)},
                queue_options={"visibility_timeout": 1.0, "dead_letter": None},
                slice_lease=2.0,
            )
    spec = {"slots": WORKERS, "slow": 100}
    spec.update({"queue": "chaos"} if queue else {"domain": "chaos"})
    feed_spec = {"kind": "feed", "rate": 1000.0, "keys": 100}
    feed_spec.update({"domain": None, "queue": "chaos"} if queue else {"domain": "chaos"})
    logs: list[Path] = []
    n = 0

    def start() -> subprocess.Popen[bytes]:
        nonlocal n
        n += 1
        log = tmp / f"worker-{n}.log"
        logs.append(log)
        with log.open("wb") as f:
            p = spawn("work", url, json.dumps(spec), str(tmp / f"w{n}.json"), stderr=f)
        wait_line(p, "ready")
        return p

    publisher = spawn("publish", url, json.dumps(feed_spec))
    wait_line(publisher, "published")
    alive = [start(), start()]
    rng = random.Random(3)
    for _ in range(kills):
        await asyncio.sleep(rng.uniform(0.5, 1.0))
        victim = alive.pop(0)  # the one up longer
        victim.kill()
        victim.wait()
        alive.append(start())
    stop(publisher)
    await asyncio.sleep(3.0)  # the dead workers' leases run out; the others catch up
    for p in alive:
        stop(p)
    async with await fairq.connect(url) as broker:
        if queue:
            s = await broker.queue("chaos").stats()
            redelivered, acked = s.redelivered, s.acked
        else:
            a = broker.attention("chaos")
            redelivered = acked = 0
            for k in await a.key_stats(top=1000):
                s = await (await a.queue(k.key)).stats()
                redelivered += s.redelivered
                acked += s.acked
    text = "".join(map(_text, logs))
    return {
        "consumer": "plain queue" if queue else "attention slices",
        "kills": kills,
        "redelivered": redelivered,
        "redelivered_per_kill": redelivered / kills,
        "acked": acked,
        "lease_lost_warnings": sum(text.count(w) for w in LOST),
    }


async def bursts(tmp: Path, quick: bool, runs: int) -> dict[str, Any]:
    """The three burst variants, ``runs`` rounds of each in turn; the medians of their
    figures (and every run), and the ratios the issue asks for, per round and median."""
    each: dict[str, list[dict[str, Any]]] = {k: [] for k in BURSTS}
    for n in range(runs):
        for name, (cross, shared) in BURSTS.items():
            d = tmp / f"{name}-{n}"
            d.mkdir()
            each[name].append(await burst_wait(d, quick, cross, shared))
            print(f"  {name} run {n + 1}: p99 {each[name][-1]['p99_s']:.3f} s", flush=True)
    out: dict[str, Any] = {}
    for name, rows in each.items():
        out[name] = dict(rows[0])
        for k in ("small_messages", "p50_s", "p99_s", "max_s"):
            values = [r[k] for r in rows if r[k] is not None]
            out[name][k] = statistics.median(values) if values else None
        out[name]["runs"] = rows
    cross = [r["p99_s"] for r in each["burst_cross_process"]]
    inside = [r["p99_s"] for r in each["burst_in_process"]]
    shared = [r["p99_s"] for r in each["burst_shared_queue"]]
    out["burst_ratios"] = {
        "runs": runs,
        "cross_over_in_process_p99": _ratio(out, "burst_cross_process", "burst_in_process"),
        "shared_over_cross_p99": _ratio(out, "burst_shared_queue", "burst_cross_process"),
        "cross_over_in_process_each": [c / i for c, i in zip(cross, inside, strict=True)],
        "shared_over_cross_each": [q / c for q, c in zip(shared, cross, strict=True)],
    }
    return out


def _ratio(out: dict[str, Any], top: str, bottom: str) -> float:
    return float(out[top]["p99_s"]) / max(1e-9, float(out[bottom]["p99_s"]))


async def run(names: Sequence[str], quick: bool, runs: int = 1) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in names:
        with tempfile.TemporaryDirectory() as d:
            tmp = Path(d)
            print(f"{name} ...", flush=True)
            if name == "shares":
                out["shares"] = await shares(tmp, quick, capped=False)
                if _has_charge_modes():
                    (tmp / "m").mkdir()
                    out["shares_messages"] = await shares(tmp / "m", quick, False, "messages")
            elif name == "capped":
                out["capped"] = await shares(tmp, quick, capped=True)
            elif name == "burst":
                out.update(await bursts(tmp, quick, runs))
            elif name == "rate2":
                out["rate2"] = await rate2(tmp, quick)
            elif name == "chaos":
                out["chaos_attention"] = await chaos(tmp, quick, queue=False)
                (tmp / "q").mkdir()
                out["chaos_queue"] = await chaos(tmp / "q", quick, queue=True)
    return out


def _has_charge_modes() -> bool:
    return "charge" in inspect.signature(fairq.Broker.declare_attention).parameters


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.contention", description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", default=",".join(SCENARIOS))
    parser.add_argument("--label", default="this commit")
    parser.add_argument("--runs", type=int, default=1, help="rounds of the burst (medians)")
    parser.add_argument("--fairq-src", help="run on the fairq in this src/ directory")
    parser.add_argument("--plot", action="store_true", help="only redraw the PNG")
    parser.add_argument("--role", help=argparse.SUPPRESS)
    parser.add_argument("rest", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.role == "publish":
        asyncio.run(role_publish(args.rest[0], json.loads(args.rest[1])))
        return 0
    if args.role == "work":
        seen = asyncio.run(role_work(args.rest[0], json.loads(args.rest[1])))
        Path(args.rest[2]).write_text(json.dumps(seen))
        return 0
    name = "attention-contention-quick.json" if args.quick else "attention-contention.json"
    path = RESULTS / name
    if args.plot:
        print(plot(json.loads(path.read_text()), PNG))
        return 0
    if args.fairq_src:  # this process and every one it starts import that fairq
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([args.fairq_src, str(ROOT)]))
        cmd = [sys.executable, "-m", "bench.contention", *(argv or sys.argv[1:])]
        i = cmd.index("--fairq-src")
        del cmd[i : i + 2]
        return subprocess.run(cmd, env=env, cwd=ROOT, check=False).returncode
    names = [n for n in args.only.split(",") if n]
    for n in names:
        if n not in SCENARIOS:
            parser.error(f"unknown scenario {n!r}")
    started = time.time()
    results = asyncio.run(run(names, args.quick, args.runs))
    doc = json.loads(path.read_text()) if path.exists() else {"runs": []}
    runs = [r for r in doc["runs"] if r["label"] != args.label]
    entry = {
        "label": args.label,
        "fairq": str(Path(fairq.__file__).resolve().parents[1]),
        "at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
        "wall_s": round(time.time() - started, 1),
        "results": results,
        "checks": [{"text": t, "holds": ok} for t, ok in checks(results)],
    }
    old = {r["label"]: r for r in doc["runs"]}.get(args.label)
    if old is not None:  # keep scenarios this run did not repeat
        entry["results"] = {**old["results"], **results}
        entry["checks"] = [{"text": t, "holds": ok} for t, ok in checks(entry["results"])]
    runs.append(entry)
    RESULTS.mkdir(exist_ok=True)
    path.write_text(json.dumps({"runs": runs}, indent=2))
    for c in entry["checks"]:
        print(("holds " if c["holds"] else "FAILS ") + c["text"])
    print(json.dumps(results, indent=2))
    print(f"results: {path}")
    if not args.quick:
        print(f"plot: {plot(json.loads(path.read_text()), PNG)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
