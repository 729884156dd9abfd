"""Idempotency benchmarks, in one run:

1. claim + complete throughput of ``IdempotencyStore`` on SQLite (1 and 16 concurrent
   claimers, every key new), and claims of already-completed keys (the duplicate path),
   beside a raw ``sqlite3`` loop running the same two statements in autocommit on a file
   with the same settings (WAL, synchronous=NORMAL);
2. the HTTP middleware's cost: a trivial Starlette endpoint served by uvicorn on
   127.0.0.1, once bare and once behind ``IdempotencyMiddleware`` (SQLite store, a new
   ``Idempotency-Key`` per request, and the replay path: one key repeated), each server in
   its own process, loaded from a separate process by a keep-alive HTTP/1.1 client on raw
   sockets (faster than the server, so the server is what is measured). Target: the
   middleware keeps at least 50% of the bare endpoint's requests/s.

    python -m bench.idempotency            # 3 runs, medians
    python -m bench.idempotency --quick    # 1 run, short

Results go to a rich table and ``bench/results/idempotency.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

import fairq
from bench.servers import free_port, served

RESULTS = Path(__file__).resolve().parent / "results"
BODY = b'{"order":"o-7731","seats":["B-12","B-13"]}'


# -- 1. the store ------------------------------------------------------------------------------
async def store_claims(n: int, concurrency: int) -> dict[str, float]:
    """claim + complete of ``n`` new keys by ``concurrency`` tasks; then ``n`` claims of the
    completed keys (each answers None)."""
    with tempfile.TemporaryDirectory() as d:
        async with await fairq.connect(f"sqlite:///{Path(d) / 'bench.db'}") as broker:
            store = broker.idempotency("bench", ttl=3600)
            keys = [f"order-{i}" for i in range(n)]

            async def fresh(part: list[str]) -> None:
                for key in part:
                    claim = await store.claim(key, lease=30)
                    assert claim is not None
                    await claim.complete()

            async def repeat(part: list[str]) -> None:
                for key in part:
                    assert await store.claim(key, lease=30) is None

            parts = [keys[i::concurrency] for i in range(concurrency)]
            started = time.perf_counter()
            await asyncio.gather(*(fresh(p) for p in parts))
            new_rate = n / (time.perf_counter() - started)
            started = time.perf_counter()
            await asyncio.gather(*(repeat(p) for p in parts))
            dup_rate = n / (time.perf_counter() - started)
    return {"claim+complete": new_rate, "duplicate claim": dup_rate}


def raw_sqlite(n: int) -> float:
    """The same two statements per key in a plain loop, each its own transaction."""
    with tempfile.TemporaryDirectory() as d:
        conn = sqlite3.connect(Path(d) / "raw.db", isolation_level=None)
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute(
            "CREATE TABLE idem (namespace TEXT NOT NULL, key TEXT NOT NULL, token TEXT NOT NULL,"
            " state INTEGER NOT NULL, fingerprint TEXT, result BLOB, expires_at REAL NOT NULL,"
            " PRIMARY KEY (namespace, key))"
        )
        conn.execute("CREATE INDEX idem_expiry ON idem (expires_at)")
        claim = (
            "INSERT INTO idem VALUES ('bench', ?, ?, 0, NULL, NULL, ?) ON CONFLICT DO UPDATE "
            "SET token = excluded.token, state = 0, expires_at = excluded.expires_at "
            "WHERE idem.expires_at <= ?"
        )
        complete = (
            "UPDATE idem SET state = 1, expires_at = ? WHERE namespace = 'bench' AND key = ? "
            "AND token = ?"
        )
        started = time.perf_counter()
        for i in range(n):
            now = time.time()
            token = os.urandom(12).hex()
            key = f"order-{i}"
            assert conn.execute(claim, (key, token, now + 30, now)).rowcount == 1
            conn.execute(complete, (now + 3600, key, token))
        rate = n / (time.perf_counter() - started)
        conn.close()
    return rate


# -- 2. the middleware: servers ---------------------------------------------------------------
def make_app(kind: str, db: str) -> Any:
    """The benchmark's Starlette app: ``bare`` or behind the middleware (``idem``)."""
    import contextlib

    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    from fairq.http import IdempotencyMiddleware

    async def create(request: Request) -> Response:
        await request.body()
        return JSONResponse({"order": "o-7731", "status": "created"}, status_code=201)

    state: dict[str, fairq.Broker] = {}

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> Any:
        if kind == "idem":
            state["broker"] = await fairq.connect(f"sqlite:///{db}")
        yield
        if "broker" in state:
            await state["broker"].close()

    middleware = []
    if kind == "idem":
        middleware.append(
            Middleware(
                IdempotencyMiddleware,
                store=lambda: state["broker"].idempotency("http", ttl=3600),
            )
        )
    return Starlette(
        routes=[Route("/orders", create, methods=["POST"])],
        middleware=middleware,
        lifespan=lifespan,
    )


def serve(kind: str, port: int, db: str) -> None:
    import uvicorn

    uvicorn.run(
        make_app(kind, db), host="127.0.0.1", port=port, log_level="warning", access_log=False
    )


# -- 2. the middleware: load ------------------------------------------------------------------
async def _connection(
    port: int, until: float, mode: str, latencies: list[float], statuses: dict[int, int]
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    fixed_key = "replayed-key"
    try:
        while time.perf_counter() < until:
            key = fixed_key if mode == "replay" else str(uuid.uuid4())
            request = (
                f"POST /orders HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\n"
                f"content-type: application/json\r\ncontent-length: {len(BODY)}\r\n"
                f"idempotency-key: {key}\r\n\r\n"
            ).encode() + BODY
            t0 = time.perf_counter()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head[9:12])
            length = 0
            for line in head.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            await reader.readexactly(length)
            latencies.append(time.perf_counter() - t0)
            statuses[status] = statuses.get(status, 0) + 1
    finally:
        writer.close()


async def load(port: int, seconds: float, connections: int, mode: str) -> dict[str, Any]:
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    until = time.perf_counter() + seconds
    started = time.perf_counter()
    await asyncio.gather(
        *(_connection(port, until, mode, latencies, statuses) for _ in range(connections))
    )
    elapsed = time.perf_counter() - started
    latencies.sort()
    return {
        "requests": len(latencies),
        "rate": len(latencies) / elapsed,
        "p50_ms": 1000 * latencies[len(latencies) // 2],
        "p99_ms": 1000 * latencies[int(len(latencies) * 0.99)],
        "statuses": statuses,
    }


def measure_http(kind: str, mode: str, seconds: float, connections: int) -> dict[str, Any]:
    """Start a server of ``kind`` in its own process, load it from another, stop it."""
    port = free_port()
    with tempfile.TemporaryDirectory() as d:
        db = str(Path(d) / "http.db")
        root = Path(__file__).resolve().parent.parent
        serve = [sys.executable, "-m", "bench.idempotency", "serve", kind, str(port), db]
        with served(serve, port, root):
            out = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "bench.idempotency",
                    "load",
                    str(port),
                    str(seconds),
                    str(connections),
                    mode,
                ],
                cwd=root,
                capture_output=True,
                text=True,
                check=True,
            ).stdout
    result: dict[str, Any] = json.loads(out)
    return result


# -- the run -----------------------------------------------------------------------------------
def run(runs: int, n: int, seconds: float, connections: int) -> dict[str, Any]:
    samples: dict[str, list[dict[str, Any] | float]] = {}

    def add(name: str, value: dict[str, Any] | float) -> None:
        samples.setdefault(name, []).append(value)

    for r in range(runs):
        print(f"run {r + 1}/{runs}", flush=True)
        add("raw sqlite3 claim+complete", raw_sqlite(n))
        for c in (1, 16):
            got = asyncio.run(store_claims(n, c))
            add(f"fairq claim+complete, {c} task(s)", got["claim+complete"])
            add(f"fairq duplicate claim, {c} task(s)", got["duplicate claim"])
        # alternate bare and middleware so that drift of the machine hits both alike
        add("http bare", measure_http("bare", "new", seconds, connections))
        add("http middleware, new keys", measure_http("idem", "new", seconds, connections))
        add("http middleware, replays", measure_http("idem", "replay", seconds, connections))
    medians: dict[str, float] = {}
    for name, values in samples.items():
        if name.startswith("http"):
            medians[name] = statistics.median(v["rate"] for v in values)  # type: ignore[index]
            medians[name + " p50_ms"] = statistics.median(v["p50_ms"] for v in values)  # type: ignore[index]
            medians[name + " p99_ms"] = statistics.median(v["p99_ms"] for v in values)  # type: ignore[index]
        else:
            medians[name] = statistics.median(values)  # type: ignore[arg-type]
    return {
        "machine": {
            "python": platform.python_version(),
            "sqlite": sqlite3.sqlite_version,
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
        },
        "runs": runs,
        "n": n,
        "seconds": seconds,
        "connections": connections,
        "samples": samples,
        "medians": medians,
    }


def report(result: dict[str, Any], console: Console) -> list[tuple[str, bool]]:
    m = result["medians"]
    raw = m["raw sqlite3 claim+complete"]
    table = Table(title=f"idempotency store on SQLite — medians of {result['runs']} run(s)")
    for col in ("what", "N", "ops/s", "vs raw sqlite3 loop"):
        table.add_column(col, justify="left" if col == "what" else "right")
    table.add_row("raw sqlite3 loop: claim + complete", f"{result['n']:,}", f"{raw:,.0f}", "1.00")
    for c in (1, 16):
        for what in ("claim+complete", "duplicate claim"):
            rate = m[f"fairq {what}, {c} task(s)"]
            table.add_row(
                f"fairq {what}, {c} task(s)",
                f"{result['n']:,}",
                f"{rate:,.0f}",
                f"{rate / raw:.2f}",
            )
    console.print(table)
    bare = m["http bare"]
    table = Table(
        title=f"IdempotencyMiddleware on uvicorn, {result['connections']} connections, "
        f"{result['seconds']:g} s each — medians of {result['runs']} run(s)"
    )
    for col in ("server", "requests/s", "p50 ms", "p99 ms", "vs bare"):
        table.add_column(col, justify="left" if col == "server" else "right")
    for name in ("http bare", "http middleware, new keys", "http middleware, replays"):
        table.add_row(
            name[5:],
            f"{m[name]:,.0f}",
            f"{m[name + ' p50_ms']:.2f}",
            f"{m[name + ' p99_ms']:.2f}",
            f"{m[name] / bare:.2f}",
        )
    console.print(table)
    ratio = m["http middleware, new keys"] / bare
    checks = [
        (
            f"the middleware (a new key per request) keeps {ratio:.0%} of the bare endpoint's "
            "requests/s (target >= 50%)",
            ratio >= 0.5,
        )
    ]
    for text, ok in checks:
        console.print(("[green]holds[/green] " if ok else "[red]fails[/red] ") + text)
    return checks


def main(argv: Sequence[str] | None = None) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    if args_in[:1] == ["serve"]:
        serve(args_in[1], int(args_in[2]), args_in[3])
        return 0
    if args_in[:1] == ["load"]:
        port, seconds, connections, mode = args_in[1:5]
        print(json.dumps(asyncio.run(load(int(port), float(seconds), int(connections), mode))))
        return 0
    parser = argparse.ArgumentParser(
        prog="python -m bench.idempotency", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--n", type=int, default=5_000, help="keys per store measurement")
    parser.add_argument("--seconds", type=float, default=5.0, help="load per HTTP measurement")
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--quick", action="store_true", help="1 run, small N, 1 s loads")
    args = parser.parse_args(args_in)
    runs, n, seconds = args.runs, args.n, args.seconds
    if args.quick:
        runs, n, seconds = 1, 1_000, 1.0
    result = run(runs, n, seconds, args.connections)
    console = Console()
    checks = report(result, console)
    result["checks"] = [{"text": t, "holds": ok} for t, ok in checks]
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / ("idempotency-quick.json" if args.quick else "idempotency.json")
    out.write_text(json.dumps(result, indent=2))
    console.print(f"results: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
