"""API keys, scopes, the dashboard's login cookie, and the loopback rule."""

from __future__ import annotations

import hmac

import httpx
import pytest
from httpsupport import ADMIN, BOTH, RECEIVER, SENDER, Server

from fairq.errors import InvalidOption
from fairq.http import auth
from fairq.http.auth import KeyRing, check_bind, is_loopback, parse_api_keys


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_parse_keys_format() -> None:
    keys = parse_api_keys(f" {ADMIN}:admin ,\n{BOTH}:send+receive\n\n")
    assert [(k.key, sorted(k.scopes)) for k in keys] == [
        (ADMIN, ["admin"]),
        (BOTH, ["receive", "send"]),
    ]
    assert parse_api_keys("") == []
    for bad, why in [
        ("short:admin", "16-256 characters"),
        (f"{ADMIN}", "no scopes"),
        (f"{ADMIN}:root", "unknown scope"),
        (f"{ADMIN}:admin,{ADMIN}:send", "listed twice"),
        ("spaces in the key!!!!:admin", "16-256 characters"),
    ]:
        with pytest.raises(InvalidOption, match=why) as info:
            parse_api_keys(bad)
        assert ADMIN not in str(info.value), "an error message must not give a key away"


def test_keys_are_compared_in_constant_time_against_every_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", spy)
    ring = KeyRing.parse(f"{ADMIN}:admin,{SENDER}:send,{RECEIVER}:receive")
    found = ring.find(ADMIN)
    assert found is not None and found.key == ADMIN
    assert len(calls) == 3, "the search must not stop at the first match"
    calls.clear()
    assert ring.find("nothing-like-a-key") is None and len(calls) == 3


def test_loopback_rule() -> None:
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "10.0.0.1", "::", "example.com"))
    check_bind("127.0.0.1", KeyRing())
    with pytest.raises(InvalidOption, match=r"refusing to listen on 0\.0\.0\.0: no API keys"):
        check_bind("0.0.0.0", KeyRing())
    check_bind("0.0.0.0", KeyRing.parse(f"{ADMIN}:admin"))


async def test_requests_need_a_key_with_the_scope(secured: Server) -> None:
    api = secured.http
    r = await api.get("/v1/queues")
    assert r.status_code == 401 and r.json()["error"] == "unauthorized"
    r = await api.get("/v1/queues", headers=bearer("wrong-key-0123456789"))
    assert r.status_code == 401 and r.json()["detail"] == "unknown API key"
    r = await api.get("/v1/queues", headers={"Authorization": "Basic abc"})
    assert r.status_code == 401
    assert (await api.get("/healthz")).status_code == 200, "health needs no key"
    assert (await api.get("/openapi.json")).status_code == 200

    r = await api.put("/v1/queues/jobs", headers=bearer(SENDER))
    assert r.status_code == 403 and r.json()["error"] == "forbidden"
    assert (await api.put("/v1/queues/jobs", headers=bearer(ADMIN))).status_code == 200
    send = {"messages": [{"body": "x"}]}
    assert (
        await api.post("/v1/queues/jobs/messages", json=send, headers=bearer(SENDER))
    ).is_success
    r = await api.post("/v1/queues/jobs/messages", json=send, headers=bearer(RECEIVER))
    assert r.status_code == 403
    r = await api.post("/v1/queues/jobs/receive", json={}, headers=bearer(SENDER))
    assert r.status_code == 403
    r = await api.post("/v1/queues/jobs/receive", json={}, headers={"X-API-Key": RECEIVER})
    assert r.status_code == 200 and len(r.json()["messages"]) == 1
    for key in (SENDER, RECEIVER, BOTH, ADMIN):  # any valid key reads
        assert (await api.get("/v1/queues", headers=bearer(key))).status_code == 200
        assert (await api.get("/metrics", headers=bearer(key))).status_code == 200
    assert (await api.get("/metrics")).status_code == 401
    r = await api.post("/v1/queues/jobs/purge", headers=bearer(BOTH))
    assert r.status_code == 403


async def test_openapi_document_describes_the_keys(secured: Server) -> None:
    doc = (await secured.http.get("/openapi.json")).json()
    assert set(doc["components"]["securitySchemes"]) == {"bearer", "apiKey"}
    op = doc["paths"]["/v1/queues/{queue}/messages"]["post"]
    assert op["x-fairq-scope"] == "send" and "401" in op["responses"]
    assert "403" in op["responses"]


async def test_dashboard_login_keeps_the_key_in_a_strict_httponly_cookie(
    secured: Server,
) -> None:
    api = secured.http
    r = await api.get("/")
    assert r.status_code == 303 and r.headers["location"] == "/login"
    assert "Admin API key" in (await api.get("/login")).text
    r = await api.post("/login", content=f"key={SENDER}")
    assert r.status_code == 303 and r.headers["location"] == "/login?failed=1"
    assert "set-cookie" not in r.headers
    r = await api.post("/login", content=f"key={ADMIN}")
    assert r.status_code == 303 and r.headers["location"] == "/"
    cookie = r.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie and "path=/" in cookie
    assert (await api.get("/")).status_code == 200  # the client keeps the cookie
    assert (await api.get("/v1/overview")).json()["auth"] is True
    r = await api.put("/v1/queues/jobs")
    assert r.status_code == 403, "a cookie-only change must come from the dashboard"
    r = await api.put("/v1/queues/jobs", headers={"X-Fairq-Dashboard": "1"})
    assert r.status_code == 200
    r = await api.post("/logout")
    assert r.status_code == 303
    assert (await api.get("/")).status_code == 303


async def test_without_keys_everything_is_open(api: httpx.AsyncClient) -> None:
    assert (await api.get("/")).status_code == 200
    assert (await api.get("/login")).status_code == 303
    assert (await api.put("/v1/queues/jobs")).status_code == 200
    assert (await api.get("/v1/overview")).json()["auth"] is False
