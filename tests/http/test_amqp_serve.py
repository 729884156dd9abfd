"""``fairq serve --url amqp://...``: the REST API, the dashboard and /metrics on RabbitMQ."""

from __future__ import annotations

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
