"""Helpers of the browser tests: Debian's chromium and its flags, and servers started as
subprocesses on free loopback ports (the ``browser`` fixture is in conftest.py)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from typing import Any

import httpx
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def running(cmd: Sequence[str], ready_url: str, **popen: Any) -> Iterator[subprocess.Popen[bytes]]:
    """Start ``cmd``; wait until ``ready_url`` answers 200; SIGTERM it at the end."""
    proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **popen)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                if httpx.get(ready_url, timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, f"{cmd} did not start"
            time.sleep(0.05)
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
