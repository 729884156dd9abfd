"""The browser tests' fixture: Debian's chromium driven by Playwright for Python (never a
downloaded browser). Skipped when /usr/bin/chromium (or Playwright) is missing, unless
FAIRQ_REQUIRE_SERVICES=1 (CI), where that is a failure. ``make test`` installs chromium.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from e2esupport import CHROMIUM, FLAGS, missing


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not os.path.exists(CHROMIUM):
        missing(CHROMIUM)
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing("playwright (pip install playwright)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        yield b
        b.close()
