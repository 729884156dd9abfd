"""The ``fairq`` command line: serve, send, receive, stats, redrive, worker, demo, bench.

Every command takes ``--url`` (default ``$FAIRQ_URL``, else ``sqlite:///fairq.db``);
send, receive, stats, redrive and publish also take ``--server http://host:port``
(``$FAIRQ_SERVER``, with ``--api-key``/``$FAIRQ_API_KEY``) to go through a ``fairq serve``.
Tables and progress bars come from rich; long work shows a progress bar.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from . import __version__
from .broker import Broker, connect
from .errors import FairqError
from .queue import QueueStats
from .worker import Worker

if TYPE_CHECKING:
    from .http.client import Client

app = typer.Typer(
    name="fairq",
    help="fairq: durable queues, pub/sub, fair attention queues — embedded on SQLite.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
err_console = Console(stderr=True)
T = TypeVar("T")

UrlOption = Annotated[
    str | None,
    typer.Option(
        "--url", "-u", envvar="FAIRQ_URL", help="Backend URL (default sqlite:///fairq.db)."
    ),
]
ServerOption = Annotated[
    str | None,
    typer.Option(
        "--server",
        "-s",
        envvar="FAIRQ_SERVER",
        help="Go through a fairq server (http://host:port) instead of --url.",
    ),
]
ApiKeyOption = Annotated[
    str | None,
    typer.Option("--api-key", envvar="FAIRQ_API_KEY", help="API key for --server."),
]


async def _open(url: str | None, server: str | None, api_key: str | None) -> Broker | Client:
    """The broker at ``url``, or a client of the server at ``server``."""
    if server:
        try:
            from .http.client import Client
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise typer.BadParameter(
                f"--server needs httpx: pip install 'fairq[server]' ({exc})"
            ) from exc
        return Client(server, api_key)
    return await connect(url)


def _run(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a coroutine; turn fairq errors into a one-line message and exit code 1."""
    try:
        return asyncio.run(main())
    except FairqError as exc:
        err_console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


def _parse_attrs(pairs: list[str]) -> dict[str, str]:
    attrs = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise typer.BadParameter(f"attributes are key=value, got {pair!r}", param_hint="--attr")
        attrs[key] = value
    return attrs


def _age(seconds: float) -> str:
    if seconds <= 0:
        return "-"
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"


@app.callback(invoke_without_command=True)
def _main(
    version: Annotated[bool, typer.Option("--version", help="Print the version and exit.")] = False,
) -> None:
    if version:
        console.print(f"fairq {__version__}")
        raise typer.Exit()


# -- send / receive ------------------------------------------------------------------------
@app.command()
def send(
    queue: Annotated[str, typer.Argument(help="Queue name.")],
    body: Annotated[
        str | None, typer.Argument(help="Message body; '-' or omitted reads stdin.")
    ] = None,
    attr: Annotated[
        list[str], typer.Option("--attr", "-a", help="Attribute key=value (repeatable).")
    ] = [],  # noqa: B006
    delay: Annotated[float, typer.Option(help="Seconds before it becomes visible.")] = 0.0,
    priority: Annotated[int, typer.Option(help="Priority (0..max_priority).")] = 0,
    group: Annotated[str | None, typer.Option(help="FIFO group.")] = None,
    dedup_id: Annotated[str | None, typer.Option("--dedup-id", help="Deduplication id.")] = None,
    count: Annotated[int, typer.Option(help="Send this many copies (in batches of 100).")] = 1,
    declare: Annotated[
        bool, typer.Option(help="Declare the queue first if it does not exist.")
    ] = True,
    url: UrlOption = None,
    server: ServerOption = None,
    api_key: ApiKeyOption = None,
) -> None:
    """Send a message (or --count copies) and print the id(s)."""
    data = sys.stdin.buffer.read() if body is None or body == "-" else body.encode()
    attrs = _parse_attrs(attr)

    async def main() -> None:
        from .message import Outgoing

        async with await _open(url, server, api_key) as broker:
            q = broker.queue(queue)
            if declare and queue not in await broker.list_queues(prefix=queue):
                q = await broker.declare_queue(queue)
            if count == 1:
                console.print(await q.send(data, attrs, delay, priority, group, dedup_id))
                return
            with _progress() as progress:
                task = progress.add_task(f"sending to {queue}", total=count)
                left = count
                while left:
                    n = min(100, left)
                    await q.send_batch(
                        [Outgoing(data, attrs, delay, priority, group) for _ in range(n)]
                    )
                    left -= n
                    progress.advance(task, n)

    _run(main)


@app.command()
def receive(
    queue: Annotated[str, typer.Argument(help="Queue name.")],
    max_messages: Annotated[int, typer.Option("--max", "-n", help="At most this many.")] = 10,
    wait: Annotated[float, typer.Option(help="Long-poll up to this many seconds.")] = 0.0,
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
            msgs = await q.peek(max_messages) if peek else await q.receive(max_messages, wait=wait)
            if not msgs:
                console.print(f"[dim]no messages in {queue}[/dim]")
                return
            table = Table(title=f"{queue}: {len(msgs)} message(s)" + (" (peek)" if peek else ""))
            for col in ("id", "attempt", "age", "attributes", "body"):
                table.add_column(col)
            now = broker.clock.now()
            for m in msgs:
                text = m.body.decode("utf-8", "replace")
                table.add_row(
                    m.id,
                    str(m.attempt),
                    _age(now - m.enqueued_at),
                    " ".join(f"{k}={v}" for k, v in m.attributes.items()),
                    text if len(text) <= 80 else text[:77] + "...",
                )
            console.print(table)
            if ack and not peek:
                await q.ack_batch([m.receipt for m in msgs])

    _run(main)


# -- stats ---------------------------------------------------------------------------------
async def stats_table(broker: Broker | Client, names: list[str] | None = None) -> Table:
    """A table of every queue's counts, ages and counters."""
    names = names or await broker.list_queues()
    all_stats: dict[str, QueueStats] = {}
    for name in names:
        all_stats[name] = await broker.queue(name).stats()
    table = Table(title=f"fairq queues — {broker.url}")
    for col in (
        "queue",
        "visible",
        "delayed",
        "in flight",
        "oldest",
        "dlq",
        "sent",
        "acked",
        "nacked",
        "redelivered",
        "dead-lettered",
        "expired",
        "freshness",
    ):
        table.add_column(col, justify="left" if col == "queue" else "right")
    for name, s in all_stats.items():
        dlq = all_stats.get(f"{name}.dlq")
        fresh = "-"
        if s.freshness_slo is not None:
            fresh = (
                f"[red]BREACH > {s.freshness_slo:g}s[/red]" if s.breaching else "[green]ok[/green]"
            )
        table.add_row(
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
            fresh,
        )
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
            with Live(
                await stats_table(broker, queues), console=console, refresh_per_second=4
            ) as live:
                while True:
                    await asyncio.sleep(1)
                    live.update(await stats_table(broker, queues))

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
            with _progress() as progress:
                task = progress.add_task(f"redriving {queue}", total=total)
                while limit is None or moved < limit:
                    step = 1000 if limit is None else min(1000, limit - moved)
                    n = await broker.redrive(queue, to=to, limit=step)
                    if n == 0:
                        break
                    moved += n
                    progress.update(task, completed=min(moved, total))
            left = (await broker.queue(queue).stats()).visible
            console.print(f"moved {moved} message(s); {left} left in {queue}")

    _run(main)


# -- publish / subscribe -------------------------------------------------------------------
@app.command()
def publish(
    topic: Annotated[str, typer.Argument(help="Topic name.")],
    body: Annotated[
        str | None, typer.Argument(help="Message body; '-' or omitted reads stdin.")
    ] = None,
    attr: Annotated[
        list[str], typer.Option("--attr", "-a", help="Attribute key=value (repeatable).")
    ] = [],  # noqa: B006
    key: Annotated[
        str, typer.Option("--key", "-k", help="Routing key, e.g. order.confirmed.br.")
    ] = "",
    dedup_id: Annotated[str | None, typer.Option("--dedup-id", help="Deduplication id.")] = None,
    url: UrlOption = None,
    server: ServerOption = None,
    api_key: ApiKeyOption = None,
) -> None:
    """Publish a message to a topic; print its id and the subscriptions that got a copy."""
    data = sys.stdin.buffer.read() if body is None or body == "-" else body.encode()
    attrs = _parse_attrs(attr)

    async def main() -> None:
        async with await _open(url, server, api_key) as broker:
            r = await broker.topic(topic).publish(data, attrs, routing_key=key, dedup_id=dedup_id)
            copies = (
                ", ".join(r.subscriptions)
                if r.subscriptions
                else "[dim]no subscription matched[/dim]"
            )
            console.print(f"{r.message_id} → {copies}")

    _run(main)


@app.command()
def subscribe(
    topic: Annotated[str, typer.Argument(help="Topic name (declared if missing).")],
    name: Annotated[str, typer.Argument(help="Subscription name; its queue is TOPIC.NAME.")],
    filter: Annotated[
        str | None,
        typer.Option(
            "--filter", "-f", help='Filter policy as JSON, e.g. \'{"channel": ["sms"]}\'.'
        ),
    ] = None,
    routing: Annotated[
        str | None, typer.Option("--routing", "-r", help="Routing pattern, e.g. order.*.br.")
    ] = None,
    push: Annotated[str | None, typer.Option(help="Deliver by HTTP POST to this URL.")] = None,
    url: UrlOption = None,
) -> None:
    """Create (or update) a subscription of a topic."""
    import json

    try:
        policy = None if filter is None else json.loads(filter)
    except json.JSONDecodeError as exc:
        raise typer.BadParameter(f"not JSON: {exc}", param_hint="--filter") from exc

    async def main() -> None:
        async with await connect(url) as broker:
            if topic not in await broker.list_topics(prefix=topic):
                await broker.declare_topic(topic)
            q = await broker.topic(topic).subscribe(name, filter=policy, routing=routing, push=push)
            console.print(f"subscription {name} of {topic} → queue [cyan]{q.name}[/cyan]")

    _run(main)


async def topics_table(broker: Broker) -> Table:
    """A table of every topic and its subscriptions, with filters, routing and depths."""
    table = Table(title=f"fairq topics — {broker.url}")
    for col in (
        "topic",
        "published",
        "unmatched",
        "subscription",
        "routing",
        "filter",
        "push",
        "visible",
        "in flight",
        "oldest",
        "dlq",
    ):
        table.add_column(
            col,
            justify="right"
            if col in ("published", "unmatched", "visible", "in flight", "dlq")
            else "left",
        )
    queues = set(await broker.list_queues())
    for name in await broker.list_topics():
        t = broker.topic(name)
        s = await t.stats()
        subs = await t.subscriptions()
        if not subs:
            table.add_row(
                name,
                str(s.published),
                str(s.unmatched),
                "[dim]none[/dim]",
                "",
                "",
                "",
                "",
                "",
                "",
                "",
            )
        for i, sub in enumerate(subs):
            qs = await broker.queue(sub.queue).stats()
            dlq = f"{sub.queue}.dlq"
            dlq_depth = str((await broker.queue(dlq).stats()).depth) if dlq in queues else "-"
            table.add_row(
                name if i == 0 else "",
                str(s.published) if i == 0 else "",
                str(s.unmatched) if i == 0 else "",
                sub.name,
                sub.routing or "#",
                "" if sub.filter is None else json_compact(sub.filter),
                sub.push or "",
                str(qs.visible),
                str(qs.in_flight),
                _age(qs.oldest_age),
                dlq_depth,
            )
    return table


def json_compact(value: Any) -> str:
    import json

    return json.dumps(value, separators=(",", ":"))


@app.command()
def topics(url: UrlOption = None) -> None:
    """Show topics, their subscriptions, filters, routing and queue depths."""

    async def main() -> None:
        async with await connect(url) as broker:
            console.print(await topics_table(broker))

    _run(main)


# -- attention -----------------------------------------------------------------------------
async def attention_tables(broker: Broker, domain: str, top: int) -> Group:
    """The counters of an attention domain and its busiest keys."""
    a = broker.attention(domain)
    s = await a.stats()
    counters = Table(title=f"attention domain {domain} — {s.queue}")
    names = (
        "keys",
        "signals",
        "slices",
        "processed",
        "republished",
        "blocked",
        "rate limited",
        "empty",
        "parked",
        "reconciled",
        "discarded",
        "clear time",
    )
    for name in names:
        counters.add_column(name, justify="right")
    discarded = ", ".join(f"{k} {v}" for k, v in sorted(s.discarded.items())) or "0"
    counters.add_row(
        str(s.keys),
        str(s.signals_pending),
        str(s.slices),
        str(s.processed),
        str(s.republished),
        str(s.blocked),
        str(s.rate_limited),
        str(s.empty),
        str(s.parked),
        str(s.reconciled),
        discarded,
        _age(s.clear_time_avg),
    )
    keys = Table(title=f"busiest {top} keys")
    for col in (
        "key",
        "tenant",
        "plan",
        "state",
        "backlog",
        "in flight",
        "oldest",
        "slices",
        "signals",
        "processed",
    ):
        keys.add_column(
            col, justify="right" if col not in ("key", "tenant", "plan", "state") else "left"
        )
    for k in await a.key_stats(top=top):
        state = k.state if k.state == "active" else f"[yellow]{k.state}[/yellow]"
        keys.add_row(
            k.key,
            k.tenant,
            k.plan,
            state,
            str(k.backlog),
            str(k.in_flight),
            _age(k.oldest_age),
            str(k.active),
            str(k.pending),
            str(k.processed),
        )
    return Group(counters, keys)


@app.command()
def attention(
    domain: Annotated[str, typer.Argument(help="Attention domain.")],
    top: Annotated[int, typer.Option(help="How many keys to show, busiest first.")] = 20,
    watch: Annotated[bool, typer.Option(help="Refresh every second until Ctrl-C.")] = False,
    url: UrlOption = None,
) -> None:
    """Show an attention domain: counters and the busiest keys (live with --watch)."""

    async def main() -> None:
        async with await connect(url) as broker:
            if not watch:
                console.print(await attention_tables(broker, domain, top))
                return
            with Live(await attention_tables(broker, domain, top), console=console) as live:
                while True:
                    await asyncio.sleep(1)
                    live.update(await attention_tables(broker, domain, top))

    _run(main)


# -- serve ---------------------------------------------------------------------------------
@app.command()
def serve(
    url: UrlOption = None,
    host: Annotated[
        str, typer.Option(envvar="FAIRQ_HOST", help="Address to listen on (loopback by default).")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(envvar="FAIRQ_PORT", help="Port to listen on.")] = 8040,
    workers: Annotated[
        bool,
        typer.Option(
            "--workers/--no-workers",
            help="Also deliver push subscriptions and run the attention reconcilers here.",
        ),
    ] = False,
    max_batch: Annotated[int, typer.Option(help="Most messages per request.")] = 100,
    max_body: Annotated[
        int | None,
        typer.Option(help="Largest request body in bytes (default: max message size x batch)."),
    ] = None,
    sample_interval: Annotated[
        float, typer.Option(help="Seconds between the dashboard's stats samples.")
    ] = 2.0,
    log_level: Annotated[str, typer.Option("--log-level", help="Logging level.")] = "info",
    access_log: Annotated[bool, typer.Option(help="Log every request.")] = False,
) -> None:
    """Serve the REST API, the live dashboard and /metrics (http://127.0.0.1:8040).

    API keys come from FAIRQ_API_KEYS ("KEY:admin,KEY2:send+receive", see docs/server.md);
    without keys the server listens on loopback only.
    """
    try:
        from .http.serve import ServeOptions, prepare
        from .http.serve import serve as run_server
    except ImportError as exc:  # pragma: no cover - depends on the install
        err_console.print(
            f"[red]error:[/red] fairq serve needs: pip install 'fairq[server]' ({exc})"
        )
        raise typer.Exit(2) from None
    options = ServeOptions(
        url=url,
        host=host,
        port=port,
        workers=workers,
        api_keys=os.environ.get("FAIRQ_API_KEYS"),
        max_body=max_body,
        max_batch=max_batch,
        sample_interval=sample_interval,
        log_level=log_level,
        access_log=access_log,
    )
    try:
        keys = prepare(options)
    except FairqError as exc:
        err_console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    from .broker import DEFAULT_URL, mask_url

    shown = f"[{host}]" if ":" in host else host
    backend = mask_url(url or os.environ.get("FAIRQ_URL") or DEFAULT_URL)
    console.print(
        f"fairq serve: dashboard [bold]http://{shown}:{port}/[/bold] · API /v1 · "
        f"/openapi.json · /metrics — backend {backend} · "
        + ("API keys on" if keys.enabled else "no API keys (loopback only)")
        + (" · push deliveries and reconcilers on" if workers else "")
    )
    run_server(options)


# -- worker --------------------------------------------------------------------------------
def load_worker(spec: str) -> Worker:
    """Import ``module:attr``; ``attr`` is a Worker or a function returning one."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise typer.BadParameter(f"expected module:attribute, got {spec!r}", param_hint="APP")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise typer.BadParameter(f"cannot import {module_name!r}: {exc}", param_hint="APP") from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise typer.BadParameter(
                f"{module_name!r} has no attribute {attr!r}", param_hint="APP"
            ) from None
    if not isinstance(obj, Worker) and callable(obj):
        obj = obj()
    if not isinstance(obj, Worker):
        raise typer.BadParameter(f"{spec} is not a fairq.Worker", param_hint="APP")
    return obj


@app.command()
def worker(
    spec: Annotated[str, typer.Argument(metavar="APP", help="module:attribute of a fairq.Worker.")],
    push: Annotated[bool, typer.Option(help="Also deliver every push subscription.")] = False,
    log_level: Annotated[str, typer.Option("--log-level", help="Logging level.")] = "INFO",
) -> None:
    """Run a worker until SIGINT/SIGTERM (graceful: in-flight messages finish or go back)."""
    import logging

    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    w = load_worker(spec)
    if push:
        w.push()
    _run(w.run)


# -- demo ----------------------------------------------------------------------------------
demo_app = typer.Typer(
    help="Runnable scenarios of the seeds: BoxOffice ticket PDFs (default), flash-sale.",
    add_completion=False,
)
app.add_typer(demo_app, name="demo")


@demo_app.callback(invoke_without_command=True)
def demo(
    ctx: typer.Context,
    jobs: Annotated[int, typer.Option(help="How many GenerateTicketPdf jobs to send.")] = 300,
    workers: Annotated[int, typer.Option(help="Worker processes.")] = 2,
    concurrency: Annotated[int, typer.Option(help="Handlers per worker process.")] = 4,
    out: Annotated[Path, typer.Option(help="Where the PDFs go.")] = Path("tickets"),
    chaos: Annotated[
        bool, typer.Option(help="kill -9 a worker half-way and start a new one.")
    ] = False,
    url: UrlOption = None,
) -> None:
    """The BoxOffice ticket-PDF scenario: send jobs, run worker processes, show progress.
    ``fairq demo flash-sale``: the 10:00 sale behind a waiting room."""
    if ctx.invoked_subcommand is not None:
        return
    from .demo.run import run_demo

    _run(
        lambda: run_demo(
            url,
            jobs=jobs,
            workers=workers,
            concurrency=concurrency,
            out=out,
            chaos=chaos,
            console=console,
        )
    )


@demo_app.command("flash-sale")
def flash_sale(
    fans: Annotated[int, typer.Option(help="Fans who come for the sale.")] = 20_000,
    seats: Annotated[int, typer.Option(help="Seats on sale.")] = 3_000,
    rate: Annotated[float, typer.Option(help="Fans admitted per second.")] = 100.0,
    inventory_rate: Annotated[
        float, typer.Option(help="Holds the inventory makes per second, at most.")
    ] = 400.0,
    hold: Annotated[float, typer.Option(help="Seconds a seat hold lasts unless bought.")] = 4.0,
    buy_share: Annotated[float, typer.Option(help="Share of fans who buy their hold.")] = 0.75,
    pre_open: Annotated[
        float, typer.Option(help="Seconds before opening (fans arriving then are drawn).")
    ] = 3.0,
    adaptive: Annotated[
        bool, typer.Option(help="Lower the admit rate when the inventory degrades.")
    ] = True,
    seed: Annotated[int | None, typer.Option(help="Seed of the simulated crowd.")] = None,
    url: UrlOption = None,
) -> None:
    """The seed's flash sale: a crowd, a waiting room admitting at --rate, a rate-limited
    inventory whose holds expire (delayed messages), and "sold out" for everyone left."""
    from .demo.flash_sale import SaleConfig, run_flash_sale

    config = SaleConfig(
        fans=fans,
        seats=seats,
        rate=rate,
        inventory_rate=inventory_rate,
        hold=hold,
        buy_share=buy_share,
        pre_open=pre_open,
        adaptive=adaptive,
        seed=seed,
    )
    _run(lambda: run_flash_sale(url, config, console))


# -- bench ---------------------------------------------------------------------------------
@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def bench(
    ctx: typer.Context,
    suite: Annotated[str, typer.Argument(help="Which benchmark: queues.")] = "queues",
) -> None:
    """Run a benchmark from the fairq checkout's bench/ folder (extra options pass through)."""
    root = Path.cwd()
    while not (root / "bench" / f"{suite}.py").exists():
        if root.parent == root:
            err_console.print(
                f"[red]error:[/red] bench/{suite}.py not found; run from a fairq checkout"
            )
            raise typer.Exit(2)
        root = root.parent
    sys.path.insert(0, str(root))
    module = importlib.import_module(f"bench.{suite}")
    raise typer.Exit(module.main(list(ctx.args)) or 0)


def _progress() -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    )


def main() -> None:
    """Entry point of the ``fairq`` console script."""
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
