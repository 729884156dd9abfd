"""Publish/subscribe commands: publish, subscribe, topics."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from ..broker import Broker, connect

if TYPE_CHECKING:
    pass


from .app import (
    ApiKeyOption,
    AttrOption,
    BodyArgument,
    DedupOption,
    ServerOption,
    UrlOption,
    _age,
    _open,
    _parse_attrs,
    _run,
    app,
    console,
    no_server,
)
from .tables import Col, fitted


# -- publish / subscribe -------------------------------------------------------------------
@app.command()
def publish(
    topic: Annotated[str, typer.Argument(help="Topic name.")],
    body: BodyArgument = None,
    attr: AttrOption = [],  # noqa: B006
    key: Annotated[
        str, typer.Option("--key", "-k", help="Routing key, e.g. order.confirmed.br.")
    ] = "",
    dedup_id: DedupOption = None,
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
            if r.duplicate:  # a repeated dedup id: the first publish's answer, nothing new
                console.print(
                    f"{r.message_id} → {copies} [yellow](a duplicate of that publish: "
                    "nothing was published now)[/yellow]"
                )
            else:
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
    """Create (or update) a subscription of a topic. Updating, an option left out keeps the
    subscription's current value; --filter "" and --push "" remove them."""
    no_server(url, "subscribe")
    import dataclasses
    import json

    try:
        policy = None if not filter else json.loads(filter)
    except json.JSONDecodeError as exc:
        raise typer.BadParameter(f"not JSON: {exc}", param_hint="--filter") from exc

    async def main() -> None:
        async with await connect(url) as broker:
            if topic not in await broker.list_topics(prefix=topic):
                await broker.declare_topic(topic)
            t = broker.topic(topic)
            chosen: dict[str, Any] = {"filter": policy, "routing": routing, "push": push or None}
            given = {"filter": filter, "routing": routing, "push": push}
            for sub in await t.subscriptions():
                if sub.name == name:  # an update: what was left out stays as it is
                    for option, value in given.items():
                        if value is None:
                            chosen[option] = getattr(sub, option)
                    # and so do its queue's options (a subscribe states them all)
                    config = await broker.queue(sub.queue).config()
                    chosen.update(dataclasses.asdict(config))
            q = await t.subscribe(name, **chosen)
            console.print(f"subscription {name} of {topic} → queue [cyan]{q.name}[/cyan]")

    _run(main)


async def topics_table(broker: Broker, width: int | None = None) -> Table:
    """A table of every topic and its subscriptions, with filters, routing and depths,
    fitted to ``width`` (the terminal's)."""
    cols = [
        Col("topic"),
        Col("published", True, 3),
        Col("unmatched", True, 4),
        Col("subscription"),
        Col("routing", hide=2),
        Col("filter", hide=1),
        Col("push", hide=5),
        Col("visible", True),
        Col("in flight", True),
        Col("oldest", True),
        Col("dlq", True),
    ]
    rows: list[list[str]] = []
    queues = set(await broker.list_queues())
    for name in await broker.list_topics():
        t = broker.topic(name)
        s = await t.stats()
        subs = await t.subscriptions()
        if not subs:
            rows.append([name, str(s.published), str(s.unmatched), "[dim]none[/dim]"] + [""] * 7)
        for i, sub in enumerate(subs):
            qs = await broker.queue(sub.queue).stats()
            dlq = f"{sub.queue}.dlq"
            dlq_depth = str((await broker.queue(dlq).stats()).depth) if dlq in queues else "-"
            rows.append(
                [
                    name if i == 0 else "",
                    str(s.published) if i == 0 else "",
                    str(s.unmatched) if i == 0 else "",
                    sub.name,
                    "#" if sub.routing is None else (sub.routing or '""'),
                    "" if sub.filter is None else json_compact(sub.filter),
                    sub.push or "",
                    str(qs.visible),
                    str(qs.in_flight),
                    _age(qs.oldest_age),
                    dlq_depth,
                ]
            )
    return fitted(f"fairq topics — {broker.url}", cols, rows, width or console.width)


def json_compact(value: Any) -> str:
    import json

    return json.dumps(value, separators=(",", ":"))


@app.command()
def topics(url: UrlOption = None) -> None:
    """Show topics, their subscriptions, filters, routing and queue depths."""
    no_server(url, "topics")

    async def main() -> None:
        async with await connect(url) as broker:
            console.print(await topics_table(broker))

    _run(main)
