"""The ``fairq`` Typer app and what its commands share: console, options, error
handling, small formatters. The commands live in the sibling modules."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .. import __version__
from ..broker import Broker, connect
from ..errors import FairqError
from ..extras import MissingExtra

if TYPE_CHECKING:
    from ..http.client import Client


app = typer.Typer(
    name="fairq",
    help="fairq: durable queues, pub/sub, fair attention queues — embedded on SQLite, or on "
    "Redis, PostgreSQL or RabbitMQ (--url).",
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
BodyArgument = Annotated[
    str | None, typer.Argument(help="Message body; '-' or omitted reads stdin.")
]
AttrOption = Annotated[
    list[str], typer.Option("--attr", "-a", help="Attribute key=value (repeatable).")
]
DedupOption = Annotated[str | None, typer.Option("--dedup-id", help="Deduplication id.")]


def fail(message: str, code: int = 1) -> NoReturn:
    """Print ``error: message`` on stderr and exit with ``code``. The message is printed as
    text, not as console markup: ``pip install 'fairq[server]'`` keeps its ``[server]``."""
    err_console.print(f"[red]error:[/red] {escape(message)}", soft_wrap=True)  # one line
    raise typer.Exit(code)


async def _open(url: str | None, server: str | None, api_key: str | None) -> Broker | Client:
    """The broker at ``url``, or a client of the server at ``server``."""
    if server:
        try:
            from ..http.client import Client
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise typer.BadParameter(
                f"--server needs httpx: pip install 'fairq[server]' ({exc})"
            ) from exc
        return Client(server, api_key)
    return await connect(url)


def no_server(url: str | None, command: str) -> None:
    """For a command that cannot go through a server: with ``$FAIRQ_SERVER`` set and no
    ``--url`` (nor ``$FAIRQ_URL``), stop rather than quietly open ``./fairq.db``."""
    if url is None and os.environ.get("FAIRQ_SERVER"):
        fail(
            f"fairq {command} does not go through a server yet, and FAIRQ_SERVER is set: "
            "give the backend with --url (or FAIRQ_URL), or unset FAIRQ_SERVER",
            2,
        )


def smaller_batch(exc: FairqError) -> int | None:
    """The batch size a server asks for when it refused a larger one (its ``max_batch``,
    from ``422 at most N items per request``: nothing was done), else None."""
    found = re.search(r"at most (\d+) items per request", str(exc))
    if found is None or getattr(exc, "status", None) != 422:
        return None
    return max(1, int(found.group(1)))


class Batches:
    """The batch size a server takes: 100 until it names a smaller one (its ``max_batch``);
    an embedded broker never does."""

    def __init__(self) -> None:
        self.size = 100

    async def run(self, step: Callable[[int], Awaitable[T]], want: int) -> tuple[int, T]:
        """``step(n)`` for ``n = min(size, want)``, and ``n``; a request the server refused
        for its size did nothing, so it is made again at the size the server names."""
        while True:
            n = min(self.size, want)
            try:
                return n, await step(n)
            except FairqError as exc:
                smaller = smaller_batch(exc)
                if smaller is None or smaller >= n:
                    raise
                self.size = smaller


def _run(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a coroutine; turn fairq errors into a one-line message and exit code 1."""
    try:
        return asyncio.run(main())
    except FairqError as exc:
        fail(str(exc))
    except MissingExtra as exc:
        fail(str(exc), 2)
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


class _Line(logging.Formatter):
    """``warning: message``, as the CLI's errors are ``error: message``."""

    def format(self, record: logging.LogRecord) -> str:
        return f"{record.levelname.lower()}: {record.getMessage()}"


#: the commands that set up logging of their own (a log format with times, uvicorn's)
_OWN_LOGGING = frozenset({"worker", "serve", "demo"})


@app.callback(invoke_without_command=True)
def _main(
    ctx: typer.Context,
    version: Annotated[bool, typer.Option("--version", help="Print the version and exit.")] = False,
) -> None:
    if version:
        console.print(f"fairq {__version__}")
        raise typer.Exit()
    logger = logging.getLogger("fairq")
    if ctx.invoked_subcommand not in _OWN_LOGGING and not logger.handlers:
        # fairq's warnings (an engine setting to fix, say) as one "warning:" line each
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(_Line())
        handler.setLevel(logging.WARNING)
        logger.addHandler(handler)


async def watch_live(make: Callable[[], Awaitable[Any]], every: float = 1.0) -> None:
    """Show ``await make()`` (a table) and refresh it every ``every`` seconds until Ctrl-C:
    in place on a terminal; printed anew each time, with its time, into a pipe or a file
    (where a live display would write nothing until the end)."""
    if console.is_terminal:
        from rich.live import Live

        with Live(await make(), console=console, refresh_per_second=4) as live:
            while True:
                await asyncio.sleep(every)
                live.update(await make())
    while True:
        console.print(f"# {time.strftime('%Y-%m-%d %H:%M:%S')}")
        console.print(await make())
        sys.stdout.flush()
        await asyncio.sleep(every)


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
