"""The dashboard in a real browser: Playwright for Python driving Debian's chromium
against a real ``fairq serve`` subprocess on a free loopback port.

Skipped when /usr/bin/chromium (or Playwright) is missing, unless
FAIRQ_REQUIRE_SERVICES=1 (CI), where that is a failure. ``make test`` installs chromium.
The screenshot goes to the test's tmp dir, and to docs/dashboard.png when that file is
missing or FAIRQ_SCREENSHOT=1.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from subprocs import free_port, running

DOCS = Path(__file__).resolve().parents[2] / "docs"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    """``fairq serve`` on SQLite, sampling every half second."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "fairq", "serve", "--port", str(port), "--sample-interval", "0.5"]
    env = {**os.environ, "FAIRQ_URL": "sqlite:///fairq.db", "FAIRQ_API_KEYS": ""}
    with running(cmd, f"{url}/healthz", cwd=tmp_path, env=env):
        yield url


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    yield pg
    context.close()
    assert not errors, f"JavaScript errors: {errors}"


def send(url: str, queue: str, *bodies: object) -> None:
    r = httpx.post(
        f"{url}/v1/queues/{queue}/messages", json={"messages": [{"body": b} for b in bodies]}
    )
    r.raise_for_status()


def test_the_queue_table_follows_a_send(server: str, page: Any) -> None:
    httpx.put(f"{server}/v1/queues/tickets", json={"freshness_slo": 60}).raise_for_status()
    page.goto(server + "/")
    cell = page.locator('tr[data-queue="tickets"] td[data-col="visible"]')
    cell.wait_for()
    assert cell.inner_text() == "0"
    send(server, "tickets", {"order": "o-1"}, {"order": "o-2"}, {"order": "o-3"})
    page.wait_for_function(
        """() => document.querySelector('tr[data-queue="tickets"] td[data-col="visible"]')
                   ?.textContent === "3" """,
        timeout=5000,
    )
    assert page.locator('tr[data-queue="tickets.dlq"]').count() == 1
    assert "live" in page.locator("#live").inner_text()


def test_redrive_a_dead_letter_by_clicking(server: str, page: Any) -> None:
    httpx.put(f"{server}/v1/queues/pdf", json={"max_attempts": 1}).raise_for_status()
    send(server, "pdf", {"order": "o-9"})
    got = httpx.post(f"{server}/v1/queues/pdf/receive", json={}).json()["messages"]
    httpx.post(f"{server}/v1/queues/pdf/nack", json={"receipt": got[0]["receipt"]})
    page.goto(server + "/#/queue/pdf")
    row = page.locator("#dlq-table tr[data-message]")
    row.first.wait_for(timeout=5000)
    assert row.count() == 1 and "max_attempts" in row.first.inner_text()
    assert '{"order":"o-9"}' in row.first.inner_text()
    page.locator("#redrive").click()
    page.locator("#redrive-result").filter(has_text="moved 1 message").wait_for(timeout=5000)
    page.locator("#dlq-empty").wait_for(timeout=5000)
    page.wait_for_function(
        """() => document.querySelector('[data-card="visible"] .value')?.textContent === "1" """,
        timeout=5000,
    )
    stats = httpx.get(f"{server}/v1/queues/pdf").json()["stats"]
    assert stats["visible"] == 1
    assert httpx.get(f"{server}/v1/queues/pdf.dlq").json()["stats"]["visible"] == 0


def test_screenshot_of_a_busy_dashboard(server: str, page: Any, tmp_path: Path) -> None:
    httpx.put(f"{server}/v1/queues/ticket-pdf", json={"freshness_slo": 1}).raise_for_status()
    httpx.put(f"{server}/v1/queues/emails").raise_for_status()
    httpx.put(f"{server}/v1/topics/order-events").raise_for_status()
    httpx.put(
        f"{server}/v1/topics/order-events/subscriptions/sms",
        json={"filter": {"channel": ["sms"]}, "routing": "order.#"},
    ).raise_for_status()
    httpx.put(f"{server}/v1/attention/marketplace").raise_for_status()
    for i in range(3):
        send(server, "ticket-pdf", *({"order": f"o-{i}-{n}"} for n in range(20)))
        send(server, "emails", *(f"mail {n}" for n in range(7)))
        got = httpx.post(f"{server}/v1/queues/ticket-pdf/receive", json={"max_messages": 12})
        receipts = [m["receipt"] for m in got.json()["messages"]]
        httpx.post(f"{server}/v1/queues/ticket-pdf/ack", json={"receipts": receipts[:9]})
        httpx.post(
            f"{server}/v1/attention/marketplace/keys/store-{i}/messages",
            json={"messages": [{"body": n} for n in range(5 * (i + 1))]},
        )
        time.sleep(0.6)
    page.goto(server + "/")
    page.locator('tr[data-queue="ticket-pdf"].breach').wait_for(timeout=5000)
    page.wait_for_function(
        """() => document.querySelector('tr[data-queue="ticket-pdf"] td[data-col="send_rate"]')
                   ?.textContent !== "–" """,
        timeout=5000,
    )
    shot = tmp_path / "dashboard.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
    target = DOCS / "dashboard.png"
    if os.environ.get("FAIRQ_SCREENSHOT") == "1" or not target.exists():
        shutil.copy(shot, target)
    page.goto(server + "/#/queue/ticket-pdf")
    page.locator("#chart-depth canvas").wait_for(timeout=5000)
    page.goto(server + "/#/attention")
    page.locator('[data-domain="marketplace"] tr[data-key="store-2"]').wait_for(timeout=5000)
    tenants = page.locator('[data-domain="marketplace"] [data-table="tenants"]')
    tenants.locator('tr[data-tenant="store-2"]').wait_for(timeout=5000)  # its backlog: 15
    page.goto(server + "/#/topics")
    page.locator('[data-topic="order-events"] tr[data-subscription="sms"]').wait_for(timeout=5000)


def test_waiting_rooms_tab(server: str, page: Any, tmp_path: Path) -> None:
    pytest.importorskip("jwt")
    import fairq

    with fairq.connect_sync(f"sqlite:///{tmp_path / 'fairq.db'}") as broker:
        room = broker.waiting_room("ev-88", admit_rate=50.0)
        for fan in ("ana", "bo", "cy"):
            room.join(fan)
    page.goto(server + "/#/rooms")
    cell = page.locator('tr[data-room="ev-88"] td[data-col="waiting"]')
    cell.wait_for(timeout=5000)
    assert cell.inner_text() == "3"
    page.locator('tr[data-room="ev-88"] a').click()
    page.wait_for_url("**/rooms/ev-88")
