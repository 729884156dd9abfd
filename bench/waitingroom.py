"""Waiting-room benchmark (SPEC §8, issue 7's acceptance), in one run on one backend:

1. **2,000,000 fans join** one room through ``join_many`` (batches of 1,000; random
   24-character fan ids like the HTTP layer's anonymous ones), then 50,000 more with one
   ``join`` per call from 64 concurrent tasks — fans/s each way;
2. **status** with 2,000,000 waiting: latency of single ``room_status`` calls at the
   backend seam (p50/p99, target p99 < 5 ms), and throughput of ``WaitingRoom.status``
   (ticket check + backend step) serially and from 64 concurrent tasks;
3. **storage** per waiting fan: the growth of the SQLite file (after a checkpoint) over the
   fans joined, and the fans table's own pages (``dbstat``) when SQLite has it;
4. **HTTP** (``--http``, needs ``wrk``): uvicorn with 2 worker processes serving the rooms
   routes and a bare Starlette endpoint in the same app; ``wrk`` drives ``POST
   /rooms/bench/join`` (a new fan per request), ``GET /rooms/bench/status?ticket=`` (10,000
   tickets of the 2,000,000 in turn) and ``GET /bare``;
5. **admission accuracy**: ``run_admitter`` at 500 fans/s for ``--admit-seconds`` (60):
   admitted fans against rate × time (target within 1%), with the 2,000,000 waiting;
6. **sold out reaches a waiting fan within one refresh interval**: 400 fans (near the
   front and far back) poll at the interval the room suggests (2–30 s); ``sold_out()``;
   for each fan, the time until it saw ``sold_out`` over its refresh interval (≤ 1).

    python -m bench.waitingroom                          # the full run (~10 min), SQLite
    python -m bench.waitingroom --quick                  # 100,000 fans, 10 s of admission
    python -m bench.waitingroom --url redis://...        # another backend

Results: a rich table and ``bench/results/waitingroom[-<engine>][-quick].json`` (no engine
suffix for SQLite).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import re
import secrets
import shutil
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

import fairq
from bench.servers import free_port, served
from fairq.waitingroom import refresh_interval

RESULTS = Path(__file__).resolve().parent / "results"
ROOM = "bench"
ROOT = Path(__file__).resolve().parents[1]


def fan_ids(n: int) -> list[str]:
    return ["f-" + secrets.token_urlsafe(16) for _ in range(n)]


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p * len(ordered)) - 1))]


def sqlite_path(url: str) -> Path | None:
    if not url.startswith("sqlite:///"):
        return None
    return Path(url[len("sqlite:///") :].split("?")[0])


def db_bytes(path: Path) -> int:
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        pages, size = (
            conn.execute("PRAGMA page_count").fetchone()[0],
            conn.execute("PRAGMA page_size").fetchone()[0],
        )
        return int(pages * size)
    finally:
        conn.close()


def table_bytes(path: Path, table: str) -> int | None:
    conn = sqlite3.connect(path)
    try:
        (n,) = conn.execute("SELECT sum(pgsize) FROM dbstat WHERE name = ?", (table,)).fetchone()
        return int(n or 0)
    except sqlite3.Error:
        return None
    finally:
        conn.close()


# -- 1-3: the library --------------------------------------------------------------------------
async def library(url: str, fans: int, out: dict[str, Any], console: Console) -> list[str]:
    """Fill the room; measure joins, status and storage; return a sample of tickets."""
    path = sqlite_path(url)
    async with await fairq.connect(url) as broker:
        await broker.delete_room(ROOM)
        room = await broker.waiting_room(ROOM, admit_rate=500.0)
        before = db_bytes(path) if path else 0
        ids = fan_ids(fans)
        sample: list[str] = []
        t0 = time.perf_counter()
        for i in range(0, fans, 1000):
            tickets = await room.join_many(ids[i : i + 1000])
            if i % 200_000 == 0:
                console.print(f"  joined {i + len(tickets):,} fans")
            sample.extend(t.ticket for t in random.sample(tickets, 5) if t.ticket)
        batch_s = time.perf_counter() - t0
        out["fans"] = fans
        out["join_many_fans_per_s"] = fans / batch_s
        console.print(f"  {fans:,} fans joined in {batch_s:.1f} s (join_many, batches of 1,000)")

        singles = fan_ids(50_000)
        t0 = time.perf_counter()

        async def joiner(part: list[str]) -> None:
            for f in part:
                await room.join(f)

        await asyncio.gather(*(joiner(singles[k::64]) for k in range(64)))
        out["join_per_s"] = len(singles) / (time.perf_counter() - t0)

        if path:
            grown = db_bytes(path) - before
            out["bytes_per_fan"] = grown / (fans + len(singles))
            table = table_bytes(path, "fairq_room_fans")
            if table is not None:
                out["fans_table_bytes_per_fan"] = table / (fans + len(singles))

        # status latency at the seam, one call at a time, with everyone waiting
        seqs = [room.keys.parse_ticket(t)[0] for t in sample]
        lat = []
        for _ in range(3):
            for seq in seqs:
                t0 = time.perf_counter()
                place = await broker.backend.room_status(ROOM, seq)
                lat.append(time.perf_counter() - t0)
                assert place.state == "waiting"
        out["status_backend_p50_ms"] = 1000 * pct(lat, 0.50)
        out["status_backend_p99_ms"] = 1000 * pct(lat, 0.99)
        st = await room.status(sample[seqs.index(max(seqs))])
        out["last_position"] = st.position

        t0 = time.perf_counter()
        for t in sample[:10_000]:
            await room.status(t)
        out["status_serial_per_s"] = min(10_000, len(sample)) / (time.perf_counter() - t0)
        t0 = time.perf_counter()

        async def poller(part: list[str]) -> None:
            for t in part:
                await room.status(t)

        many = sample * 2
        await asyncio.gather(*(poller(many[k::64]) for k in range(64)))
        out["status_concurrent_per_s"] = len(many) / (time.perf_counter() - t0)
        return sample


# -- 4: HTTP -----------------------------------------------------------------------------------
def _nodelay_everywhere() -> None:
    """uvicorn's multi-worker mode listens on a socket made with protocol 0, and asyncio
    only sets TCP_NODELAY on sockets of protocol IPPROTO_TCP: every small response would
    then wait for the client's delayed ACK (~40 ms). Set it on every TCP socket, as a
    production deployment would; the bare endpoint gets the same."""
    import asyncio.base_events as base_events

    def set_nodelay(sock: socket.socket) -> None:
        if sock.family in (socket.AF_INET, socket.AF_INET6) and sock.type == socket.SOCK_STREAM:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    base_events._set_nodelay = set_nodelay  # type: ignore[attr-defined]


def http_app() -> Any:
    """The app each uvicorn worker serves: the rooms routes and a bare endpoint."""
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from fairq.http.rooms import rooms_app

    _nodelay_everywhere()
    app: Starlette = rooms_app(url=os.environ["FAIRQ_BENCH_URL"], join_rate=1e9, join_burst=1e9)

    async def bare(request: Any) -> JSONResponse:
        return JSONResponse({"ok": True})

    app.router.routes.append(Route("/bare", bare))
    return app


_STATUS_LUA = """
local tickets = {}
for line in io.lines("%s") do tickets[#tickets + 1] = line end
local i = 0
request = function()
  i = i %% #tickets + 1
  return wrk.format("GET", "/rooms/bench/status?ticket=" .. tickets[i])
end
"""
_JOIN_LUA = """
wrk.method = "POST"
wrk.headers["Accept"] = "application/json"
"""


def _wrk(url: str, seconds: float, script: Path | None, connections: int) -> dict[str, float]:
    cmd = ["wrk", "-t2", f"-c{connections}", f"-d{seconds:g}s", "--latency"]
    if script is not None:
        cmd += ["-s", str(script)]
    done = subprocess.run([*cmd, url], capture_output=True, text=True, check=True).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", done).group(1))  # type: ignore[union-attr]
    lat: dict[str, float] = {}
    for name, p in (("p50", "50%"), ("p99", "99%")):
        found = re.search(rf"{p}\s+([\d.]+)(us|ms|s)", done)
        if found:
            value = float(found.group(1)) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[found.group(2)]
            lat[name] = value
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", done)
    return {
        "rps": rps,
        "p50_ms": lat.get("p50", 0.0),
        "p99_ms": lat.get("p99", 0.0),
        "non_2xx": float(errors.group(1)) if errors else 0.0,
    }


def http(
    url: str, sample: list[str], seconds: float, out: dict[str, Any], console: Console
) -> None:
    if shutil.which("wrk") is None:
        console.print("[yellow]wrk is not installed: HTTP part skipped (apt-get install wrk)[/]")
        return
    port = free_port()
    env = {"FAIRQ_BENCH_URL": url, "PYTHONPATH": str(ROOT)}
    cmd = [
        sys.executable, "-m", "uvicorn", "bench.waitingroom:http_app", "--factory",
        "--workers", "2", "--port", str(port), "--no-access-log", "--log-level", "warning",
    ]  # fmt: skip
    with served(cmd, port, ROOT, env) as base:
        time.sleep(1.0)  # both workers up
        with tempfile.TemporaryDirectory() as d:
            tickets = Path(d) / "tickets.txt"
            tickets.write_text("\n".join(sample[:10_000]) + "\n")
            status_lua = Path(d) / "status.lua"
            status_lua.write_text(_STATUS_LUA % tickets)
            join_lua = Path(d) / "join.lua"
            join_lua.write_text(_JOIN_LUA)
            _wrk(f"{base}/bare", 2, None, 32)  # warm up
            runs: dict[str, list[dict[str, float]]] = {"bare": [], "status": [], "join": []}
            for _ in range(3):
                runs["bare"].append(_wrk(f"{base}/bare", seconds, None, 64))
                runs["status"].append(_wrk(f"{base}/rooms/bench/status", seconds, status_lua, 64))
                runs["join"].append(_wrk(f"{base}/rooms/bench/join", seconds, join_lua, 64))
            for name, results in runs.items():
                out[f"http_{name}_rps"] = statistics.median(r["rps"] for r in results)
                out[f"http_{name}_p50_ms"] = statistics.median(r["p50_ms"] for r in results)
                out[f"http_{name}_p99_ms"] = statistics.median(r["p99_ms"] for r in results)
                out[f"http_{name}_non_2xx"] = sum(r["non_2xx"] for r in results)


# -- 5-6: admission and sold out ---------------------------------------------------------------
async def admission(url: str, seconds: float, out: dict[str, Any], console: Console) -> None:
    async with await fairq.connect(url) as broker:
        room = await broker.room(ROOM)
        await room.set_rate(500.0)
        task = asyncio.create_task(room.run_admitter())
        await asyncio.sleep(1.0)
        s0, t0 = await room.stats(), time.time()
        await asyncio.sleep(seconds)
        s1, t1 = await room.stats(), time.time()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        expected = 500.0 * (t1 - t0)
        got = s1.admitted - s0.admitted
        out["admit_seconds"] = t1 - t0
        out["admitted"] = got
        out["admit_expected"] = expected
        out["admit_error_pct"] = 100.0 * (got - expected) / expected
        out["measured_rate"] = s1.measured_rate
        console.print(f"  admitted {got:,} in {t1 - t0:.1f} s at 500/s (expected {expected:,.0f})")


async def sold_out_reach(url: str, out: dict[str, Any]) -> None:
    """200 fans at the front and 200 behind 150,000 others poll at the interval the room
    suggests them; the room sells out; how long until each saw it, over its interval."""
    async with await fairq.connect(url) as broker:
        room = await broker.waiting_room(f"{ROOM}-sold-out", admit_rate=500.0)
        front = await room.join_many(fan_ids(200))
        for _ in range(150):
            await room.join_many(fan_ids(1000))
        back = await room.join_many(fan_ids(200))
        tickets = [t.ticket for t in [*front, *back] if t.ticket]
        seen: dict[str, float] = {}
        intervals: dict[str, float] = {}
        told_at = 0.0

        async def poll(ticket: str) -> None:
            await asyncio.sleep(random.uniform(0, 2))
            while True:
                st = await room.status(ticket)
                if st.state == "sold_out":
                    seen[ticket] = time.monotonic()
                    return
                wait = max(2.0, min(30.0, refresh_interval(st.state, st.position, st.eta)))
                intervals[ticket] = wait
                await asyncio.sleep(wait * random.uniform(0.8, 1.0))  # as the page does

        tasks = [asyncio.create_task(poll(t)) for t in tickets]
        await asyncio.sleep(3.0)
        await room.sold_out()
        told_at = time.monotonic()
        await asyncio.wait_for(asyncio.gather(*tasks), 60)
        ratios = [(seen[t] - told_at) / intervals[t] for t in tickets]
        out["sold_out_fans"] = len(tickets)
        out["sold_out_max_ratio"] = max(ratios)
        out["sold_out_max_s"] = max(seen[t] - told_at for t in tickets)
        out["refresh_min_s"] = min(intervals.values())
        out["refresh_max_s"] = max(intervals.values())
        await broker.delete_room(room.name)


# -- the run -----------------------------------------------------------------------------------
def report(out: dict[str, Any], console: Console) -> Table:
    t = Table(title=f"fairq waiting room — {out['backend']}, {out['fans']:,} fans")
    t.add_column("measure")
    t.add_column("value", justify="right")
    t.add_column("target / note")

    def row(name: str, key: str, fmt: str, note: str = "") -> None:
        if key in out:
            t.add_row(name, format(out[key], fmt), note)

    row("join_many (batches of 1,000)", "join_many_fans_per_s", ",.0f", "fans/s")
    row("join, 64 concurrent callers", "join_per_s", ",.0f", "fans/s")
    row("status at the backend, p50", "status_backend_p50_ms", ".3f", "ms")
    row("status at the backend, p99", "status_backend_p99_ms", ".3f", "ms (target < 5)")
    row("status, one caller", "status_serial_per_s", ",.0f", "calls/s")
    row("status, 64 concurrent callers", "status_concurrent_per_s", ",.0f", "calls/s")
    row("storage per fan (file growth)", "bytes_per_fan", ".1f", "bytes")
    row("  of which the fans table", "fans_table_bytes_per_fan", ".1f", "bytes")
    for name in ("bare", "status", "join"):
        if f"http_{name}_rps" in out:
            label = {"bare": "GET /bare", "status": "GET /status", "join": "POST /join"}[name]
            t.add_row(
                f"HTTP {label} (uvicorn ×2)",
                f"{out[f'http_{name}_rps']:,.0f}",
                f"req/s, p50 {out[f'http_{name}_p50_ms']:.1f} ms, p99 "
                f"{out[f'http_{name}_p99_ms']:.1f} ms"
                + (
                    f", ratio to bare {out[f'http_{name}_rps'] / out['http_bare_rps']:.2f}"
                    if name != "bare"
                    else ""
                ),
            )
    row("admitted at 500/s", "admitted", ",.0f", f"over {out.get('admit_seconds', 0):.1f} s")
    row("admission error", "admit_error_pct", "+.3f", "% (target within ±1%)")
    row(
        "sold out seen after, worst",
        "sold_out_max_s",
        ".2f",
        f"s (refresh intervals {out.get('refresh_min_s', 0):g}-{out.get('refresh_max_s', 0):g} s)",
    )
    row("  over the fan's refresh interval", "sold_out_max_ratio", ".2f", "(target ≤ 1)")
    return t


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.waitingroom", description=__doc__.split("\n")[0])
    parser.add_argument("--url", help="backend URL (default: a fresh SQLite file)")
    parser.add_argument("--fans", type=int, default=2_000_000)
    parser.add_argument("--admit-seconds", type=float, default=60.0)
    parser.add_argument("--http-seconds", type=float, default=10.0)
    parser.add_argument("--no-http", action="store_true", help="skip the HTTP part")
    parser.add_argument("--quick", action="store_true", help="100,000 fans, 10 s phases")
    args = parser.parse_args(argv)
    if args.quick:
        args.fans, args.admit_seconds, args.http_seconds = 100_000, 10.0, 3.0
    console = Console()
    with tempfile.TemporaryDirectory() as d:
        url = args.url or f"sqlite:///{Path(d) / 'bench.db'}"
        out: dict[str, Any] = {
            "backend": url.split(":", 1)[0],
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python "
            f"{platform.python_version()}, SQLite {sqlite3.sqlite_version}",
        }
        console.print(f"[bold]waiting room bench[/bold] on {fairq.broker.mask_url(url)}")
        sample = asyncio.run(library(url, args.fans, out, console))
        if not args.no_http:
            console.print("  HTTP: uvicorn with 2 workers, wrk")
            http(url, sample, args.http_seconds, out, console)
        asyncio.run(admission(url, args.admit_seconds, out, console))
        asyncio.run(sold_out_reach(url, out))
    console.print(report(out, console))
    RESULTS.mkdir(exist_ok=True)
    # one file per engine, so a run on Redis does not replace SQLite's figures
    engine = "" if out.get("backend", "sqlite") == "sqlite" else f"-{out['backend']}"
    path = RESULTS / f"waitingroom{engine}{'-quick' if args.quick else ''}.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    console.print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
