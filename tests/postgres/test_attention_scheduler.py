"""The attention scheduler on PostgreSQL (migration 8): the next tenant is one probe of the
partial index however many tenants wait, the cheap look reads without writing, a schema
of version 7 with attention domains is upgraded and goes on serving them, and the
tenants' stats over HTTP."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

import fairq
from fairq.backends.postgres import migrate
from fairq.model.attention import SignalHint


async def _raw(url: str) -> psycopg.AsyncConnection[Any]:
    from fairq.backends.postgres.connection import parse_url

    return await psycopg.AsyncConnection.connect(parse_url(url).conninfo, autocommit=True)


def _schema(url: str) -> str:
    from fairq.backends.postgres.connection import parse_url

    return '"' + parse_url(url).schema + '"'


async def test_the_next_tenant_is_an_index_probe_among_many(url: str) -> None:
    """20,000 tenants with a ready signal each: att_pick reads the tenants through the
    partial index (vt, turn, since), never by a scan of them, and picks the least vt."""
    async with await fairq.connect(url) as broker:
        await broker.declare_attention("many")
    s = _schema(url)
    async with await _raw(url) as c:
        (dom,) = await (await c.execute(f"SELECT id FROM {s}.att_domains")).fetchone()  # type: ignore[misc]
        await c.execute(
            f"INSERT INTO {s}.att_signals (domain_id, tenant, key, due, ready) "
            "SELECT %s, 't' || i, 'k' || i, 0, true FROM generate_series(1, 20000) i",
            (dom,),
        )
        await c.execute(
            f"INSERT INTO {s}.att_tenants (domain_id, tenant, ready, since, vt, turn) "
            f"SELECT %s, tenant, 1, id, 1000 + (id * 7919) %% 20000, 0 FROM {s}.att_signals",
            (dom,),
        )
        await c.execute(f"UPDATE {s}.att_tenants SET vt = 3.5 WHERE tenant = 't777'")
        await c.execute(f"ANALYZE {s}.att_tenants")
        await c.execute(f"ANALYZE {s}.att_signals")
        # pg_stat_xact_* holds the counts not yet reported (of earlier statements too):
        # what att_pick adds is the difference
        scans = "SELECT seq_scan, idx_scan FROM pg_stat_xact_user_tables WHERE relid = %s::regclass"
        async with c.transaction(force_rollback=True):
            before = await (await c.execute(scans, (f"{s}.att_tenants",))).fetchone()
            row = await (
                await c.execute(f"SELECT * FROM {s}.att_pick(%s, 0, 51)", (dom,))
            ).fetchone()
            assert row is not None and row[0] == "t777" and row[6] == "k777"
            after = await (await c.execute(scans, (f"{s}.att_tenants",))).fetchone()
            assert before is not None and after is not None
            seq, idx = after[0] - before[0], after[1] - before[1]
            assert seq == 0 and idx >= 1, f"att_tenants: {seq} scans, {idx} index probes"


async def test_the_cheap_look_reads_without_writing(url: str) -> None:
    clock = fairq.ManualClock(1000.0)
    async with await fairq.connect(url, clock=clock) as broker:
        a = await broker.declare_attention("look", plans={"basic": fairq.Plan(1, 5, 20.0)})
        backend = broker.backend
        assert await backend.attention_next("look") == SignalHint(False, None)
        await a.publish("k", b"x", delay=5.0)  # a delayed message: a delayed signal
        hint = await backend.attention_next("look")
        assert hint is not None and not hint.ready and hint.due == pytest.approx(1005.0)
        assert backend.attention_scheduled_here("look", hint.due), "this broker wrote it"
        async with await fairq.connect(url, clock=clock) as other:
            assert not other.backend.attention_scheduled_here("look", hint.due)
        clock.advance(5.0)
        s = await a._take(0)
        assert s is not None and s.key == "k"
        hint = await backend.attention_next("look")
        assert (
            hint is not None and not hint.ready and hint.due == pytest.approx(1035.0)
        )  # the slice lease ends
        assert (await backend.attention_next("none")).ready, "the take will say it is not there"


async def test_a_version_7_schema_is_upgraded_with_its_attention_domains(url: str) -> None:
    """Migration 8 adds the virtual times, estimates, slice charges and usage history to
    a schema that has keys and signals already; they are served after the upgrade."""
    async with await fairq.connect(url) as broker:
        a = await broker.declare_attention("market", plans={"basic": fairq.Plan(1, 5, 20.0)})
        await a.set_resource("k1", tenant="t1")
        await a.publish_batch("k1", [fairq.Outgoing(b"x") for _ in range(3)])
        await a.publish("k2", b"y")
    s = _schema(url)
    async with await _raw(url) as c:  # make it what migration 7 left
        for fn in (
            "att_begin(text, float8, bool)",
            "att_sweep(int, float8)",
            "att_pick(int, float8, int)",
        ):
            await c.execute(f"DROP FUNCTION {s}.{fn}")
        for fn in (
            "att_ready(int, text, bigint, int)",
            "att_served(int, text, float8, float8)",
            "att_charge(int, text, float8, float8, float8, bigint, float8, bigint)",
            "att_visible(int, int, float8)",
            "att_receive(text, text, float8, int, float8)",
            "att_decided(int, text, float8, float8, text, float8, float8, text, text, text, "
            "text, bool, int, int, float8, float8, float8)",
        ):
            await c.execute(f"DROP FUNCTION {s}.{fn}")
        await c.execute(f"DROP TABLE {s}.att_usage")
        await c.execute(f"DROP INDEX {s}.att_tenants_vt")
        await c.execute(
            f"ALTER TABLE {s}.att_domains DROP COLUMN vclock, DROP COLUMN estimate; "
            f"ALTER TABLE {s}.att_tenants DROP COLUMN vt, DROP COLUMN estimate; "
            f"ALTER TABLE {s}.att_slices DROP COLUMN tenant, DROP COLUMN charged, "
            "DROP COLUMN taken_at"
        )
        await c.execute(
            f"CREATE INDEX att_tenants_turn ON {s}.att_tenants (domain_id, turn, since) "
            "WHERE ready > 0"
        )
        # and what migration 9 added (it rebuilds the messages table, so it runs again)
        await c.execute(f"DROP TABLE {s}.leases")
        await c.execute(f"ALTER TABLE {s}.counts DROP COLUMN hot")
        for fn in (
            "hot_limit()",
            "bump_hot(int, bigint)",
            f"park({s}.queues, float8, bool)",
            "ack_batch(text, float8, bigint[], bigint[])",
        ):
            await c.execute(f"DROP FUNCTION {s}.{fn}")
        # and migration 10's one-call take and end
        for fn in (
            "att_take(text, float8, bool, text)",
            "att_next_permit(float8, float8, jsonb)",
            "att_signal(int, text, text, float8, float8)",
            "att_end(text, text, int, float8, float8, bool)",
            "att_end_slice(int, text, int, float8, float8, bool)",
            "att_next_estimate(float8, float8)",
            "att_plan(jsonb, text)",
        ):
            await c.execute(f"DROP FUNCTION {s}.{fn}")
        await c.execute(f"DELETE FROM {s}.migrations WHERE version >= 8")
        pending = await migrate.pending(c, _schema(url).strip('"'))
        # 8, 9, 10 again, and every later one (they replace functions: running them anew
        # over the rebuilt tables is what an upgrade from version 7 does)
        assert [m.version for m in pending] == list(range(8, len(migrate.migrations()) + 1))
    async with await fairq.connect(url) as broker:
        a = broker.attention("market")
        assert (await a.stats()).signals_pending == 2
        served = []
        while (sl := await a._take(0)) is not None:
            msgs, _ = await a._receive(sl, 5, None)
            for m in msgs:
                await m.ack()
            await a._end(sl, len(msgs), None)
            served.append((sl.key, len(msgs)))
        assert sorted(served) == [("k1", 3), ("k2", 1)]
        assert {t.tenant: t.messages for t in await a.tenant_stats()} == {"t1": 3, "k2": 1}


async def test_tenants_over_http_on_postgres(url: str) -> None:
    import httpx

    from fairq.http import create_app

    async with await fairq.connect(url) as broker:
        app = create_app(broker, allowed_hosts=["fairq"])
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://fairq"
            ) as api,
        ):
            await _tenants_over_http(broker, api)


async def _tenants_over_http(broker: fairq.Broker, api: Any) -> None:
    if True:
        r = await api.put(
            "/v1/attention/shared",
            json={
                "plans": {"basic": {"max_messages": 5}, "gold": {"max_messages": 5, "weight": 2}},
                "charge": "messages",
            },
        )
        assert r.status_code == 200, r.text
        assert r.json()["config"]["plans"]["gold"]["weight"] == 2
        for key, tenant in (("k1", "acme"), ("k2", "acme"), ("k3", "zeta")):
            await api.patch(f"/v1/attention/shared/keys/{key}", json={"tenant": tenant})
            await api.post(
                f"/v1/attention/shared/keys/{key}/messages", json={"messages": [{"body": 1}]}
            )
        held = await broker.attention("shared")._take(0)  # acme's k1 or zeta's k3 runs
        assert held is not None
        r = await api.get("/v1/attention/shared/tenants", params={"top": 5})
        assert r.status_code == 200, r.text
        rows = {t["tenant"]: t for t in r.json()["tenants"]}
        assert rows["acme"]["backlog"] == 2 and rows["zeta"]["backlog"] == 1
        capped = "zeta" if held.key == "k3" else None
        assert {t for t, row in rows.items() if row["at_cap"]} == ({capped} if capped else set())
        metrics = (await api.get("/metrics")).text
        assert 'fairq_attention_tenant_share{domain="shared",tenant="acme"}' in metrics
