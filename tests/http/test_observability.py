"""``/metrics``, ``/healthz``, the stats sampler (rates, Little's law, history), the
overview, the OpenAPI document and its reference page, and the one error table."""

from __future__ import annotations

import asyncio
import inspect
import re
from pathlib import Path

import pytest
from httpsupport import serving
from prometheus_client.parser import text_string_to_metric_families

import fairq
import fairq.errors
from fairq.http import api as api_module
from fairq.http import errors as http_errors
from fairq.http.openapi import markdown, openapi
from fairq.http.sampler import Sampler

ROOT = Path(__file__).resolve().parents[2]


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


async def test_metrics_read_fresh_stats_at_each_scrape() -> None:
    clock = fairq.ManualClock()
    broker = await fairq.connect("memory://", clock=clock)
    async with serving(broker) as s:
        api = s.http
        await api.put("/v1/queues/jobs", json={"freshness_slo": 10})
        await api.post("/v1/queues/jobs/messages", json={"messages": [{"body": 1}, {"body": 2}]})
        await api.post("/v1/queues/jobs/receive", json={})
        await api.put("/v1/topics/t")
        await api.put("/v1/topics/t/subscriptions/s")
        await api.post("/v1/topics/t/messages", json={"messages": [{"body": 1}]})
        await api.put("/v1/attention/market")
        await api.post("/v1/attention/market/keys/k/messages", json={"messages": [{"body": 1}]})
        await api.patch("/v1/attention/market/keys/gone", json={"state": "disabled"})
        r = await api.get("/metrics")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
        m = samples(r.text)
        q = (("queue", "jobs"),)
        assert m[("fairq_queue_visible", q)] == 1
        assert m[("fairq_queue_in_flight", q)] == 1
        assert m[("fairq_queue_delayed", q)] == 0
        assert m[("fairq_queue_sent_total", q)] == 2
        assert m[("fairq_queue_freshness_slo_seconds", q)] == 10
        assert m[("fairq_queue_freshness_breach", q)] == 0
        assert m[("fairq_topic_published_total", (("topic", "t"),))] == 1
        assert m[("fairq_topic_copies_total", (("topic", "t"),))] == 1
        assert m[("fairq_topic_subscriptions", (("topic", "t"),))] == 1
        assert m[("fairq_attention_signals_pending", (("domain", "market"),))] == 1
        assert m[("fairq_attention_keys", (("domain", "market"),))] == 2
        hist = [k for k in m if k[0] == "fairq_http_request_duration_seconds_count"]
        routes = {dict(labels)["route"] for _, labels in hist}
        assert "/v1/queues/{queue}/messages" in routes, "labelled by route template"
        assert not any("jobs" in r for r in routes)
        for i in range(5):  # made-up methods share one label value: no series without end
            await api.request(f"X{i}", "/healthz")
        m = samples((await api.get("/metrics")).text)
        methods = {
            dict(labels)["method"]
            for name, labels in m
            if name == "fairq_http_request_duration_seconds_count"
        }
        assert "other" in methods and not any(x.startswith("X") for x in methods), methods
        assert m[("fairq_queues", ())] == m[("fairq_queues_read", ())] >= 2  # all with series

        clock.advance(11)  # the oldest message is now older than the SLO
        m = samples((await api.get("/metrics")).text)
        assert m[("fairq_queue_freshness_breach", q)] == 1
        assert m[("fairq_queue_oldest_age_seconds", q)] >= 11
    await broker.close()


async def test_metrics_say_how_many_queues_have_no_series() -> None:
    broker = await fairq.connect("memory://")
    for name in ("a", "b", "c"):
        await broker.declare_queue(name, dead_letter=None)
    async with serving(broker, max_sampled_queues=2) as s:
        m = samples((await s.http.get("/metrics")).text)
        assert (m[("fairq_queues", ())], m[("fairq_queues_read", ())]) == (3, 2)
        assert ("fairq_queue_visible", (("queue", "c"),)) not in m
    await broker.close()


async def test_healthz() -> None:
    async with serving() as s:
        r = await s.http.get("/healthz")
        assert r.json() == {"status": "ok", "backend": "memory://"}


async def test_healthz_answers_503_soon_when_the_backend_hangs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An engine that does not answer (PostgreSQL waiting out its 30 s timeout) makes the
    probe answer 503 after HEALTH_TIMEOUT, not hang with it."""
    from fairq.http import api

    monkeypatch.setattr(api, "HEALTH_TIMEOUT", 0.2)
    async with serving() as s:

        async def hangs() -> None:
            await asyncio.sleep(30)

        monkeypatch.setattr(s.broker.backend, "ping", hangs)
        r = await asyncio.wait_for(s.http.get("/healthz"), 5)
        assert r.status_code == 503 and r.json()["error"] == "backend_unavailable"


async def test_sampler_measures_rates_and_littles_law() -> None:
    clock = fairq.ManualClock()
    broker = await fairq.connect("memory://", clock=clock)
    q = await broker.declare_queue("jobs")
    sampler = Sampler(broker, interval=2.0, keep=60.0, window=30.0)
    await sampler.fresh(record=True)
    assert sampler.rates("jobs") == (None, None, None, None), "one sample measures nothing"
    # 10 s: 100 sent (10/s), 50 acked (5/s), 20 in flight at the end
    await q.send_batch([fairq.Outgoing(i) for i in range(100)])
    got = await q.receive(70)
    await q.ack_batch([m.receipt for m in got[:50]])
    clock.advance(10)
    await sampler.fresh(record=True)
    send_rate, ack_rate, handling, workers = sampler.rates("jobs")
    assert send_rate == pytest.approx(10.0) and ack_rate == pytest.approx(5.0)
    # mean in flight over the window's samples: (0 + 20) / 2 = 10; W = 10 / 5 = 2 s
    assert handling == pytest.approx(2.0)
    assert workers == pytest.approx(20.0), "L = λW = 10/s × 2 s"
    history = sampler.history("jobs")
    assert history.visible == [0, 30] and history.in_flight == [0, 20]
    assert history.send_rate == [0.0, pytest.approx(10.0)]
    # the ring keeps `keep` seconds: old samples fall out
    for _ in range(40):
        clock.advance(2)
        await sampler.fresh(record=True)
    assert len(sampler.history("jobs").t) == 31
    await broker.close()


async def test_overview_and_history_endpoints() -> None:
    clock = fairq.ManualClock()
    broker = await fairq.connect("memory://", clock=clock)
    async with serving(broker, sample_interval=3600) as s:
        api = s.http
        await api.put("/v1/queues/jobs", json={"max_attempts": 1, "freshness_slo": 5})
        await api.post("/v1/queues/jobs/messages", json={"messages": [{"body": 1}, {"body": 2}]})
        got = (await api.post("/v1/queues/jobs/receive", json={})).json()["messages"]
        await api.post("/v1/queues/jobs/nack", json={"receipt": got[0]["receipt"]})
        clock.advance(6)
        ov = (await api.get("/v1/overview")).json()
        rows = {q["name"]: q for q in ov["queues"]}
        assert set(rows) == {"jobs", "jobs.dlq"}
        assert rows["jobs"]["dead_letter"] == "jobs.dlq" and rows["jobs"]["dlq_depth"] == 1
        assert rows["jobs"]["stats"]["breaching"] is True
        assert rows["jobs.dlq"]["is_dlq"] and not rows["jobs"]["is_dlq"]
        assert ov["total_queues"] == ov["sampled_queues"] == 2
        r = await api.get("/v1/queues/jobs/history")
        assert r.status_code == 200 and r.json()["queue"] == "jobs"
        assert (await api.get("/v1/queues/nope/history")).status_code == 404
    await broker.close()


def test_openapi_covers_every_route_and_nothing_else() -> None:
    doc = openapi()
    ops = {(m.upper(), p) for p, item in doc["paths"].items() for m in item}
    assert ops == {(r.method, r.path) for r in api_module.ROUTES}
    assert len({r.op for r in api_module.ROUTES}) == len(api_module.ROUTES)
    send = doc["components"]["schemas"]["SendRequest"]["properties"]
    assert send["messages"]["maxItems"] == 100 and send["timeout"]["maximum"] == 20
    assert "x-fairq-limit" not in str(doc)
    small = openapi(api_module.Limits(max_batch=7, max_wait=1.5))
    send = small["components"]["schemas"]["SendRequest"]["properties"]
    assert send["messages"]["maxItems"] == 7 and send["timeout"]["maximum"] == 1.5


def test_the_reference_page_is_generated_from_the_same_table() -> None:
    page = (ROOT / "docs" / "http-api.md").read_text()
    assert page == markdown(), "run: python -m fairq.http.openapi > docs/http-api.md"
    for r in api_module.ROUTES:
        assert f"`{r.method} {r.path}`" in page


def _subclasses(cls: type) -> set[type]:
    out = set()
    for sub in cls.__subclasses__():
        out |= {sub} | _subclasses(sub)
    return out


def test_every_fairq_error_maps_to_a_status_in_one_place() -> None:
    import fairq.idempotency
    import fairq.push

    errors = _subclasses(fairq.errors.FairqError)
    assert len(errors) >= 15
    server_side = {fairq.errors.BackendError, fairq.errors.ConnectionError}
    for cls in errors:
        if cls.__module__.startswith("fairq.http"):
            continue
        status, code = http_errors.error_for(cls.__new__(cls))
        assert re.fullmatch(r"[a-z_]+", code)
        if cls in server_side:
            assert status == 503, cls
        elif cls.__name__ == "PushFailed":
            assert status == 502
        else:
            assert 400 <= status < 500, f"{cls.__name__} is bad input, not {status}"
    assert http_errors.error_for(RuntimeError()).status == 500


def test_the_client_turns_codes_back_into_the_same_exceptions() -> None:
    for cls, (status, code) in http_errors.ERRORS.items():
        if not issubclass(cls, fairq.errors.FairqError) or cls is fairq.errors.FairqError:
            continue
        exc = http_errors.exception_from(status, code, "detail text")
        assert type(exc) is cls and str(exc) == "detail text"
    other = http_errors.exception_from(418, "teapot", "short and stout")
    assert isinstance(other, http_errors.RemoteError) and other.status == 418
    assert inspect.isclass(http_errors.RemoteError)


async def test_waiting_rooms_in_the_overview_the_metrics_and_their_pages() -> None:
    pytest.importorskip("jwt")
    broker = await fairq.connect("memory://")
    async with serving(broker) as s:
        room = await broker.waiting_room("ev-88", admit_rate=100.0)
        for fan in ("f1", "f2", "f3"):
            await room.join(fan)
        await room.admit(1)
        ov = (await s.http.get("/v1/overview")).json()
        (row,) = ov["rooms"]
        assert (row["name"], row["phase"], row["joined"], row["admitted"], row["waiting"]) == (
            "ev-88",
            "open",
            3,
            1,
            2,
        )
        m = samples((await s.http.get("/metrics")).text)
        r = (("room", "ev-88"),)
        assert m[("fairq_room_waiting", r)] == 2 and m[("fairq_room_joined_total", r)] == 3
        assert m[("fairq_room_sold_out", r)] == 0
        page = await s.http.get("/rooms/ev-88")
        assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    await broker.close()


async def test_metrics_of_tenants_keep_to_the_top_ten() -> None:
    clock = fairq.ManualClock()
    broker = await fairq.connect("memory://", clock=clock)
    a = await broker.declare_attention("market", plans={"basic": fairq.Plan(1, 5, 20.0)})
    for i in range(15):  # tenant t00 is served most, t14 least
        await a.set_resource(f"k{i}", tenant=f"t{i:02}")
        await a.publish_batch(f"k{i}", [fairq.Outgoing(b"x") for _ in range(20 - i)])
    for _ in range(15):
        s = await a._take(0)
        assert s is not None
        msgs, _ = await a._receive(s, 5, None)
        clock.advance(0.1 * (20 - int(s.key[1:])))
        for m in msgs:
            await m.ack()
        await a._end(s, len(msgs), None)
    await a.publish_batch("capped", [fairq.Outgoing(b"x") for _ in range(30)])
    await a.set_resource("capped", tenant="busy")
    held = await a._take(0)  # its one slice runs: the tenant is at its cap
    assert held is not None and held.key == "capped"
    async with serving(broker) as s:
        m = samples((await s.http.get("/metrics")).text)
    shares = {
        dict(k[1])["tenant"]: v for k, v in m.items() if k[0] == "fairq_attention_tenant_share"
    }
    assert len(shares) == 10, "label values: the top ten tenants of the domain"
    assert "t00" in shares and "t14" not in shares
    assert sum(shares.values()) <= 1.0
    assert m[("fairq_attention_tenants_at_cap", (("domain", "market"),))] == 1
    await broker.close()


async def test_littles_law_counts_failed_attempts_as_handlings() -> None:
    """A nacked or dead-lettered attempt held a worker as an acked one did: W is in flight
    over all handlings that ended, and each message needs its attempts (the review's
    10 % failing queue showed 0.068 s for 0.050 s and 13.6 workers for 12)."""
    clock = fairq.ManualClock()
    broker = await fairq.connect("memory://", clock=clock)
    q = await broker.declare_queue("jobs", max_attempts=2)
    sampler = Sampler(broker, interval=2.0, keep=60.0, window=30.0)
    await sampler.fresh(record=True)
    # 10 s: 100 sent; 40 acked, 10 nacked, 10 rejected (dead letters): 60 handlings ended
    # (6/s) of 50 messages finished (5/s): 1.2 attempts a message; 20 in flight at the end
    await q.send_batch([fairq.Outgoing(i) for i in range(100)])
    got = await q.receive(80)
    await q.ack_batch([m.receipt for m in got[:40]])
    for m in got[40:50]:
        await m.nack(delay=60)
    for m in got[50:60]:
        await m.dead_letter("bad")
    clock.advance(10)
    await sampler.fresh(record=True)
    send_rate, ack_rate, handling, workers = sampler.rates("jobs")
    assert (send_rate, ack_rate) == (pytest.approx(10.0), pytest.approx(4.0))
    # handlings ended: 40 + 10 + 10, less the nacks taken for last attempts (1 in
    # max_attempts: 5, here none were, but in a steady state they are): 5.5/s
    assert handling == pytest.approx(10 / 5.5), "mean in flight 10 over 5.5 handlings/s"
    assert workers == pytest.approx(10 * 10 / 5), "λ × in flight ÷ messages finished/s"
    await broker.close()


@pytest.mark.parametrize("dead_letter", ["jobs.dlq", None], ids=["dlq", "no dlq"])
async def test_a_last_attempts_nack_is_one_handling_and_one_finished_message(
    dead_letter: str | None,
) -> None:
    """With max_attempts=1 a failing handler's nack is also the message's dead letter (or,
    without a dead-letter queue, its discard): counted once, and finished either way."""
    clock = fairq.ManualClock()
    broker = await fairq.connect("memory://", clock=clock)
    q = await broker.declare_queue("jobs", max_attempts=1, dead_letter=dead_letter)
    sampler = Sampler(broker, interval=2.0, keep=60.0, window=30.0)
    await sampler.fresh(record=True)
    await q.send_batch([fairq.Outgoing(i) for i in range(100)])
    got = await q.receive(60)  # 40 acked, 10 nacked (their end), 10 in flight
    await q.ack_batch([m.receipt for m in got[:40]])
    for m in got[40:50]:
        await m.nack()
    clock.advance(10)
    await sampler.fresh(record=True)
    _, _, handling, workers = sampler.rates("jobs")
    assert handling == pytest.approx(5 / 5.0), "mean in flight 5 over 50 handlings in 10 s"
    assert workers == pytest.approx(10 * 5 / 5.0), "λ 10 × in flight 5 ÷ 5 finished/s"
    await broker.close()


async def test_the_queue_cap_takes_the_applications_queues_first() -> None:
    """With more queues than max_queues, the application's queues are sampled before
    dead-letter queues, and those before attention work queues (one a key: 500 keys filled
    the cap alone and a breaching queue named after them vanished from /metrics)."""
    async with await fairq.connect("memory://") as broker:
        market = await broker.declare_attention("market")
        for key in ("a-shop", "b-shop", "c-shop"):
            await market.publish(key, b"x")
        await broker.declare_queue("ticket-pdf", max_attempts=1)
        await broker.declare_queue("zz-mail")
        names = await broker.list_queues()  # each with its .dlq
        assert len(names) == 10
        sampler = Sampler(broker, max_queues=3)
        snapshot = await sampler.fresh()
        assert sorted(snapshot.stats) == ["ticket-pdf", "ticket-pdf.dlq", "zz-mail"]
        assert snapshot.total == 10
        assert (await sampler.order(names))[4:] == [
            "process.market.a-shop.work",
            "process.market.a-shop.work.dlq",
            "process.market.b-shop.work",
            "process.market.b-shop.work.dlq",
            "process.market.c-shop.work",
            "process.market.c-shop.work.dlq",
        ]
