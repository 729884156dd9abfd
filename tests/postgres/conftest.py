"""The fixture the PostgreSQL tests share: a URL naming a schema of the test's own on the
shared server (skipped when PostgreSQL is down, a failure in CI), dropped afterwards."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from services import drop_namespace, pg_url
from services import require as _require


@pytest.fixture
async def url() -> AsyncIterator[str]:
    _require("postgres")
    made = pg_url()
    yield made
    drop_namespace(made)
