"""The attention command: a domain's counters and busiest keys."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Group

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
    no_server,
    watch_live,
)
from .tables import Col, fitted, folded


# -- attention -----------------------------------------------------------------------------
async def attention_tables(
    broker: Broker, domain: str, top: int, width: int | None = None
) -> Group:
    """The counters of an attention domain, its tenants' shares and its busiest keys,
    fitted to ``width`` (the terminal's)."""
    a = broker.attention(domain)
    s = await a.stats()
    width = width or console.width
    discarded = ", ".join(f"{k} {v}" for k, v in sorted(s.discarded.items())) or "0"
    counts = {
        "keys": str(s.keys),
        "signals": str(s.signals_pending),
        "slices": str(s.slices),
        "processed": str(s.processed),
        "republished": str(s.republished),
        "blocked": str(s.blocked),
        "rate limited": str(s.rate_limited),
        "empty": str(s.empty),
        "parked": str(s.parked),
        "reconciled": str(s.reconciled),
        "discarded": discarded,
        "clear time": _age(s.clear_time_avg),
    }
    counters = folded(
        f"attention domain {domain} — {s.queue}",
        [Col(name, True) for name in counts],
        list(counts.values()),
        width,
    )
    key_rows = []
    for k in await a.key_stats(top=top):
        state = k.state if k.state == "active" else f"[yellow]{k.state}[/yellow]"
        key_rows.append(
            [
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
            ]
        )
    keys = fitted(
        f"busiest {top} keys",
        [
            Col("key"),
            Col("tenant"),
            Col("plan", hide=2),
            Col("state"),
            Col("backlog", True),
            Col("in flight", True),
            Col("oldest", True),
            Col("slices", True, 3),
            Col("signals", True, 4),
            Col("processed", True, 1),
        ],
        key_rows,
        width,
    )
    try:
        tenants = await a.tenant_stats(top=top)
    except Unsupported:  # an engine without per-tenant usage yet
        return Group(counters, keys)
    table = fitted(
        "tenants, last minute (share of the domain's worker time)",
        [
            Col("tenant"),
            Col("share", True),
            Col("worker time", True),
            Col("slices", True, 2),
            Col("messages", True, 1),
            Col("backlog", True),
            Col("at cap", True),
        ],
        [
            [
                t.tenant,
                f"{t.share:.1%}",
                _age(t.busy),
                str(t.slices),
                str(t.messages),
                str(t.backlog),
                "[yellow]yes[/yellow]" if t.at_cap else "",
            ]
            for t in tenants
        ],
        width,
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
    no_server(url, "attention")

    async def main() -> None:
        async with await connect(url) as broker:
            if not watch:
                console.print(await attention_tables(broker, domain, top))
                return
            await watch_live(lambda: attention_tables(broker, domain, top))

    _run(main)
