"""The waiting room's page in a real browser: Playwright for Python driving Debian's
chromium against the rooms app served by uvicorn in a subprocess, on a SQLite file the
test shares to move the line (admit, sell out).

A fan opens ``/rooms/ev-88``, is put in line by the page itself, sees its position, then
"you're in" with a link that carries nothing but the target (the token is in an HttpOnly
cookie); another fan waiting sees "sold out" within one refresh interval of the sell-out.
Skipped when /usr/bin/chromium (or Playwright) is missing, unless
FAIRQ_REQUIRE_SERVICES=1 (CI), where that is a failure.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import fairq
from subprocs import free_port, running

REFRESH = (0.3, 1.0)  # the page's refresh interval bounds in this test (seconds)
SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "waitingroom.png"

_SERVE = """
import sys, uvicorn
from fairq.http.rooms import rooms_app
app = rooms_app(url=sys.argv[1], target="/buy", refresh_bounds=(0.3, 1.0))
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
"""


_WATCH_STATUS = """() => {
  window.__answers = [];
  const fetch = window.fetch;
  window.fetch = async (...args) => {
    const response = await fetch(...args);
    const body = await response.clone().json();
    window.__answers.push([performance.now(), body.state]);
    return response;
  };
}"""


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """The rooms app on a SQLite file; (its URL, the file's URL)."""
    db = f"sqlite:///{tmp_path / 'rooms.db'}"
    with fairq.connect_sync(db) as broker:
        broker.waiting_room("ev-88", admit_rate=100)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with running([sys.executable, "-c", _SERVE, db, str(port)], f"{url}/rooms/ev-88/jwks.json"):
        yield url, db


def _page(browser: Any) -> tuple[Any, Any, list[str]]:
    context = browser.new_context(viewport={"width": 720, "height": 560})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    return context, page, errors


def test_the_page_goes_from_a_position_to_you_are_in(browser: Any, served: tuple[str, str]) -> None:
    url, db = served
    with fairq.connect_sync(db) as broker:
        room = broker.room("ev-88")
        room.join_many([f"crowd-{i}" for i in range(5)])
        context, page, errors = _page(browser)
        try:
            page.goto(f"{url}/rooms/ev-88")
            position = page.locator("#position")
            position.wait_for(state="visible", timeout=10_000)
            assert position.inner_text() == "5"
            assert "fans ahead of you" in page.locator("#ahead").inner_text()
            bar = page.locator("[role=progressbar]")
            assert bar.get_attribute("aria-valuenow") == "0"
            room.admit(3)
            page.wait_for_function(
                "document.getElementById('position').textContent === '2'", timeout=5_000
            )
            assert float(bar.get_attribute("aria-valuenow") or 0) == pytest.approx(60, abs=1)
            page.wait_for_timeout(700)  # the bar's transition
            if not SCREENSHOT.exists() or os.environ.get("FAIRQ_SCREENSHOT") == "1":
                page.set_viewport_size({"width": 720, "height": 560})
                page.screenshot(path=str(SCREENSHOT))
            room.admit(3)
            link = page.locator("#continue")
            link.wait_for(state="visible", timeout=5_000)
            assert "You're in!" in page.locator("#admitted").inner_text()
            href = link.get_attribute("href")
            assert href == "/buy", href  # nothing but the target: no token in any URL
            cookies = {c["name"]: c for c in context.cookies()}
            token = cookies["fairq_admission"]["value"]
            assert cookies["fairq_admission"]["httpOnly"] is True
            assert room.verify(token)["room"] == "ev-88"
            assert token not in page.content()
            # a reload renders "you're in" on the server side too
            page.reload()
            assert page.locator("#admitted").is_visible()
        finally:
            context.close()
        assert not errors, f"JavaScript errors: {errors}"


def test_a_waiting_fan_sees_sold_out_within_one_refresh(
    browser: Any, served: tuple[str, str]
) -> None:
    url, db = served
    with fairq.connect_sync(db) as broker:
        room = broker.room("ev-88")
        room.join_many([f"crowd-{i}" for i in range(50)])
        context, page, errors = _page(browser)
        try:
            page.goto(f"{url}/rooms/ev-88")
            page.locator("#position").wait_for(state="visible", timeout=10_000)
            assert page.locator("#position").inner_text() == "50"
            refresh = float(page.locator("#room").get_attribute("data-refresh") or 0)
            assert 0 < refresh <= REFRESH[1]
            # the page's own clock: when each status answer came, and what it said
            page.evaluate(_WATCH_STATUS)
            room.sold_out()
            told = page.evaluate("() => performance.now()")
            page.locator("#soldout").wait_for(state="visible", timeout=10_000)
            answers = page.evaluate("() => window.__answers")
            first = min(at for at, state in answers if state == "sold_out")
            # within one refresh interval (jittered downwards only), plus the request itself
            took = (first - told) / 1000
            assert took <= REFRESH[1] + 0.2, (took, told, answers)
            assert "Sold out" in page.locator("#soldout").inner_text()
            assert not page.locator("#refresh-note").is_visible()  # nothing more to wait for
            # a fan arriving now is told at once
            late_context, late, late_errors = _page(browser)
            try:
                late.goto(f"{url}/rooms/ev-88")
                late.locator("#soldout").wait_for(state="visible", timeout=5_000)
            finally:
                late_context.close()
            assert not late_errors
        finally:
            context.close()
        assert not errors, f"JavaScript errors: {errors}"
