"""Helpers of the browser tests: Debian's chromium and its flags (the ``browser`` fixture
is in conftest.py; servers start through ``tests/subprocs.py``)."""

from __future__ import annotations

import os

import pytest

CHROMIUM = "/usr/bin/chromium"
# what this machine needs (root: no sandbox; no network but loopback), and full-speed
# timers for pages in background contexts sharing one browser
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-background-timer-throttling",
    "--disable-renderer-backgrounding",
    "--disable-backgrounding-occluded-windows",
]


def missing(what: str) -> None:
    if os.environ.get("FAIRQ_REQUIRE_SERVICES") == "1":
        pytest.fail(f"{what} is missing and FAIRQ_REQUIRE_SERVICES=1 (make test installs it)")
    pytest.skip(f"{what} is missing (make test installs it)")
