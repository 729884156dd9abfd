"""``fairq serve --url amqp://...``: the REST API, the dashboard and /metrics on RabbitMQ."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from httpsupport import fairq_serve

from services import rabbit_vhost


@pytest.fixture
def amqp_url(tmp_path: Path) -> Iterator[str]:
    with rabbit_vhost() as vhost:
        yield f"amqp://guest:guest@127.0.0.1:5672/{vhost}?store=sqlite:///{tmp_path / 's.db'}"


def test_serve_on_rabbitmq(tmp_path: Path, amqp_url: str) -> None:
    with fairq_serve(tmp_path, "--url", amqp_url) as (base, _proc):
        health = httpx.get(f"{base}/healthz").json()
        assert health["status"] == "ok" and "guest:***@" in health["backend"]
        assert httpx.put(f"{base}/v1/queues/jobs", json={}).status_code in (200, 201)
        sent = httpx.post(
            f"{base}/v1/queues/jobs/messages", json={"messages": [{"body": "hi"}, {"body": 2}]}
        )
        assert sent.status_code in (200, 201), sent.text
        got = httpx.post(f"{base}/v1/queues/jobs/receive", json={"max_messages": 1}).json()
        (m,) = got["messages"]
        assert httpx.post(
            f"{base}/v1/queues/jobs/ack", json={"receipts": [m["receipt"]]}
        ).status_code in (200, 204)
        stats = httpx.get(f"{base}/v1/queues/jobs").json()["stats"]
        assert (stats["visible"], stats["in_flight"], stats["sent"]) == (1, 0, 2)
        assert stats["acked"] == 1
        metrics = httpx.get(f"{base}/metrics").text
        assert 'fairq_queue_visible{queue="jobs"} 1.0' in metrics
        assert httpx.get(f"{base}/").status_code == 200  # the dashboard
        peek = httpx.get(f"{base}/v1/queues/jobs/messages?limit=5")
        assert peek.status_code == 422 and peek.json()["error"] == "unsupported"


def test_serve_shows_attention_on_rabbitmq(tmp_path: Path, amqp_url: str) -> None:
    with fairq_serve(tmp_path, "--url", amqp_url) as (base, _proc):
        assert httpx.put(f"{base}/v1/attention/market", json={}).status_code in (200, 201)
        assert httpx.patch(
            f"{base}/v1/attention/market/keys/store-1", json={"tenant": "acme"}
        ).status_code in (200, 204)
        sent = httpx.post(
            f"{base}/v1/attention/market/keys/store-1/messages",
            json={"messages": [{"body": "a"}, {"body": "b"}]},
        )
        assert sent.status_code in (200, 201), sent.text
        info = httpx.get(f"{base}/v1/attention/market").json()
        assert info["queue"] == "attention.market.work"
        assert (info["stats"]["signals_pending"], info["stats"]["keys"]) == (1, 1)
        (key,) = httpx.get(f"{base}/v1/attention/market/keys").json()["keys"]
        assert (key["key"], key["tenant"], key["backlog"], key["pending"]) == (
            "store-1",
            "acme",
            2,
            1,
        )
        tenants = httpx.get(f"{base}/v1/attention/market/tenants").json()["tenants"]
        assert [(t["tenant"], t["backlog"]) for t in tenants] == [("acme", 2)]
        work = httpx.get(f"{base}/v1/queues/process.market.store-1.work").json()["stats"]
        assert work["visible"] == 2, "the work is in RabbitMQ"
        for _ in range(50):  # the dashboard's sampler lists the queues now and then
            overview = httpx.get(f"{base}/v1/overview").json()
            if overview["queues"]:
                break
            time.sleep(0.1)
        (domain,) = overview["attention"]
        assert domain["name"] == "market" and domain["keys"][0]["backlog"] == 2
        assert domain["tenants"][0]["tenant"] == "acme"
        names = [q["name"] for q in overview["queues"]]
        assert "process.market.store-1.work" in names
        assert not [n for n in names if n.startswith("fairq:")], "tickets are not queues to show"
        metrics = httpx.get(f"{base}/metrics").text
        assert 'fairq_attention_signals_pending{domain="market"} 1.0' in metrics
        assert 'fairq_attention_tenant_backlog{domain="market",tenant="acme"} 2.0' in metrics
