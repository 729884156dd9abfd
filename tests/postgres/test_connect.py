"""The PostgreSQL backend's own rules, beyond the conformance suite: URLs and options,
errors with the password masked, migrations (an upgraded database equals a fresh one),
the clock."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import psycopg
import pytest

import fairq
from fairq.backends.postgres import PostgresBackend, migrate
from fairq.backends.postgres.connection import mask, parse_url
from services import PG_SERVER, drop_namespace, pg_connections, pg_database, pg_url
from services import require as _require


@pytest.fixture(autouse=True)
def _needs_postgres() -> None:
    _require("postgres")


# -- URLs ----------------------------------------------------------------------------------
def test_url_options_are_split_from_libpq_ones() -> None:
    opts = parse_url(
        "postgres://app:s3cret@db.example:6543/shop?schema=jobs&pool_min=2&pool_max=20"
        "&timeout=5&sslmode=require&listen=off&poll=0.5&prepare=off&clock=client"
    )
    assert opts.schema == "jobs"
    assert (opts.pool_min, opts.pool_max, opts.timeout) == (2, 20, 5.0)
    assert (opts.listen, opts.poll, opts.prepare, opts.clock) == (False, 0.5, False, "client")
    assert opts.conninfo.startswith("postgresql://app:s3cret@db.example:6543/shop?")
    assert "sslmode=require" in opts.conninfo and "schema" not in opts.conninfo
    assert "s3cret" not in opts.masked and "app:***@" in opts.masked
    assert opts.channel == "fairq_jobs"
    assert not opts.durable_leases
    assert parse_url("postgresql://u@h/db?durable_leases=on").durable_leases


@pytest.mark.parametrize(
    "query",
    [
        "schema=1bad",
        "schema=a-b",
        "pool_max=0",
        "pool_min=5&pool_max=2",
        "timeout=x",
        "listen=maybe",
        "clock=sundial",
        "connect_timeout=abc",
    ],
)
def test_bad_options_are_refused(query: str) -> None:
    with pytest.raises(fairq.InvalidOption):
        parse_url(f"postgresql://u@h/db?{query}")


async def test_libpq_options_with_spaces_reach_the_server_unchanged() -> None:
    _require("postgres")
    url = pg_url("fairq").replace("?", "?options=-c%20statement_timeout%3D4321&", 1)
    url += "&application_name=my%20app"
    conninfo = parse_url(url).conninfo
    assert "+" not in conninfo.split("?", 1)[1]  # libpq reads a '+' as a '+'
    async with await psycopg.AsyncConnection.connect(conninfo) as conn:
        cur = await conn.execute(
            "SELECT current_setting('statement_timeout'), current_setting('application_name')"
        )
        assert await cur.fetchone() == ("4321ms", "my app")


def test_mask_hides_passwords_everywhere() -> None:
    assert mask("postgresql://u:pw@h/db") == "postgresql://u:***@h/db"
    assert mask("postgresql://u@h/db?password=pw&x=1") == "postgresql://u@h/db?password=***&x=1"


async def test_unreachable_server_is_a_connection_error_with_the_password_masked() -> None:
    url = "postgresql://fairq:hunter2@127.0.0.1:1/nowhere?connect_timeout=1"
    started = time.monotonic()
    with pytest.raises(fairq.ConnectionError) as info:
        await fairq.connect(url)
    assert time.monotonic() - started < 10
    assert "hunter2" not in str(info.value) and "***" in str(info.value)
    assert isinstance(info.value.__cause__, psycopg.Error)


async def test_wrong_credentials_are_a_connection_error() -> None:
    url = f"postgresql://no_such_role:pw123@127.0.0.1:5432/{pg_database()}"
    with pytest.raises(fairq.ConnectionError) as info:
        await fairq.connect(url)
    assert "pw123" not in str(info.value)
    assert "no_such_role" in str(info.value)


async def test_postgres_scheme_alias_works() -> None:
    url = pg_url().replace("postgresql://", "postgres://")
    try:
        b = await fairq.connect(url, clock=fairq.ManualClock())
        q = await b.declare_queue("alias")
        await q.send(b"x")
        assert (await q.stats()).visible == 1
        await b.close()
    finally:
        drop_namespace(url.replace("postgres://", "postgresql://"))


# -- migrations ----------------------------------------------------------------------------
_CATALOG = """
SELECT 'col', c.relname || '.' || a.attname || ':' || format_type(a.atttypid, a.atttypmod)
       || ':' || a.attnotnull || ':' || coalesce(pg_get_expr(d.adbin, d.adrelid), '')
FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE n.nspname = %(s)s AND a.attnum > 0 AND NOT a.attisdropped AND c.relkind IN ('r', 'S')
UNION ALL
SELECT 'idx', replace(pg_get_indexdef(i.indexrelid), %(s)s, 'S')
FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %(s)s
UNION ALL
SELECT 'fn', p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ')'
       || md5(replace(p.prosrc, %(s)s, 'S'))
FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = %(s)s
UNION ALL
SELECT 'opt', c.relname || ':' || coalesce(array_to_string(c.reloptions, ','), '')
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %(s)s AND c.relkind = 'r'
ORDER BY 1, 2
"""


async def _catalog(conn: psycopg.AsyncConnection, schema: str) -> list[tuple[str, str]]:
    cur = await conn.execute(_CATALOG, {"s": schema})
    rows = await cur.fetchall()
    return [(kind, text.replace(f'"{schema}"', "S").replace(schema, "S")) for kind, text in rows]


async def test_every_upgrade_path_ends_where_a_fresh_schema_starts() -> None:
    db = pg_database()
    known = migrate.migrations()
    assert [m.version for m in known] == list(range(1, len(known) + 1))
    async with await psycopg.AsyncConnection.connect(f"{PG_SERVER}/{db}", autocommit=True) as c:
        fresh = "mig_fresh"
        await migrate.apply(c, fresh, "ch")
        want = await _catalog(c, fresh)
        assert any(kind == "fn" and text.startswith("receive(") for kind, text in want)
        try:
            for start in range(len(known)):
                schema = f"mig_from_{start}"
                if start:
                    assert [m.version for m in await migrate.apply(c, schema, "ch", start)] == list(
                        range(1, start + 1)
                    )
                done = await migrate.apply(c, schema, "ch")
                assert [m.version for m in done] == list(range(start + 1, len(known) + 1))
                assert await migrate.apply(c, schema, "ch") == []  # idempotent
                assert await _catalog(c, schema) == want, f"upgrade from version {start}"
        finally:
            for start in range(len(known)):
                await c.execute(f'DROP SCHEMA IF EXISTS "mig_from_{start}" CASCADE')
            await c.execute(f'DROP SCHEMA IF EXISTS "{fresh}" CASCADE')


async def test_ten_brokers_connecting_at_once_migrate_once() -> None:
    url = pg_url()
    try:
        brokers = await asyncio.gather(*(fairq.connect(url) for _ in range(10)))
        for b in brokers:
            await b.close()
        schema = parse_url(url).schema
        async with await psycopg.AsyncConnection.connect(
            f"{PG_SERVER}/{pg_database()}", autocommit=True
        ) as c:
            cur = await c.execute(f'SELECT version FROM "{schema}".migrations ORDER BY 1')
            assert [r[0] for r in await cur.fetchall()] == [m.version for m in migrate.migrations()]
    finally:
        drop_namespace(url)


async def test_a_broker_holds_at_most_pool_max_connections_and_none_after_close(
    url: str,
) -> None:
    """What a broker costs the server's max_connections: its pool (``pool_min`` to
    ``pool_max``) and, once it waited, the LISTEN connection; closing gives them all back.
    (The test suite shares one server: 51 brokers at up to 2 connections each took 99 of
    its 100.)"""
    async with await fairq.connect(f"{url}&pool_max=2") as b:
        q = await b.declare_queue("jobs")
        await asyncio.gather(*(q.send({"n": i}) for i in range(50)))
        assert len(await q.receive(max_messages=50)) == 50
        assert await q.receive(wait=0.3) == []  # a wait: the LISTEN connection is opened
        assert pg_connections() <= 2 + 1
    for _ in range(100):  # a backend leaves pg_stat_activity just after its client closed
        if pg_connections() == 0:
            break
        await asyncio.sleep(0.02)
    assert pg_connections() == 0, "a closed broker left connections open"


async def test_a_newer_schema_is_refused() -> None:
    url = pg_url()
    try:
        b = await fairq.connect(url)
        await b.close()
        schema = parse_url(url).schema
        with psycopg.connect(f"{PG_SERVER}/{pg_database()}", autocommit=True) as c:
            c.execute(f"INSERT INTO \"{schema}\".migrations VALUES (999, 'future', 0)")
        with pytest.raises(fairq.FairqError, match="newer fairq"):
            await fairq.connect(url)
    finally:
        drop_namespace(url)


async def test_migrate_off_refuses_an_unmigrated_schema() -> None:
    url = pg_url(migrate="off")
    try:
        with pytest.raises(fairq.FairqError, match="fairq migrate"):
            await fairq.connect(url)
    finally:
        drop_namespace(url)


# -- the clock -----------------------------------------------------------------------------
async def test_without_an_injected_clock_the_server_clock_decides() -> None:
    url = pg_url()
    try:
        b = await fairq.connect(url)
        backend = b.backend
        assert isinstance(backend, PostgresBackend)
        with psycopg.connect(f"{PG_SERVER}/{pg_database()}") as c:
            row = c.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()
        assert row is not None
        assert abs(b.clock.now() - row[0]) < 0.5
        await b.close()
        manual = fairq.ManualClock()
        b = await fairq.connect(url, clock=manual)
        assert b.clock is manual  # an injected clock is used as it is
        await b.close()
    finally:
        drop_namespace(url)


def test_fairq_migrate_command(tmp_path: object) -> None:
    import subprocess
    import sys

    url = pg_url()
    fairq_bin = str(Path(sys.executable).with_name("fairq"))
    cmd = [fairq_bin, "migrate", "--url", url]
    try:
        dry = subprocess.run([*cmd, "--dry-run"], capture_output=True, text=True, timeout=60)
        assert dry.returncode == 0, dry.stderr
        assert "CREATE TABLE" in dry.stdout and "COMMIT;" in dry.stdout
        schema = parse_url(url).schema
        with psycopg.connect(f"{PG_SERVER}/{pg_database()}") as c:
            row = c.execute("SELECT to_regnamespace(%s)", (schema,)).fetchone()
            assert row is not None and row[0] is None  # a dry run changes nothing
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert "applied 0001_queues" in done.stdout
        again = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        assert "up to date" in again.stdout
    finally:
        drop_namespace(url)


async def test_durable_leases_option_reaches_the_sessions() -> None:
    for flag, want in (("on", "on"), ("off", "")):
        url = pg_url(durable_leases=flag)
        try:
            async with await fairq.connect(url, clock=fairq.ManualClock()) as b:
                q = await b.declare_queue("d")
                await q.send(b"x")
                (m,) = await q.receive()
                await m.ack()
                backend = b.backend
                assert isinstance(backend, PostgresBackend)

                async def show(cur: object) -> str:
                    await cur.execute("SELECT current_setting('fairq.durable_leases', true)")  # type: ignore[attr-defined]
                    row = await cur.fetchone()  # type: ignore[attr-defined]
                    return str(row[0] or "")

                assert await backend.pool.run(show) == want
        finally:
            drop_namespace(url)


async def test_without_listen_waiters_poll_as_a_pooler_needs() -> None:
    """``?listen=off&prepare=off`` (PgBouncer in transaction mode): no LISTEN connection,
    no prepared statements; a waiting receiver in another broker still sees a send within
    a poll or two."""
    url = pg_url(listen="off", prepare="off", poll="0.05")
    try:
        async with await fairq.connect(url) as a, await fairq.connect(url) as b:
            q = await a.declare_queue("polled")
            waiting = asyncio.create_task(b.queue("polled").receive(wait=5))
            await asyncio.sleep(0.3)
            sent = time.monotonic()
            await q.send(b"x")
            got = await asyncio.wait_for(waiting, 5)
            assert [m.body for m in got] == [b"x"]
            assert time.monotonic() - sent < 0.5
            backend = b.backend
            assert isinstance(backend, PostgresBackend)
            assert not backend.listener.listening and backend.listener._task is None
            for _ in range(10):  # past psycopg's prepare threshold: nothing is prepared
                await q.send(b"y")
                (m,) = await q.receive()
                await m.ack()
    finally:
        drop_namespace(url)
