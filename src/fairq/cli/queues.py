"""Queue commands: send, receive, stats, redrive."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from ..broker import Broker
from ..errors import QueueNotFound
from ..message import Received
from ..queue import QueueStats

if TYPE_CHECKING:
    from ..http.client import Client


from .app import (
    ApiKeyOption,
    AttrOption,
    Batches,
    BodyArgument,
    DedupOption,
    ServerOption,
    UrlOption,
    _age,
    _open,
    _parse_attrs,
    _progress,
    _run,
    app,
    console,
    err_console,
    fail,
    watch_live,
)
from .tables import Col, fitted


# -- send / receive ------------------------------------------------------------------------
@app.command()
def send(
    queue: Annotated[str, typer.Argument(help="Queue name.")],
    body: BodyArgument = None,
    attr: AttrOption = [],  # noqa: B006
    delay: Annotated[float, typer.Option(min=0.0, help="Seconds before it becomes visible.")] = 0.0,
    priority: Annotated[int, typer.Option(min=0, help="Priority (0..max_priority).")] = 0,
    group: Annotated[str | None, typer.Option(help="FIFO group.")] = None,
    dedup_id: DedupOption = None,
    count: Annotated[
        int, typer.Option(min=1, help="Send this many copies (in batches of 100).")
    ] = 1,
    declare: Annotated[
        bool, typer.Option(help="Declare the queue first if it does not exist.")
    ] = True,
    max_priority: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="max_priority of a queue this command declares (default: the --priority "
            "given, else 0).",
        ),
    ] = None,
    url: UrlOption = None,
    server: ServerOption = None,
    api_key: ApiKeyOption = None,
) -> None:
    """Send a message (or --count copies) and print the id(s)."""
    if dedup_id is not None and count > 1:
        raise typer.BadParameter(
            "a deduplication id names one message: it cannot go with --count above 1",
            param_hint="--dedup-id",
        )
    data = sys.stdin.buffer.read() if body is None or body == "-" else body.encode()
    attrs = _parse_attrs(attr)

    async def main() -> None:
        from ..message import Outgoing

        async with await _open(url, server, api_key) as broker:
            q = broker.queue(queue)
            if declare and queue not in await broker.list_queues(prefix=queue):
                top = priority if max_priority is None else max_priority
                q = await broker.declare_queue(queue, max_priority=top)
            if count == 1:
                console.print(await q.send(data, attrs, delay, priority, group, dedup_id))
                return
            sent = 0
            batches = Batches()  # a server with a smaller --max-batch says so
            try:
                with _progress() as progress:
                    task = progress.add_task(f"sending to {queue}", total=count)
                    while sent < count:
                        n, _ = await batches.run(
                            lambda n: q.send_batch(
                                [Outgoing(data, attrs, delay, priority, group) for _ in range(n)]
                            ),
                            count - sent,
                        )
                        sent += n
                        progress.advance(task, n)
            except asyncio.CancelledError:  # Ctrl-C: say what is known to be stored
                err_console.print(
                    f"interrupted: {sent:,} of {count:,} sent; the batch under way (up to "
                    f"{min(batches.size, count - sent)}) may be stored too — `fairq stats {queue}` "
                    "counts them",
                    soft_wrap=True,
                )
                raise

    _run(main)


@app.command()
def receive(
    queue: Annotated[str, typer.Argument(help="Queue name.")],
    max_messages: Annotated[
        int, typer.Option("--max", "-n", min=1, max=10_000, help="At most this many.")
    ] = 10,
    wait: Annotated[float, typer.Option(min=0.0, help="Long-poll up to this many seconds.")] = 0.0,
    ack: Annotated[
        bool, typer.Option(help="Ack what was received (--no-ack leaves it leased).")
    ] = True,
    peek: Annotated[bool, typer.Option(help="Show messages without leasing them.")] = False,
    url: UrlOption = None,
    server: ServerOption = None,
    api_key: ApiKeyOption = None,
) -> None:
    """Receive messages, print them as a table, and ack them."""

    async def main() -> None:
        async with await _open(url, server, api_key) as broker:
            q = broker.queue(queue)
            msgs = await q.peek(max_messages) if peek else await _receive(q, max_messages, wait)
            if not msgs:
                console.print(f"[dim]no messages in {queue}[/dim]")
                return
            table = Table(title=f"{queue}: {len(msgs)} message(s)" + (" (peek)" if peek else ""))
            # dead letters: why each is there gets a column of its own, shown first
            dead = any(DEAD_REASON in m.attributes for m in msgs)
            for col in ("id", "attempt", "age", *(["why"] if dead else []), "attributes", "body"):
                table.add_column(col, overflow="fold" if col == "why" else "ellipsis")
            now = broker.clock.now()
            for m in msgs:
                text = m.body.decode("utf-8", "replace")
                attrs = dict(m.attributes)
                why = [_why(attrs)] if dead else []
                table.add_row(
                    m.id,
                    str(m.attempt),
                    _age(now - m.enqueued_at),
                    *why,
                    " ".join(f"{k}={v}" for k, v in attrs.items()),
                    text if len(text) <= 80 else text[:77] + "...",
                )
            console.print(table)
            if ack and not peek:
                await q.ack_batch([m.receipt for m in msgs])

    _run(main)


DEAD_REASON, DEAD_DETAIL = "fairq.reason", "fairq.detail"


def _why(attrs: dict[str, str]) -> str:
    """A dead letter's reason and detail (taken out of ``attrs``), for its own column."""
    reason = attrs.pop(DEAD_REASON, "")
    detail = attrs.pop(DEAD_DETAIL, "")
    detail = detail if len(detail) <= 200 else detail[:197] + "..."
    return f"{reason}: {detail}" if detail else reason


async def _receive(q: Any, n: int, wait: float) -> list[Received]:
    """Up to ``n`` messages, in requests a server takes (its ``max_batch``, 100 unless it
    says less); only the first one waits."""
    got: list[Received] = []
    batches = Batches()
    while len(got) < n:
        pause = 0.0 if got else wait  # only the first request waits

        def receive(m: int, w: float = pause) -> Awaitable[list[Received]]:
            return q.receive(m, wait=w)  # type: ignore[no-any-return]

        want, part = await batches.run(receive, n - len(got))
        got += part
        if len(part) < want:
            break
    return got


# -- stats ---------------------------------------------------------------------------------
async def stats_table(
    broker: Broker | Client, names: list[str] | None = None, width: int | None = None
) -> Table:
    """A table of every queue's counts, ages and counters, fitted to ``width`` (the
    terminal's): the counters since creation are the first to go when it is narrow.
    Queues breaching their freshness SLO come first."""
    all_stats: dict[str, QueueStats] = {}
    dead_letter: dict[str, str | None] = {}  # "<name>.dlq" unless declared so
    if not isinstance(broker, Broker):  # a server: a request per 1,000 queues, or per queue
        infos = (
            await broker.queue_infos()
            if not names
            else {name: await broker.queue(name)._info() for name in names}
        )
        for name, (stats, config) in infos.items():
            all_stats[name], dead_letter[name] = stats, config.dead_letter
    else:
        for name in names or await broker.list_queues():
            q = broker.queue(name)
            all_stats[name] = await q.stats()
            dead_letter[name] = (await q.config()).dead_letter
    dlqs: dict[str, QueueStats] = {}  # the depths of dead-letter queues not shown as rows
    for dlq_name in {d for d in dead_letter.values() if d is not None} - set(all_stats):
        with contextlib.suppress(QueueNotFound):
            dlqs[dlq_name] = await broker.queue(dlq_name).stats()
    slos = any(s.freshness_slo is not None for s in all_stats.values())
    cols = [
        Col("queue"),
        Col("visible", True),
        Col("delayed", True),
        Col("in flight", True),
        Col("oldest", True),
        Col("dlq", True),
        Col("sent", True, 1),
        Col("acked", True, 2),
        Col("nacked", True, 5),
        Col("redelivered", True, 4),
        Col("dead-lettered", True, 3),
        Col("expired", True, 6),
    ]
    if slos:  # a column only when some queue has a freshness SLO
        cols.append(Col("freshness"))
    rows = []
    # queues breaching their freshness SLO first (the oldest first), so a long table cut at
    # the terminal's height still shows them; then the rest in name order
    ordered = sorted(
        all_stats,
        key=lambda n: (0, -all_stats[n].oldest_age) if all_stats[n].breaching else (1, 0.0),
    )
    for name in ordered:
        s = all_stats[name]
        target = dead_letter[name]
        dlq = None if target is None else all_stats.get(target) or dlqs.get(target)
        row = [
            name,
            str(s.visible),
            str(s.delayed),
            str(s.in_flight),
            _age(s.oldest_age),
            "-" if dlq is None else str(dlq.depth),
            str(s.sent),
            str(s.acked),
            str(s.nacked),
            str(s.redelivered),
            str(s.dead_lettered),
            str(s.expired),
        ]
        if slos:
            if s.freshness_slo is None:
                row.append("-")
            elif s.breaching:
                row.append(f"[red]BREACH > {s.freshness_slo:g}s[/red]")
            else:
                row.append("[green]ok[/green]")
        rows.append(row)
    table = fitted(f"fairq stats — {broker.url}", cols, rows, width or console.width)
    if not rows:
        table.caption = "no queues yet: `fairq send QUEUE BODY` declares one"
    return table


@app.command()
def stats(
    queues: Annotated[
        list[str] | None, typer.Argument(help="Queues to show (default: all).")
    ] = None,
    watch: Annotated[bool, typer.Option(help="Refresh every second until Ctrl-C.")] = False,
    url: UrlOption = None,
    server: ServerOption = None,
    api_key: ApiKeyOption = None,
) -> None:
    """Show queue statistics as a table."""

    async def main() -> None:
        async with await _open(url, server, api_key) as broker:
            if not watch:
                console.print(await stats_table(broker, queues))
                return
            await watch_live(lambda: stats_table(broker, queues))

    _run(main)


# -- redrive -------------------------------------------------------------------------------
@app.command()
def redrive(
    queue: Annotated[str, typer.Argument(help="Dead-letter queue to empty.")],
    to: Annotated[
        str | None, typer.Option(help="Target queue (default: each message's source).")
    ] = None,
    limit: Annotated[int | None, typer.Option(help="Move at most this many.")] = None,
    url: UrlOption = None,
    server: ServerOption = None,
    api_key: ApiKeyOption = None,
) -> None:
    """Move dead-lettered messages back to their source queue (or --to another)."""

    async def main() -> None:
        async with await _open(url, server, api_key) as broker:
            total = (await broker.queue(queue).stats()).visible
            if limit is not None:
                total = min(total, limit)
            moved = 0
            # what is there now, at most: a message dead-lettered again while this runs
            # (a worker rejecting it at once) is not moved a second time — looping until a
            # step moved nothing re-ran a poison message five times in one command
            with _progress() as progress:
                task = progress.add_task(f"redriving {queue}", total=total)
                while moved < total:
                    step = min(1000, total - moved)
                    n = await broker.redrive(queue, to=to, limit=step)
                    if n == 0:
                        break
                    moved += n
                    progress.update(task, completed=min(moved, total))
            left = (await broker.queue(queue).stats()).visible
            console.print(f"moved {moved} message(s); {left} left in {queue}")
            if left and not moved and to is None and limit != 0:
                fail(
                    f"nothing in {queue} could go back: its messages name no source queue "
                    "that exists (fairq.source) — is it a dead-letter queue? --to QUEUE "
                    "moves them to a queue of your choice"
                )

    _run(main)
