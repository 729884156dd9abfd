"""The attention command: a domain's counters and busiest keys."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Group
from rich.live import Live
from rich.table import Table

from ..broker import Broker, connect
from ..errors import Unsupported

if TYPE_CHECKING:
    pass


from .app import (
    UrlOption,
    _age,
    _run,
    app,
    console,
)


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
    try:
        tenants = await a.tenant_stats(top=top)
    except Unsupported:  # an engine without per-tenant usage yet
        return Group(counters, keys)
    table = Table(title="tenants, last minute (share of the domain's worker time)")
    for col in ("tenant", "share", "worker time", "slices", "messages", "backlog", "at cap"):
        table.add_column(col, justify="left" if col == "tenant" else "right")
    for t in tenants:
        table.add_row(
            t.tenant,
            f"{t.share:.1%}",
            _age(t.busy),
            str(t.slices),
            str(t.messages),
            str(t.backlog),
            "[yellow]yes[/yellow]" if t.at_cap else "",
        )
    return Group(counters, table, keys)


@app.command()
def attention(
    domain: Annotated[str, typer.Argument(help="Attention domain.")],
    top: Annotated[int, typer.Option(help="How many keys to show, busiest first.")] = 20,
    watch: Annotated[bool, typer.Option(help="Refresh every second until Ctrl-C.")] = False,
    url: UrlOption = None,
) -> None:
    """Show an attention domain: counters, tenants' shares and the busiest keys (live with
    --watch)."""

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
