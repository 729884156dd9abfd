"""``fairq demo``: the seed's BoxOffice scenario on the embedded default.

Sends N ``GenerateTicketPdf`` jobs to the queue ``demo.ticket-pdf``, starts worker
processes (``fairq worker fairq.demo.worker:make_worker``) that share the SQLite file,
shows progress while they render ``tickets/<order>.pdf``, and ends with a table. With
``--chaos`` one worker is killed with SIGKILL half-way and a new one started: its
leased jobs come back when their lease runs out, and every ticket still gets made.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ..broker import connect
from ..errors import FairqError
from ..message import Outgoing
from .worker import QUEUE

STALL_LIMIT = 120.0  # seconds without progress before the demo gives up


def _spawn(env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fairq",
            "worker",
            "fairq.demo.worker:make_worker",
            "--log-level",
            "WARNING",
        ],
        env=env,
    )


async def run_demo(
    url: str | None,
    *,
    jobs: int,
    workers: int,
    concurrency: int,
    out: Path,
    chaos: bool,
    console: Console,
) -> None:
    from .ticket_pdf import ticket_job

    if jobs < 1 or workers < 1 or concurrency < 1:
        raise FairqError("--jobs, --workers and --concurrency must be at least 1")
    async with await connect(url) as broker:
        url = url or os.environ.get("FAIRQ_URL") or "sqlite:///fairq.db"
        q = await broker.declare_queue(
            QUEUE, visibility_timeout=5.0 if chaos else 30.0, max_attempts=5
        )
        await q.purge()
        before = await q.stats()
        console.print(
            f"[bold]BoxOffice ticket PDFs[/bold] — {jobs} jobs, {workers} worker process(es) × "
            f"{concurrency}, queue [cyan]{QUEUE}[/cyan] on [cyan]{broker.url}[/cyan]"
        )
        env = dict(
            os.environ,
            FAIRQ_URL=url,
            FAIRQ_DEMO_OUT=str(out),
            FAIRQ_DEMO_CONCURRENCY=str(concurrency),
        )
        started = time.monotonic()
        procs = [_spawn(env) for _ in range(workers)]
        killed = 0
        try:
            with Progress(
                TextColumn("[bold]{task.description:<18}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[note]}"),
                TimeElapsedColumn(),
                console=console,
            ) as progress:
                sending = progress.add_task("sending jobs", total=jobs, note="")
                making = progress.add_task("rendering PDFs", total=jobs, note="")
                sent = 0
                while sent < jobs:
                    n = min(50, jobs - sent)
                    await q.send_batch([Outgoing(ticket_job(i)) for i in range(sent, sent + n)])
                    sent += n
                    progress.update(sending, completed=sent)
                    await asyncio.sleep(0)
                last_done, last_change = -1, time.monotonic()
                while True:
                    s = await q.stats()
                    done = s.acked - before.acked
                    dead = s.dead_lettered - before.dead_lettered
                    alive = sum(p.poll() is None for p in procs)
                    progress.update(
                        making,
                        completed=done,
                        note=f"in flight {s.in_flight:>3}  workers {alive}"
                        + (f"  [red]killed {killed}[/red]" if killed else ""),
                    )
                    if done + dead >= jobs and s.visible + s.in_flight + s.delayed == 0:
                        break
                    if chaos and not killed and done >= jobs // 2:
                        procs[0].send_signal(signal.SIGKILL)
                        procs[0].wait()
                        killed = 1
                        procs.append(_spawn(env))
                    if done != last_done:
                        last_done, last_change = done, time.monotonic()
                    elif time.monotonic() - last_change > STALL_LIMIT:
                        raise FairqError(
                            f"no progress for {STALL_LIMIT:.0f} s; are the workers running?"
                        )
                    if alive == 0:
                        raise FairqError("every worker process exited; see their output above")
                    await asyncio.sleep(0.2)
            elapsed = time.monotonic() - started
        finally:
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            for p in procs:
                try:
                    p.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    p.kill()
        s = await q.stats()
        made = sum((out / f"{ticket_job(i)['order']}.pdf").exists() for i in range(jobs))
        table = Table(title="BoxOffice demo — done")
        table.add_column("")
        table.add_column("", justify="right")
        rows = [
            ("jobs sent", jobs),
            ("tickets acked", s.acked - before.acked),
            ("PDFs on disk", f"{made} in {out}/"),
            ("redelivered (at-least-once)", s.redelivered - before.redelivered),
            ("dead-lettered", s.dead_lettered - before.dead_lettered),
            ("workers killed with SIGKILL", killed),
            ("elapsed", f"{elapsed:.1f} s"),
            ("throughput", f"{(s.acked - before.acked) / elapsed:.1f} tickets/s"),
        ]
        for k, v in rows:
            table.add_row(k, str(v))
        console.print(table)
        if made < jobs:
            raise FairqError(f"only {made} of {jobs} PDFs were written")
