"""The attention steps PostgreSQL runs server-side (migration 10: a slice's take and its end
in one PL/pgSQL call each, with attention_policy's on_signal, on_slice_end, next_permit,
on_take, slice_cost, on_end and next_estimate mirrored there) against their Python
reference, the memory backend: the same random histories under one manual clock must take
the same keys, lease the same messages and end with the same tenant stats; next_permit's
arithmetic to the bit."""

from __future__ import annotations

import json
import random

import psycopg
import pytest

import fairq
from attention_history import history, paired
from fairq.backends import attention_policy as policy
from fairq.backends.postgres.connection import parse_url
from fairq.model.attention import Plan


@pytest.mark.parametrize(
    ("seed", "charge"),
    [
        (1, "time"),
        (2, "time"),
        (5, "messages"),
        (9, "messages"),
        (3, "messages"),  # these four took another key before the sweep and the tenant move
        (4, "time"),  # put a signal at its tenant's tail, as the reference does
        (7, "time"),
        (8, "time"),
        (16, "messages"),  # these two charged vt + ((0 - charged) + cost / weight), a bit
        (21, "messages"),  # off the policy's (vt - charged) + cost / weight: a tie lost
    ],
)
async def test_postgres_takes_the_slices_the_memory_backend_takes(
    url: str, seed: int, charge: str
) -> None:
    async with paired(url) as (brokers, clock):
        await history(brokers, clock, seed, charge)


async def test_the_plpgsql_next_permit_is_the_python_one(url: str) -> None:
    """When a rate-limited key is signalled again (att_next_permit), to the bit."""
    async with await fairq.connect(url) as broker:
        await broker.declare_attention("p")  # the schema, migrated
    rng = random.Random(7)
    now = rng.uniform(1.6e9, 1.9e9)
    cases = []
    for _ in range(300):
        plan = Plan(
            1,
            rng.choice([1, 2, 3, 10, 100, rng.randint(1, 1000)]),
            20.0,
            rate=rng.choice([0.5, 20.0, 50.0, rng.uniform(0.01, 1e4)]),
            burst=rng.choice([None, 1.0, 2.5, 10.0, rng.uniform(1.0, 1e3)]),
        )
        cases.append((rng.choice([0.0, rng.uniform(0.0, plan.bucket)]), plan))
    async with await psycopg.AsyncConnection.connect(parse_url(url).conninfo, autocommit=True) as c:
        got = []
        for tokens, plan in cases:
            cur = await c.execute(
                f'SELECT "{parse_url(url).schema}".att_next_permit(%s, %s, %s::jsonb)',
                (tokens, now, json.dumps(plan.to_dict())),
            )
            row = await cur.fetchone()
            assert row is not None
            got.append(row[0])
    assert got == [policy.next_permit(tokens, now, plan) for tokens, plan in cases]
