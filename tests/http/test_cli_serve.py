"""``fairq serve`` and the CLI's ``--server`` option, as subprocesses."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from httpsupport import ADMIN, fairq_serve, free_port


def fairq(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fairq", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
    )


def test_send_receive_stats_through_a_server(tmp_path: Path) -> None:
    with fairq_serve(tmp_path) as (url, proc):
        env = {"FAIRQ_SERVER": url, "FAIRQ_URL": "sqlite:///elsewhere.db"}
        out = fairq(
            "send", "jobs", '{"order": "o-1"}', "--attr", "channel=sms", cwd=tmp_path, env=env
        )
        assert out.returncode == 0, out.stderr
        assert re.fullmatch(r"[0-9a-f]{16}\n", out.stdout)
        assert (
            fairq("send", "jobs", "copy", "--count", "150", cwd=tmp_path, env=env).returncode == 0
        )
        stats = fairq("stats", cwd=tmp_path, env=env)
        assert re.search(r"jobs\s+│\s+151\s", stats.stdout), stats.stdout + stats.stderr
        assert url in stats.stdout
        got = fairq("receive", "jobs", "--max", "1", cwd=tmp_path, env=env)
        assert "o-1" in got.stdout and "channel=sms" in got.stdout
        missing = fairq("receive", "nope", "--server", url, cwd=tmp_path)
        assert missing.returncode == 1 and "does not exist" in missing.stderr
        assert not (tmp_path / "elsewhere.db").exists(), "--server never opens --url"
        info = httpx.get(f"{url}/v1/queues/jobs").json()["stats"]
        assert info["visible"] == 150 and info["acked"] == 1
        page = httpx.get(url + "/")
        assert page.status_code == 200 and "fairq" in page.text
    assert proc.stdout is not None
    log = proc.stdout.read()
    assert "Application shutdown complete" in log, "SIGTERM shuts the server down cleanly"
    assert "Traceback" not in log


def test_serve_refuses_an_open_non_loopback_address(tmp_path: Path) -> None:
    out = fairq(
        "serve", "--host", "0.0.0.0", "--port", "1", cwd=tmp_path, env={"FAIRQ_API_KEYS": ""}
    )
    assert out.returncode == 2
    text = " ".join(out.stderr.split())
    assert "refusing to listen on 0.0.0.0: no API keys are set" in text
    assert "FAIRQ_API_KEYS" in text
    out = fairq("serve", "--port", "1", cwd=tmp_path, env={"FAIRQ_API_KEYS": "k:admin"})
    assert out.returncode == 2 and "16-256 characters" in " ".join(out.stderr.split())


def test_a_second_serve_on_a_busy_port_says_so_before_any_banner(tmp_path: Path) -> None:
    with fairq_serve(tmp_path) as (url, _):
        port = url.rsplit(":", 1)[1]
        out = fairq("serve", "--port", port, cwd=tmp_path)
        assert out.returncode == 1
        assert out.stdout == "", "no banner for a server that cannot listen"
        assert f"127.0.0.1:{port} is in use" in " ".join(out.stderr.split())
        assert "Traceback" not in out.stderr
        assert httpx.get(f"{url}/v1/queues").status_code == 200, "the first one still serves"


def test_a_stop_answers_the_requests_that_wait_with_a_503_at_once(tmp_path: Path) -> None:
    """SIGTERM while a long poll waits: the poll gets ``503 shutting_down`` (JSON, with
    Retry-After) at once, not a plain-text 500 after the shutdown's grace period."""
    import signal
    import threading
    import time

    with fairq_serve(tmp_path) as (url, proc):
        assert httpx.put(f"{url}/v1/queues/idle", json={}).status_code in (200, 201)
        answers: list[httpx.Response] = []

        def poll() -> None:
            answers.append(
                httpx.post(f"{url}/v1/queues/idle/receive", json={"wait": 15}, timeout=30)
            )

        waiter = threading.Thread(target=poll)
        waiter.start()
        time.sleep(0.5)
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        waiter.join(20)
        took = time.monotonic() - started
        (answer,) = answers
        assert answer.status_code == 503, answer.text
        assert answer.json()["error"] == "shutting_down"
        assert answer.headers["retry-after"] == "1"
        assert took < 2.5, f"the long poll was answered {took:.1f} s after SIGTERM"
        proc.wait(10)
    assert proc.stdout is not None
    assert "Traceback" not in proc.stdout.read()


def test_a_batch_over_max_body_says_so_in_the_client(tmp_path: Path) -> None:
    """The server refuses it from its Content-Length and closes the connection: the client
    says the body may be over --max-body (a 413 it could read), not that the server cannot
    be reached."""
    import asyncio

    import fairq
    from fairq.http import Client
    from fairq.http.errors import RemoteError

    async def send(url: str) -> BaseException:
        async with Client(url) as client:
            q = await client.declare_queue("big")
            try:
                await q.send_batch([fairq.Outgoing(b"x" * 200_000) for _ in range(20)])
            except (fairq.ConnectionError, RemoteError) as exc:
                return exc
        raise AssertionError("a 4 MB batch passed a 64 KiB --max-body")

    with fairq_serve(tmp_path, "--max-body", "65536") as (url, _):
        exc = asyncio.run(send(url))
    if isinstance(exc, RemoteError):
        assert exc.status == 413 and "--max-body" in str(exc)
    else:
        assert "--max-body" in str(exc), str(exc)


def test_a_listener_whose_server_dies_raises_a_connection_error(tmp_path: Path) -> None:
    import asyncio
    import signal

    import fairq
    from fairq.http import Client

    async def listen(url: str, proc: subprocess.Popen[str]) -> BaseException:
        async with Client(url) as client:
            topic = await client.declare_topic("live")
            listener = topic.listen()
            first = asyncio.create_task(listener.__anext__())
            await asyncio.sleep(0.3)
            await topic.publish({"n": 1})
            assert (await asyncio.wait_for(first, 5)).json() == {"n": 1}
            proc.send_signal(signal.SIGKILL)
            try:
                await asyncio.wait_for(listener.__anext__(), 10)
            except fairq.ConnectionError as exc:
                return exc
        raise AssertionError("the stream went on without its server")

    with fairq_serve(tmp_path) as (url, proc):
        exc = asyncio.run(listen(url, proc))
    assert "stream" in str(exc)


def test_the_cli_keeps_to_the_servers_batch_limit(tmp_path: Path) -> None:
    """send --count and receive --max above the server's --max-batch go in requests it
    takes (they failed with 422 at the first request)."""
    with fairq_serve(tmp_path, "--max-batch", "10") as (url, _):
        env = {"FAIRQ_SERVER": url}
        out = fairq("send", "jobs", "x", "--count", "25", cwd=tmp_path, env=env)
        assert out.returncode == 0, out.stderr
        assert httpx.get(f"{url}/v1/queues/jobs").json()["stats"]["visible"] == 25
        out = fairq("receive", "jobs", "--max", "23", cwd=tmp_path, env=env)
        assert out.returncode == 0, out.stderr
        assert "jobs: 23 message(s)" in out.stdout
        stats = httpx.get(f"{url}/v1/queues/jobs").json()["stats"]
        assert (stats["visible"], stats["acked"]) == (2, 23)


def test_serve_with_keys(tmp_path: Path) -> None:
    with fairq_serve(tmp_path, env={"FAIRQ_API_KEYS": f"{ADMIN}:admin"}) as (url, _):
        assert httpx.get(f"{url}/v1/queues").status_code == 401
        ok = fairq("send", "jobs", "x", "--server", url, "--api-key", ADMIN, cwd=tmp_path)
        assert ok.returncode == 0, ok.stderr
        denied = fairq("stats", "--server", url, "--api-key", "nope-nope-nope-nope", cwd=tmp_path)
        assert denied.returncode == 1 and "unknown API key" in denied.stderr


def test_make_run_is_fairq_serve_on_the_default_address() -> None:
    from fairq.http.serve import ServeOptions

    root = Path(__file__).resolve().parents[2]
    makefile = (root / "Makefile").read_text()
    recipe = makefile.split("\nrun:", 1)[1].split("\n\n", 1)[0]
    assert "fairq serve" in recipe
    options = ServeOptions()
    assert (options.host, options.port, options.url) == ("127.0.0.1", 8040, None)
    readme = (root / "README.md").read_text()
    assert "http://127.0.0.1:8040" in readme.split("```")[1]


def test_a_server_that_is_not_there_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    out = fairq("stats", "--server", url, cwd=tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr
    assert f"cannot reach the fairq server at {url}" in out.stderr
    assert "Traceback" not in out.stderr


async def test_the_client_raises_connection_error_for_a_server_that_is_not_there() -> None:
    import fairq
    from fairq.http.client import Client

    async with Client(f"http://127.0.0.1:{free_port()}") as client:
        with pytest.raises(fairq.ConnectionError, match="cannot reach"):
            await client.list_queues()
        with pytest.raises(fairq.ConnectionError, match="cannot reach"):
            await client.queue("jobs").send(b"x")
