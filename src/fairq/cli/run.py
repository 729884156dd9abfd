"""Commands that run things: worker, demo (BoxOffice, flash-sale), bench."""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ..worker import Worker

if TYPE_CHECKING:
    pass


from .app import (
    UrlOption,
    _run,
    app,
    console,
    err_console,
)


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
    url: Annotated[
        str | None,
        typer.Option(
            "--url",
            "-u",
            help="Backend URL for a Worker made without one (default $FAIRQ_URL, else "
            "sqlite:///fairq.db).",
        ),
    ] = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            "--metrics-port",
            min=0,
            max=65535,
            help="Serve the worker's /metrics (Prometheus) and /healthz on this port.",
        ),
    ] = None,
    metrics_host: Annotated[
        str, typer.Option("--metrics-host", help="Address of --metrics-port.")
    ] = "127.0.0.1",
) -> None:
    """Run a worker until SIGINT/SIGTERM (graceful: in-flight messages finish or go back)."""
    import logging

    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if url is not None:  # before the app is imported: a Worker() there reads it when it runs
        os.environ["FAIRQ_URL"] = url
    w = load_worker(spec)
    if url is not None and not w.takes_url_from_environment():
        raise typer.BadParameter(
            f"{spec} makes its Worker with a broker or URL of its own; --url cannot replace "
            "it (make it with fairq.Worker() to take --url or $FAIRQ_URL)",
            param_hint="--url",
        )
    if push:
        w.push()
    if metrics_port is not None:
        w.metrics_port, w.metrics_host = metrics_port, metrics_host
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
    from ..demo.run import run_demo

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
    from ..demo.flash_sale import SaleConfig, run_flash_sale

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
