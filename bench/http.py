"""HTTP throughput of ``fairq serve`` beside a bare Starlette endpoint, same machine.

Both servers run as their own uvicorn process with the same settings (one worker, no
access log, the event loop and HTTP parser uvicorn picks); the load generator is this
process — ``--concurrency`` keep-alive HTTP/1.1 connections (a minimal client over
asyncio streams, :class:`Connection`), each sending its next request as soon as the
last is answered. Phases, each ``--runs`` times, interleaved:

* ``bare``: ``POST /const`` carrying the batch-of-10 payload; the endpoint reads the body
  and answers a constant JSON — the ceiling of Starlette + uvicorn + this load generator;
* ``send b10`` / ``send b100``: ``POST /v1/queues/bench/messages`` with 10 or 100 messages
  of ~200 bytes (for ``--seconds`` each);
* ``receive+ack b10`` / ``b100``: ``POST .../receive`` for 10 or 100 messages, then
  ``POST .../ack`` with their receipts, until ``--drain`` pre-sent messages (five times
  as many for b100) are gone.

The target: batched send (batch 10) reaches at least 30% of the bare endpoint's
requests/s. Results (medians): a rich table and ``bench/results/http.json``.

    python -m bench.http                 # 3 runs, ~1.5 min
    python -m bench.http --quick         # 1 run, shorter phases
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from bench.servers import free_port, served

RESULTS = Path(__file__).resolve().parent / "results"
BODY = {"type": "OrderConfirmed", "order": "o-7731", "seats": ["B-12", "B-13"], "pad": "x" * 110}


def payload(n: int) -> bytes:
    return json.dumps({"messages": [{"body": BODY} for _ in range(n)]}).encode()


# -- the bare endpoint ---------------------------------------------------------------------
def bare_app() -> Any:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    constant = b'{"ok":true}'

    async def const(request: Request) -> Response:
        await request.body()
        return Response(constant, media_type="application/json")

    async def health(request: Request) -> Response:
        return Response(constant, media_type="application/json")

    return Starlette(routes=[Route("/const", const, methods=["POST"]), Route("/healthz", health)])


def serve_bare(port: int) -> None:
    import uvicorn

    uvicorn.run(bare_app(), host="127.0.0.1", port=port, log_level="warning", access_log=False)


# -- processes -----------------------------------------------------------------------------


# -- load ----------------------------------------------------------------------------------
class Connection:
    """A minimal keep-alive HTTP/1.1 client over asyncio streams: the load generator.

    httpx costs more CPU per request than a bare Starlette endpoint does, so with it the
    client would be what is measured; this one writes a request and reads a
    ``Content-Length`` answer, nothing more."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        assert self.reader is not None and self.writer is not None
        self.writer.write(
            f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = 0
        for line in head.split(b"\r\n"):
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        return status, await self.reader.readexactly(length) if length else b""


Step = Callable[[Connection], Awaitable[int]]  # one iteration: messages it moved


async def drive(
    url: str, step: Step, concurrency: int, seconds: float | None, stop_when_empty: bool = False
) -> dict[str, float]:
    """Run ``step`` from ``concurrency`` tasks for ``seconds`` (or until a step moves
    nothing); requests/s, messages/s and latency percentiles of the iterations."""
    latencies: list[float] = []
    messages = 0
    done = asyncio.Event()
    host, _, port = url.removeprefix("http://").partition(":")
    conns = [Connection(host, int(port)) for _ in range(concurrency)]
    for conn in conns:
        await conn.open()
    await step(conns[0])  # warm the server's code paths
    started = time.perf_counter()
    deadline = None if seconds is None else started + seconds

    async def worker(conn: Connection) -> None:
        nonlocal messages
        while not done.is_set():
            t0 = time.perf_counter()
            moved = await step(conn)
            t1 = time.perf_counter()
            latencies.append(t1 - t0)
            messages += moved
            if (deadline is not None and t1 >= deadline) or (stop_when_empty and moved == 0):
                done.set()

    await asyncio.gather(*(worker(c) for c in conns))
    elapsed = time.perf_counter() - started
    for conn in conns:
        await conn.close()
    latencies.sort()
    iterations = len(latencies)
    return {
        "iterations_per_s": iterations / elapsed,
        "messages_per_s": messages / elapsed,
        "p50_ms": latencies[iterations // 2] * 1000,
        "p99_ms": latencies[min(iterations - 1, int(iterations * 0.99))] * 1000,
        "seconds": elapsed,
    }


def _ok(status: int, body: bytes) -> bytes:
    if status != 200:
        raise SystemExit(f"HTTP {status}: {body[:200]!r}")
    return body


def bare_step(body: bytes) -> Step:
    async def step(conn: Connection) -> int:
        _ok(*await conn.post("/const", body))
        return 0

    return step


def send_step(body: bytes, n: int) -> Step:
    async def step(conn: Connection) -> int:
        _ok(*await conn.post("/v1/queues/bench/messages", body))
        return n

    return step


def receive_ack_step(n: int) -> Step:
    ask = json.dumps({"max_messages": n}).encode()

    async def step(conn: Connection) -> int:
        got = json.loads(_ok(*await conn.post("/v1/queues/bench/receive", ask)))
        receipts = [m["receipt"] for m in got["messages"]]
        if not receipts:
            return 0
        _ok(*await conn.post("/v1/queues/bench/ack", json.dumps({"receipts": receipts}).encode()))
        return len(receipts)

    return step


async def fill(url: str, n: int) -> None:
    body = payload(100)
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        for _ in range(n // 100):
            r = await http.post(
                "/v1/queues/bench/messages",
                content=body,
                headers={"content-type": "application/json"},
            )
            r.raise_for_status()


async def purge(url: str) -> None:
    async with httpx.AsyncClient(base_url=url) as http:
        (await http.put("/v1/queues/bench", json={"dead_letter": None})).raise_for_status()
        (await http.post("/v1/queues/bench/purge")).raise_for_status()


async def one_run(fairq_url: str, bare_url: str, args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    c, s = args.concurrency, args.seconds
    out["bare"] = await drive(bare_url, bare_step(payload(10)), c, s)
    await purge(fairq_url)
    out["send b10"] = await drive(fairq_url, send_step(payload(10), 10), c, s)
    await purge(fairq_url)
    out["send b100"] = await drive(fairq_url, send_step(payload(100), 100), c, s)
    for n in (10, 100):
        await purge(fairq_url)
        await fill(fairq_url, args.drain * (5 if n == 100 else 1))
        out[f"receive+ack b{n}"] = await drive(
            fairq_url, receive_ack_step(n), c, None, stop_when_empty=True
        )
    await purge(fairq_url)
    return out


def machine() -> dict[str, Any]:
    import uvicorn

    cpu = "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "?"
    loops = [m for m in ("uvloop", "httptools") if _importable(m)]
    return {
        "cpus": os.cpu_count(),
        "cpu": cpu,
        "python": platform.python_version(),
        "uvicorn": uvicorn.__version__,
        "httpx": httpx.__version__,
        "uvicorn_speedups": loops or ["none (asyncio, h11)"],
        "commit": commit,
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0, help="length of a send phase")
    parser.add_argument(
        "--drain", type=int, default=30_000, help="messages the b10 receive phase drains (b100: 5x)"
    )
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--quick", action="store_true", help="1 run, 2 s phases, 5,000 drained")
    parser.add_argument("--bare-server", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.bare_server:
        serve_bare(args.bare_server)
        return 0
    if args.quick:
        args.runs, args.seconds, args.drain = 1, 2.0, 5_000
    console = Console()
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        fport, bport = free_port(), free_port()
        env = {"FAIRQ_URL": f"sqlite:///{Path(tmp) / 'bench.db'}", "FAIRQ_API_KEYS": ""}
        fairq_cmd = [sys.executable, "-m", "fairq", "serve", "--port", str(fport)]
        fairq_cmd += ["--log-level", "warning", "--sample-interval", "2"]
        bare_cmd = [sys.executable, "-m", "bench.http", "--bare-server", str(bport)]
        root = Path(__file__).resolve().parents[1]
        with (
            served(fairq_cmd, fport, Path(tmp), env, health="/healthz") as fairq_url,
            served(bare_cmd, bport, root, env, health="/healthz") as bare_url,
        ):
            for i in range(args.runs):
                console.print(f"run {i + 1}/{args.runs} …")
                runs.append(asyncio.run(one_run(fairq_url, bare_url, args)))
    phases = list(runs[0])
    median = {p: {k: statistics.median(r[p][k] for r in runs) for k in runs[0][p]} for p in phases}
    bare_rps = median["bare"]["iterations_per_s"]
    table = Table(
        title=f"fairq serve over HTTP — medians of {args.runs} run(s), "
        f"{args.concurrency} connections"
    )
    for col in ("phase", "requests/s", "msgs/s", "p50 ms", "p99 ms", "requests/s ÷ bare"):
        table.add_column(col, justify="left" if col == "phase" else "right")
    rows = {}
    for p in phases:
        m = median[p]
        requests = m["iterations_per_s"] * (2 if p.startswith("receive") else 1)
        rows[p] = {**m, "requests_per_s": requests, "ratio_to_bare": requests / bare_rps}
        table.add_row(
            p,
            f"{requests:,.0f}",
            "-" if p == "bare" else f"{m['messages_per_s']:,.0f}",
            f"{m['p50_ms']:.2f}",
            f"{m['p99_ms']:.2f}",
            f"{requests / bare_rps:.0%}",
        )
    console.print(table)
    target = rows["send b10"]["ratio_to_bare"]
    console.print(
        f"batched send (b10): {target:.0%} of the bare endpoint's requests/s "
        f"({'meets' if target >= 0.3 else 'MISSES'} the 30% target)"
    )
    result = {
        "machine": machine(),
        "settings": {k: v for k, v in vars(args).items() if k != "bare_server"},
        "medians": rows,
        "runs": runs,
    }
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / ("http-quick.json" if args.quick else "http.json")
    out.write_text(json.dumps(result, indent=2))
    console.print(f"results: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
