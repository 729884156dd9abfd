"""Issue 15 against a real ``fairq serve`` subprocess on a free loopback port: each test
replays one defect an outside review found, as an attacker would send it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from fairq.http.nesting import MAX_DEPTH
from subprocs import free_port


@dataclass
class Served:
    """A running ``fairq serve``: its URL, and its output so far (stdout and stderr)."""

    url: str
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text()


@contextlib.contextmanager
def serve(cwd: Path, *args: str, env: dict[str, str] | None = None) -> Iterator[Served]:
    """``fairq serve`` on SQLite in ``cwd``, its output in a file (a pipe nobody reads
    could fill up and stall the server)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = cwd / f"serve-{port}.log"
    cmd = [sys.executable, "-m", "fairq", "serve", "--port", str(port), *args]
    full_env = {
        **os.environ,
        "FAIRQ_URL": f"sqlite:///{cwd / 'serve.db'}",
        "FAIRQ_API_KEYS": "",
        **(env or {}),
    }
    with log_path.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=cwd, env=full_env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise AssertionError(f"fairq serve did not start: {log_path.read_text()}")
            time.sleep(0.05)
        yield Served(url, log_path)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def open_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """``fairq serve`` without API keys (the default: open, on loopback)."""
    with serve(tmp_path_factory.mktemp("open")) as served:
        yield served


@pytest.fixture
def url(open_server: Served) -> str:
    return open_server.url


def no_traceback(served: Served) -> None:
    log = served.log()
    assert "Traceback" not in log, log[-3000:]


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


# -- defect 3: deep nesting ------------------------------------------------------------------
def test_deeply_nested_json_is_a_400_not_a_500(open_server: Served) -> None:
    url = open_server.url
    assert httpx.put(f"{url}/v1/queues/deep").status_code == 200
    # ~1.2 KB of brackets in a message body: msgspec's RecursionError was a 500
    r = httpx.post(
        f"{url}/v1/queues/deep/messages",
        content='{"messages": [{"body": ' + nested(1000) + "}]}",
        headers={"Content-Type": "application/json"},
    )
    assert r.status_code == 400, r.text
    assert r.json()["error"] == "bad_request" and str(MAX_DEPTH) in r.json()["detail"]
    # ~500 levels outside a body: the whole-number fallback recursed into a 500
    r = httpx.put(
        f"{url}/v1/queues/deep",
        content='{"max_attempts": 5.0, "dead_letter": ' + nested(600) + "}",
        headers={"Content-Type": "application/json"},
    )
    assert r.status_code == 400, r.text
    # a filter in the query string, as deep
    assert httpx.put(f"{url}/v1/topics/t").status_code == 200
    r = httpx.get(f"{url}/v1/topics/t/stream", params={"filter": '{"a": ' + nested(3000) + "}"})
    assert r.status_code == 400, r.text
    no_traceback(open_server)


def test_nesting_up_to_the_bound_still_works(url: str) -> None:
    assert httpx.put(f"{url}/v1/queues/nest").status_code == 200
    body = nested(MAX_DEPTH - 3)  # {"messages": [{"body": ...}]} adds three levels
    r = httpx.post(
        f"{url}/v1/queues/nest/messages",
        content='{"messages": [{"body": ' + body + "}]}",
        headers={"Content-Type": "application/json"},
    )
    assert r.status_code == 200, r.text
    got = httpx.post(f"{url}/v1/queues/nest/receive", json={}).json()["messages"]
    assert got[0]["body"] == body
