"""fairq's tables as an artifact: versioned migrations (``migrations/NNNN_name.sql``),
applied in order inside one transaction under an advisory lock, so ten workers starting
at once migrate once and the others find the work done.

``{schema}`` in a migration stands for the quoted schema name, ``{channel}`` for the
NOTIFY channel; ``<schema>.migrations`` records what was applied. A database migrated by
a newer fairq is refused rather than guessed at. ``fairq migrate`` (``--dry-run`` prints
the SQL) runs the same code.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from importlib import resources
from typing import Any

import psycopg
from psycopg import sql

from ...errors import FairqError

__all__ = ["LOCK_KEY", "Migration", "apply", "migrations", "pending", "render"]

#: the first key of the advisory locks fairq takes (the second is the schema's hash)
LOCK_KEY = 1718774386  # "fair" in ASCII, as an int
_NAME = re.compile(r"(\d{4})_([a-z0-9_]+)\.sql")


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    text: str  # with the {schema} and {channel} placeholders


def migrations() -> list[Migration]:
    """Every migration shipped with this fairq, in version order."""
    found = []
    folder = resources.files(__package__).joinpath("migrations")
    for entry in folder.iterdir():
        m = _NAME.fullmatch(entry.name)
        if m:
            found.append(Migration(int(m.group(1)), m.group(2), entry.read_text("utf-8")))
    found.sort(key=lambda m: m.version)
    for i, mig in enumerate(found, 1):
        if mig.version != i:
            raise FairqError(f"migrations are not numbered 1..n: {mig.version:04d}_{mig.name}")
    return found


def render(m: Migration, schema: str, channel: str) -> str:
    """The SQL of a migration for one schema."""
    quoted = '"' + schema.replace('"', '""') + '"'
    return m.text.replace("{schema}", quoted).replace("{channel}", channel)


def _prelude(schema: str) -> list[sql.Composed]:
    s = sql.Identifier(schema)
    return [
        sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(s),
        sql.SQL(
            "CREATE TABLE IF NOT EXISTS {}.migrations (version int PRIMARY KEY, "
            "name text NOT NULL, applied_at float8 NOT NULL)"
        ).format(s),
    ]


async def _applied(cur: psycopg.AsyncCursor[Any], schema: str) -> int:
    await cur.execute(
        "SELECT to_regclass(%s) IS NOT NULL", (sql.Identifier(schema).as_string() + ".migrations",)
    )
    row = await cur.fetchone()
    if not row or not row[0]:
        return 0
    await cur.execute(
        sql.SQL("SELECT coalesce(max(version), 0) FROM {}.migrations").format(
            sql.Identifier(schema)
        )
    )
    row = await cur.fetchone()
    return int(row[0]) if row else 0


async def pending(conn: psycopg.AsyncConnection[Any], schema: str) -> list[Migration]:
    """The migrations this database still needs (none: it is up to date)."""
    async with conn.cursor() as cur:
        have = await _applied(cur, schema)
    known = migrations()
    if have > len(known):
        raise FairqError(
            f"schema {schema!r} was migrated by a newer fairq (version {have}; this fairq "
            f"knows {len(known)}); upgrade fairq"
        )
    return known[have:]


async def apply(
    conn: psycopg.AsyncConnection[Any], schema: str, channel: str, upto: int | None = None
) -> list[Migration]:
    """Bring ``schema`` up to date (or up to version ``upto``) in one transaction under
    the schema's advisory lock; return the migrations applied (none if another process
    got there first)."""
    async with conn.transaction(), conn.cursor() as cur:
        await cur.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (LOCK_KEY, schema))
        todo = await pending(conn, schema)
        if upto is not None:
            todo = [m for m in todo if m.version <= upto]
        if not todo:
            return []
        for statement in _prelude(schema):
            await cur.execute(statement)
        for m in todo:
            await cur.execute(render(m, schema, channel).encode())  # no parameters: as is
            await cur.execute(
                sql.SQL(
                    "INSERT INTO {}.migrations (version, name, applied_at) VALUES (%s, %s, %s)"
                ).format(sql.Identifier(schema)),
                (m.version, m.name, time.time()),
            )
        return todo


def dry_run_sql(schema: str, channel: str, todo: list[Migration]) -> str:
    """The SQL ``apply`` would run for ``todo``, as one script."""
    parts = [f"-- fairq migrations for schema {schema!r}", "BEGIN;"]
    parts += [s.as_string(None) + ";" for s in _prelude(schema)]
    for m in todo:
        parts.append(f"-- {m.version:04d}_{m.name}")
        parts.append(render(m, schema, channel))
        parts.append(
            f"INSERT INTO {sql.Identifier(schema).as_string(None)}.migrations "
            f"(version, name, applied_at) VALUES ({m.version}, '{m.name}', "
            "extract(epoch FROM now()));"
        )
    parts.append("COMMIT;")
    return "\n".join(parts)


async def migrate_url(url: str, dry_run: bool = False) -> tuple[list[Migration], str]:
    """What ``fairq migrate`` does: connect to ``url`` and apply the missing migrations
    (or, with ``dry_run``, only say which and give their SQL). Returns the migrations and
    the SQL script (empty unless ``dry_run``)."""
    from ...errors import ConnectionError
    from .connection import mask, parse_url, translate

    opts = parse_url(url)
    try:
        conn = await psycopg.AsyncConnection.connect(opts.conninfo, autocommit=True)
    except psycopg.Error as exc:
        raise ConnectionError(f"cannot connect to {opts.masked}: {mask(str(exc))}") from exc
    try:
        if dry_run:
            todo = await pending(conn, opts.schema)
            return todo, dry_run_sql(opts.schema, opts.channel, todo) if todo else ""
        return await apply(conn, opts.schema, opts.channel), ""
    except psycopg.Error as exc:
        raise translate(exc, opts.masked) from exc
    finally:
        await conn.close()
