"""Helpers of the server tests: the app on a memory broker, talked to through httpx's
ASGI transport (no socket), or served by uvicorn on a free loopback port when a test
needs a real connection (streams, push deliveries)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

import fairq
from fairq.http.app import create_app

ADMIN = "admin-key-0123456789"
SENDER = "send-key-0123456789"
RECEIVER = "recv-key-0123456789"
BOTH = "both-key-0123456789"
KEYS = f"{ADMIN}:admin,{SENDER}:send,{RECEIVER}:receive,{BOTH}:send+receive"


@dataclass
class Server:
    app: Any
    broker: fairq.Broker
    http: httpx.AsyncClient


@contextlib.asynccontextmanager
async def serving(
    broker: fairq.Broker | None = None, base_url: str = "http://fairq", **options: Any
) -> AsyncIterator[Server]:
    """The app on ``broker`` (default: a new memory broker) with its lifespan running."""
    own = broker is None
    b = broker or await fairq.connect("memory://")
    app = create_app(b, **options)
    try:
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=base_url) as http,
        ):
            yield Server(app, b, http)
    finally:
        if own:
            await b.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.asynccontextmanager
async def uvicorn_serving(app: Any) -> AsyncIterator[str]:
    """Serve ``app`` with uvicorn on a free loopback port in this event loop; its URL."""
    import uvicorn

    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    server.config.timeout_graceful_shutdown = 1
    task = asyncio.create_task(server.serve())
    try:
        for _ in range(200):
            if server.started:
                break
            await asyncio.sleep(0.02)
        assert server.started, "uvicorn did not start"
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)


@contextlib.contextmanager
def fairq_serve(
    cwd: Path, *args: str, env: dict[str, str] | None = None
) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """``fairq serve`` as a subprocess on a free loopback port; its URL once healthy."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "fairq", "serve", "--port", str(port), *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "FAIRQ_URL": f"sqlite:///{cwd / 'serve.db'}", **(env or {})},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"fairq serve did not start: {proc.communicate()[0]}")
            time.sleep(0.05)
        yield url, proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
