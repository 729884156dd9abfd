"""The attention steps PostgreSQL runs server-side (migration 10: a slice's end in one
PL/pgSQL call, with attention_policy's on_slice_end, slice_cost, on_end and next_estimate
mirrored there) against their Python reference, the memory backend: the same random
histories under one manual clock must take the same keys, lease the same messages, and
end with the same tenant stats and domain counters."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

import fairq
from attention_history import history
from services import drop_namespace, pg_url
from services import require as _require


@pytest.fixture
async def url() -> AsyncIterator[str]:
    _require("postgres")
    made = pg_url()
    yield made
    drop_namespace(made)


_DIVERGES = pytest.mark.xfail(
    strict=True,
    reason="PostgreSQL takes another key than the memory backend in this history with the "
    "Python end of before migration 10 too: a difference older than the PL/pgSQL end, "
    "not found yet",
)


@pytest.mark.parametrize(
    ("seed", "charge"),
    [
        (1, "time"),
        (2, "time"),
        (5, "messages"),
        (9, "messages"),
        pytest.param(3, "messages", marks=_DIVERGES),
        pytest.param(4, "time", marks=_DIVERGES),
    ],
)
async def test_postgres_takes_the_slices_the_memory_backend_takes(
    url: str, seed: int, charge: str
) -> None:
    clock = fairq.ManualClock()
    brokers = [
        await fairq.connect("memory://", clock=clock),
        await fairq.connect(url, clock=clock),
    ]
    try:
        await history(brokers, clock, seed, charge)
    finally:
        for b in brokers:
            await b.close()
