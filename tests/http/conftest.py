"""Fixtures of the server tests (helpers in httpsupport.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from httpsupport import KEYS, Server, serving

from fairq.http.auth import KeyRing


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    async with serving() as s:
        yield s


@pytest.fixture
async def api(server: Server) -> httpx.AsyncClient:
    return server.http


@pytest.fixture
async def secured() -> AsyncIterator[Server]:
    """A server with API keys (see httpsupport.KEYS)."""
    async with serving(keys=KeyRing.parse(KEYS)) as s:
        yield s
