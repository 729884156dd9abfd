"""The dashboard of a server with API keys, in a real browser (Debian's chromium driven by
Playwright): log in, see the queues, redrive by clicking, log out — through the Host and
Origin checks and the signed session cookie (issue 15), as a user would."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from subprocs import free_port, running

ADMIN = "e2e-admin-key-0123456789"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "fairq", "serve", "--port", str(port), "--sample-interval", "0.5"]
    env = {**os.environ, "FAIRQ_URL": "sqlite:///fairq.db", "FAIRQ_API_KEYS": f"{ADMIN}:admin"}
    with running(cmd, f"{url}/healthz", cwd=tmp_path, env=env):
        yield url


def test_log_in_redrive_and_log_out(server: str, browser: Any) -> None:
    auth = {"Authorization": f"Bearer {ADMIN}"}
    httpx.put(f"{server}/v1/queues/pdf", json={"max_attempts": 1}, headers=auth)
    httpx.post(
        f"{server}/v1/queues/pdf/messages", json={"messages": [{"body": "o-1"}]}, headers=auth
    ).raise_for_status()
    got = httpx.post(f"{server}/v1/queues/pdf/receive", json={}, headers=auth).json()
    httpx.post(
        f"{server}/v1/queues/pdf/nack",
        json={"receipt": got["messages"][0]["receipt"]},
        headers=auth,
    ).raise_for_status()

    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        page.goto(server + "/")
        page.wait_for_url("**/login")
        page.fill("#key", ADMIN)
        page.click("button[type=submit]")
        page.wait_for_url(server + "/")
        cookie = {c["name"]: c for c in context.cookies()}["fairq_session"]
        assert ADMIN not in cookie["value"] and cookie["httpOnly"] is True
        assert cookie["sameSite"] == "Strict"
        page.locator('tr[data-queue="pdf.dlq"]').wait_for(timeout=5000)

        page.goto(server + "/#/queue/pdf")
        page.locator("#dlq-table tr[data-message]").first.wait_for(timeout=5000)
        page.locator("#redrive").click()  # a same-origin POST with the session cookie
        page.locator("#redrive-result").filter(has_text="moved 1 message").wait_for(timeout=5000)
        stats = httpx.get(f"{server}/v1/queues/pdf", headers=auth).json()["stats"]
        assert stats["visible"] == 1

        page.locator("#logout button").click()
        page.wait_for_url("**/login")
        r = httpx.get(f"{server}/v1/overview", cookies={"fairq_session": cookie["value"]})
        assert r.status_code == 401, "logging out ends the session on the server"
    finally:
        context.close()
    assert not errors, f"JavaScript errors: {errors}"
