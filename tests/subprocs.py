"""Servers as subprocesses for the tests: a free loopback port, and a process that is
waited for until it answers and stopped with SIGTERM at the end (``tests/`` is on the
import path through its conftest, so any test folder can ``from subprocs import ...``).
"""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from typing import Any

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def running(
    cmd: Sequence[str], ready_url: str, timeout: float = 20.0, **popen: Any
) -> Iterator[subprocess.Popen[Any]]:
    """Start ``cmd`` (stdout and stderr into ``proc.stdout``); wait until ``ready_url``
    answers 200; SIGTERM it at the end (then kill after 10 s)."""
    proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **popen)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if httpx.get(ready_url, timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise AssertionError(f"{list(cmd)} did not start: {proc.communicate()[0]!r}")
            time.sleep(0.05)
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
