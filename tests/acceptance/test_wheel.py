"""The wheel, as a new user installs it: built from a copy of the source, installed into a
fresh virtual environment, first alone (``pip install fairq``: ``fairq serve`` must name
the extra it needs), then with the ``server`` extra only — after which ``fairq serve``
answers every operation of its own ``/openapi.json``, and the waiting rooms' pages, with
something other than 5xx.

pip fetches the dependencies from the package index (reusing its cache). Without an index
the test skips, unless FAIRQ_REQUIRE_SERVICES=1, where it fails.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from subprocs import free_port, running

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
#: what pip says when it cannot reach an index (then the test skips)
_OFFLINE = re.compile(
    r"NewConnectionError|Network is unreachable|Temporary failure in name resolution|"
    r"Name or service not known|No matching distribution found|Could not find a version"
)
#: a value every path parameter's pattern accepts
_PARAM = "probe-1"


def _pip(python: Path | str, *args: str, cwd: Path) -> None:
    proc = subprocess.run(
        [str(python), "-m", "pip", "--disable-pip-version-check", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode == 0:
        return
    output = proc.stdout + proc.stderr
    if _OFFLINE.search(output) and os.environ.get("FAIRQ_REQUIRE_SERVICES") != "1":
        pytest.skip(f"pip cannot reach a package index: {output[-300:]}")
    raise AssertionError(f"pip {' '.join(args)} failed:\n{output}")


def _build_wheel(tmp: Path) -> Path:
    """The wheel of a copy of the source (the checkout stays clean: no build/, egg-info)."""
    source = tmp / "source"
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "*.pyc")
    shutil.copytree(ROOT / "src", source / "src", ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    _pip(sys.executable, "wheel", "--no-deps", "-q", "-w", str(tmp / "dist"), str(source), cwd=tmp)
    (wheel,) = (tmp / "dist").glob("fairq-*.whl")
    return wheel


def _probe(http: httpx.Client, method: str, path: str, op: dict[str, Any]) -> int:
    url = re.sub(r"\{\w+\}", _PARAM, path)
    body = b"{}" if "requestBody" in op else None
    headers = {"Content-Type": "application/json"} if body is not None else {}
    if "text/event-stream" in op["responses"].get("200", {}).get("content", {}):
        with http.stream(method, url, headers=headers) as r:
            return r.status_code  # the head is enough: a live stream never ends
    return http.request(method, url, content=body, headers=headers).status_code


def test_the_wheel_with_the_server_extra_serves_every_route(tmp_path: Path) -> None:
    wheel = _build_wheel(tmp_path)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python, fairq = venv / "bin" / "python", venv / "bin" / "fairq"
    env = {
        k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "FAIRQ_URL")
    }
    env["FAIRQ_URL"] = f"sqlite:///{tmp_path / 'serve.db'}"

    # `pip install fairq`, then `fairq serve`: the error names the extra
    _pip(python, "install", "-q", str(wheel), cwd=tmp_path)
    bare = subprocess.run(
        [str(fairq), "serve", "--port", str(free_port())],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bare.returncode == 2, bare.stdout + bare.stderr
    assert "pip install 'fairq[server]'" in bare.stderr, bare.stderr

    # `pip install 'fairq[server]'`: everything `fairq serve` mounts is there
    _pip(python, "install", "-q", f"{wheel}[server]", cwd=tmp_path)
    where = subprocess.run(
        [str(python), "-c", "import fairq; print(fairq.__file__)"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert where.stdout.startswith(str(venv)), where.stdout  # the wheel, not the checkout
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [str(fairq), "serve", "--port", str(port)]
    with (
        running(cmd, f"{url}/healthz", timeout=60, cwd=tmp_path, env=env, text=True) as proc,
        httpx.Client(base_url=url, timeout=30) as http,
    ):
        doc = http.get("/openapi.json").json()
        answers = {
            f"{method.upper()} {path}": _probe(http, method.upper(), path, op)
            for path, ops in doc["paths"].items()
            for method, op in ops.items()
        }
        assert len(answers) >= 50  # every operation, the new rooms and keys included
        assert "POST /v1/rooms/{room}/join" in answers

        # a real room: the fans' pages, whose join once answered 500 (no PyJWT)
        assert http.put("/v1/rooms/ev-1", json={"admit_rate": 0}).status_code == 200
        fan = {"Accept": "application/json"}
        joined = http.post("/rooms/ev-1/join", headers=fan)
        assert joined.status_code == 200 and joined.json()["ticket"], joined.text
        ticket = joined.json()["ticket"]
        answers["POST /rooms/ev-1/join"] = joined.status_code
        answers["GET /rooms/ev-1/status"] = http.get(
            "/rooms/ev-1/status", params={"ticket": ticket}
        ).status_code
        answers["GET /rooms/ev-1"] = http.get("/rooms/ev-1").status_code
        answers["GET /rooms/ev-1/jwks.json"] = http.get("/rooms/ev-1/jwks.json").status_code
        answers["GET /"] = http.get("/").status_code
        failed = {op: status for op, status in answers.items() if status >= 500}
        assert not failed, f"5xx answers: {failed}"
        for page in ("GET /rooms/ev-1/status", "GET /rooms/ev-1", "GET /rooms/ev-1/jwks.json"):
            assert answers[page] == 200, (page, answers[page])
        assert proc.poll() is None, "the server stopped"
