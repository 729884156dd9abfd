"""``fairq serve``: the HTTP API, the dashboard and /metrics."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Annotated

import typer

from ..errors import FairqError

if TYPE_CHECKING:
    pass


from rich.markup import escape

from .app import (
    UrlOption,
    app,
    console,
    err_console,
    fail,
)


# -- serve ---------------------------------------------------------------------------------
@app.command()
def serve(
    url: UrlOption = None,
    host: Annotated[
        str, typer.Option(envvar="FAIRQ_HOST", help="Address to listen on (loopback by default).")
    ] = "127.0.0.1",
    port: Annotated[
        int, typer.Option(min=1, max=65535, envvar="FAIRQ_PORT", help="Port to listen on.")
    ] = 8040,
    workers: Annotated[
        bool,
        typer.Option(
            "--workers/--no-workers",
            help="Also deliver push subscriptions and run the attention reconcilers and "
            "the waiting rooms' admitters here.",
        ),
    ] = False,
    max_batch: Annotated[int, typer.Option(min=1, help="Most messages per request.")] = 100,
    max_body: Annotated[
        int | None,
        typer.Option(
            min=1024, help="Largest request body in bytes (default: max message size x batch)."
        ),
    ] = None,
    sample_interval: Annotated[
        float, typer.Option(min=0.1, help="Seconds between the dashboard's stats samples.")
    ] = 2.0,
    max_queues: Annotated[
        int,
        typer.Option(
            min=1,
            help="Most queues sampled for the dashboard and given series (the application's "
            "with their dead-letter queues first, then attention work queues) "
            "in /metrics (fairq_queues counts them all).",
        ),
    ] = 1000,
    log_level: Annotated[str, typer.Option("--log-level", help="Logging level.")] = "info",
    access_log: Annotated[bool, typer.Option(help="Log every request.")] = False,
    allowed_host: Annotated[
        list[str] | None,
        typer.Option(
            "--allowed-host",
            help="A Host name to answer besides localhost/127.0.0.1/[::1] (repeatable; "
            "also FAIRQ_ALLOWED_HOSTS, comma-separated). Without API keys no other name is "
            "answered (DNS rebinding).",
        ),
    ] = None,
    max_waiting: Annotated[
        int,
        typer.Option(
            help="Most topic streams, long polls and blocked sends at once; past it: 503 "
            "with Retry-After.",
        ),
    ] = 100,
    session_ttl: Annotated[
        float,
        typer.Option(
            help="Seconds a dashboard login lasts (its signed cookie; FAIRQ_SESSION_SECRET "
            "signs it, else a secret drawn at start).",
        ),
    ] = 43_200.0,
    forwarded_allow_ips: Annotated[
        str | None,
        typer.Option(
            "--forwarded-allow-ips",
            envvar="FORWARDED_ALLOW_IPS",
            help="Proxy addresses whose X-Forwarded-For/-Proto are believed (uvicorn's "
            "option; default 127.0.0.1).",
        ),
    ] = None,
) -> None:
    """Serve the REST API, the live dashboard and /metrics (http://127.0.0.1:8040).

    API keys come from FAIRQ_API_KEYS ("KEY:admin,KEY2:send+receive", see docs/server.md);
    without keys the server listens on loopback only.
    """
    try:
        from ..http.serve import ServeOptions, listen, parse_hosts, prepare
        from ..http.serve import serve as run_server
    except ImportError as exc:  # depends on the install
        fail(f"fairq serve needs: pip install 'fairq[server]' ({exc})", 2)
    options = ServeOptions(
        url=url,
        host=host,
        port=port,
        workers=workers,
        api_keys=os.environ.get("FAIRQ_API_KEYS"),
        max_body=max_body,
        max_batch=max_batch,
        sample_interval=sample_interval,
        max_queues=max_queues,
        log_level=log_level,
        access_log=access_log,
        allowed_hosts=(*parse_hosts(os.environ.get("FAIRQ_ALLOWED_HOSTS")), *(allowed_host or ())),
        forwarded_allow_ips=forwarded_allow_ips,
        session_secret=os.environ.get("FAIRQ_SESSION_SECRET") or None,
        session_ttl=session_ttl,
        max_waiting=max_waiting,
        room_secrets=os.environ.get("FAIRQ_ROOM_SECRETS"),
    )
    try:
        keys = prepare(options)
    except FairqError as exc:
        err_console.print(f"[red]error:[/red] {escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(2) from None
    try:
        sock = listen(host, port)  # before the banner: a port in use is one line
    except FairqError as exc:
        err_console.print(f"[red]error:[/red] {escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(1) from None
    from ..broker import DEFAULT_URL, mask_url

    shown = f"[{host}]" if ":" in host else host
    backend = mask_url(url or os.environ.get("FAIRQ_URL") or DEFAULT_URL)
    console.print(
        f"fairq serve: dashboard [bold]http://{shown}:{port}/[/bold] · API /v1 · "
        f"/openapi.json · /metrics — backend {backend} · "
        + ("API keys on" if keys.enabled else "no API keys (loopback only)")
        + (" · push deliveries, reconcilers and admitters on" if workers else "")
    )
    run_server(options, sock)
