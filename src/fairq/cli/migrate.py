"""``fairq migrate``: bring a PostgreSQL schema up to date (the same migrations a broker
applies when it connects), or print their SQL with ``--dry-run``."""

from __future__ import annotations

from typing import Annotated

import typer

from .app import UrlOption, _run, app, console, err_console


@app.command()
def migrate(
    url: UrlOption = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the SQL that would run; change nothing.")
    ] = False,
) -> None:
    """Apply fairq's missing migrations to a postgresql:// URL's schema (?schema=, default
    fairq), under an advisory lock; --dry-run prints them instead."""
    if not url or not url.startswith(("postgresql://", "postgres://")):
        err_console.print(
            "fairq migrate needs --url postgresql://... (only PostgreSQL has migrations to "
            "run: SQLite upgrades its file when it opens it, Redis and RabbitMQ have none)"
        )
        raise typer.Exit(2)
    from ..backends.postgres.migrate import migrate_url

    todo, script = _run(lambda: migrate_url(url, dry_run))
    if dry_run:
        if not todo:
            console.print("up to date: nothing to apply")
            return
        typer.echo(script)
        return
    if not todo:
        console.print("up to date: nothing to apply")
    for m in todo:
        console.print(f"applied {m.version:04d}_{m.name}")
