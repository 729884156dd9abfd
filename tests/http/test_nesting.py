"""Deeply nested JSON, which schemathesis does not generate: every operation of the route
table that takes a body gets arrays and objects nested past the bound — as the whole
body and as the value of each of its fields — and must answer 400, never 5xx; nesting up
to the bound decodes as before."""

from __future__ import annotations

import re

import httpx
import msgspec
import pytest

from fairq.http.api import ROUTES, Route
from fairq.http.nesting import MAX_DEPTH, nesting_depth, too_deep

BODY_ROUTES = [r for r in ROUTES if r.body is not None]
SAMPLE = {
    "queue": "q",
    "topic": "t",
    "subscription": "s",
    "domain": "d",
    "key": "k",
    "room": "r",
    "namespace": "n",
    "entity": "e",
}


def path_of(route: Route) -> str:
    return re.sub(r"\{(\w+)\}", lambda m: SAMPLE[m.group(1)], route.path)


def arrays(depth: int) -> str:
    return "[" * depth + "]" * depth


def objects(depth: int) -> str:
    return '{"a":' * depth + "1" + "}" * depth


def cases(route: Route) -> list[str]:
    """Bodies nested past the bound: whole, and in each field of the route's body."""
    assert route.body is not None
    out = [arrays(MAX_DEPTH + 1), objects(5000), arrays(100_000)]
    for field in msgspec.structs.fields(route.body):
        out.append('{"' + field.encode_name + '": ' + arrays(1000) + "}")
        out.append('{"' + field.encode_name + '": [' + objects(MAX_DEPTH) + "]}")
    return out


def test_the_depth_of_json_text() -> None:
    assert nesting_depth(b"1") == 0
    assert nesting_depth(b'[[{"a": [1]}]]') == 4
    assert nesting_depth(b'{"a": "[[[[[[", "b": "]]]]"}') == 1, "brackets in strings"
    assert nesting_depth(b'{"a": "\\"[[[", "b": [[]]}') == 3, "escaped quotes"
    assert not too_deep(arrays(MAX_DEPTH)) and too_deep(arrays(MAX_DEPTH + 1))
    assert not too_deep("[" + "[],[]," * 1000 + "[]]"), "many brackets, shallow"


@pytest.mark.parametrize("route", BODY_ROUTES, ids=lambda r: r.op)
async def test_every_operation_refuses_deep_nesting_with_400(
    api: httpx.AsyncClient, route: Route
) -> None:
    # the resources exist, so that nothing but the body decides the answer
    await api.put("/v1/queues/q")
    await api.put("/v1/topics/t")
    await api.put("/v1/attention/d")
    await api.put("/v1/rooms/r", json={})
    for body in cases(route):
        r = await api.request(
            route.method,
            path_of(route),
            content=body,
            headers={"Content-Type": "application/json"},
        )
        assert r.status_code == 400, (route.op, body[:60], r.text)
        assert r.json()["error"] == "bad_request"
