"""The servers the HTTP benchmarks start as subprocesses: a free loopback port, and a
process waited for until it accepts connections (and, given a health path, answers 200
there), stopped with SIGTERM at the end."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextmanager
def served(
    cmd: Sequence[str],
    port: int,
    cwd: Path,
    env: dict[str, str] | None = None,
    health: str | None = None,
    timeout: float = 30.0,
) -> Iterator[str]:
    """Run ``cmd`` (a server on ``port``) until the block ends; its base URL once ready."""
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        list(cmd), cwd=cwd, env={**os.environ, **(env or {})}, stdout=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + timeout
        while not _ready(port, None if health is None else url + health):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"server did not start: {list(cmd)}")
            time.sleep(0.05)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _ready(port: int, health_url: str | None) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            pass
        return health_url is None or httpx.get(health_url, timeout=1).status_code == 200
    except (OSError, httpx.TransportError):
        return False
