"""Helpers of the server tests: the app on a memory broker, talked to through httpx's
ASGI transport (no socket), or served by uvicorn on a free loopback port when a test
needs a real connection (streams, push deliveries)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

import fairq
from fairq.http.app import create_app
from subprocs import free_port, running

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
    # the tests' virtual host: an open server answers only to the names it knows
    options.setdefault("allowed_hosts", [urlsplit(base_url).netloc])
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


@contextlib.asynccontextmanager
async def uvicorn_serving(app: Any, **config_options: Any) -> AsyncIterator[str]:
    """Serve ``app`` with uvicorn on a free loopback port in this event loop; its URL.
    ``config_options`` go to ``uvicorn.Config`` (``root_path``, ``lifespan`` ...)."""
    import uvicorn

    port = free_port()
    options: dict[str, Any] = {"log_level": "warning", "lifespan": "on", **config_options}
    config = uvicorn.Config(app, host="127.0.0.1", port=port, **options)
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
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "fairq", "serve", "--port", str(port), *args]
    env = {**os.environ, "FAIRQ_URL": f"sqlite:///{cwd / 'serve.db'}", **(env or {})}
    with running(cmd, f"{url}/healthz", cwd=cwd, text=True, env=env) as proc:
        yield url, proc
