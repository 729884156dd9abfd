"""``/v1`` for waiting rooms, idempotency keys and version gates, on every backend,
through the app (httpx's ASGI transport); time moves on the broker's manual clock."""

from __future__ import annotations

import asyncio
import base64
import secrets
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from httpsupport import ADMIN, BOTH, KEYS, RECEIVER, SENDER, Server, serving

import fairq
from fairq.http.auth import KeyRing


@pytest.fixture
async def app(broker: fairq.Broker) -> AsyncIterator[Server]:
    async with serving(broker) as s:
        yield s


def ok(r: httpx.Response, status: int = 200) -> Any:
    assert r.status_code == status, r.text
    return r.json() if r.content else None


def err(r: httpx.Response, status: int, code: str) -> Any:
    assert (r.status_code, r.json()["error"]) == (status, code), r.text
    return r.json()


# -- waiting rooms -----------------------------------------------------------------------------
async def test_room_set_up_list_get_update_delete(app: Server) -> None:
    api = app.http
    room = ok(await api.put("/v1/rooms/ev-88", json={"admit_rate": 50, "max_active": 10}))
    assert (room["name"], room["admit_rate"], room["token_ttl"], room["max_active"]) == (
        "ev-88", 50.0, 600.0, 10,
    )  # fmt: skip
    assert room["phase"] == "open"
    room = ok(await api.put("/v1/rooms/ev-88", json={"token_ttl": 60}))  # the rest stays
    assert (room["admit_rate"], room["token_ttl"], room["max_active"]) == (50.0, 60.0, 10)
    ok(await api.put("/v1/rooms/ev-99", json={}))
    rooms = ok(await api.get("/v1/rooms"))["rooms"]
    assert [r["name"] for r in rooms] == ["ev-88", "ev-99"]
    assert [
        r["name"] for r in ok(await api.get("/v1/rooms", params={"prefix": "ev-9"}))["rooms"]
    ] == ["ev-99"]
    assert ok(await api.get("/v1/rooms/ev-88"))["token_ttl"] == 60.0
    err(await api.put("/v1/rooms/ev-88", json={"token_ttl": 0}), 422, "validation_error")
    err(await api.put("/v1/rooms/ev-88", json={"colour": "red"}), 422, "validation_error")
    ok(await api.delete("/v1/rooms/ev-99"), 204)
    err(await api.delete("/v1/rooms/ev-99"), 404, "room_not_found")
    err(await api.get("/v1/rooms/ev-99"), 404, "room_not_found")
    err(await api.get("/v1/rooms/bad%20name"), 400, "invalid_name")


async def test_join_status_admit_verify_consume(app: Server) -> None:
    api = app.http
    ok(await api.put("/v1/rooms/ev-88", json={"admit_rate": 0}))
    first = ok(await api.post("/v1/rooms/ev-88/join", json={"fan": "fan-1"}))
    assert (first["state"], first["position"]) == ("waiting", 0) and first["ticket"]
    second = ok(await api.post("/v1/rooms/ev-88/join", json={"fan": "fan-2"}))
    again = ok(await api.post("/v1/rooms/ev-88/join", json={"fan": "fan-1"}))
    assert again["ticket"] == first["ticket"] and again["position"] == 0  # rule 1
    reserved = await api.post("/v1/rooms/ev-88/join", json={"fan": "f-" + "A" * 22})
    err(reserved, 422, "invalid_option")  # the public pages' anonymous ids are theirs alone
    st = ok(await api.get("/v1/rooms/ev-88/status", params={"ticket": second["ticket"]}))
    assert (st["state"], st["position"], st["token"]) == ("waiting", 1, None)

    assert ok(await api.post("/v1/rooms/ev-88/admit", json={"n": 1})) == {"admitted": 1}
    st = ok(await api.get("/v1/rooms/ev-88/status", params={"ticket": first["ticket"]}))
    assert st["state"] == "admitted" and st["token"] and st["expires_at"]
    assert (
        ok(await api.get("/v1/rooms/ev-88/status", params={"ticket": second["ticket"]}))["position"]
        == 0
    )

    claims = ok(await api.post("/v1/rooms/ev-88/verify", json={"token": st["token"]}))["claims"]
    assert (claims["room"], claims["fan"], claims["ticket"]) == ("ev-88", "fan-1", first["ticket"])
    body = {"token": st["token"], "consume": True}
    assert ok(await api.post("/v1/rooms/ev-88/verify", json=body))["claims"]["fan"] == "fan-1"
    err(await api.post("/v1/rooms/ev-88/verify", json=body), 403, "invalid_token")  # works once
    forged = st["token"][:-4] + ("AAAA" if not st["token"].endswith("AAAA") else "BBBB")
    err(await api.post("/v1/rooms/ev-88/verify", json={"token": forged}), 403, "invalid_token")
    ok(await api.put("/v1/rooms/ev-2", json={}))
    err(await api.post("/v1/rooms/ev-2/verify", json={"token": st["token"]}), 403, "invalid_token")

    err(await api.get("/v1/rooms/ev-88/status", params={"ticket": "1.AAAAAAAAAAAAAAAA.fan-1"}),
        400, "invalid_ticket")  # fmt: skip
    err(await api.get("/v1/rooms/ev-88/status"), 422, "validation_error")
    err(await api.post("/v1/rooms/ev-88/join", json={"fan": "no spaces"}), 422, "validation_error")
    err(await api.post("/v1/rooms/nope/join", json={"fan": "fan-1"}), 404, "room_not_found")
    err(await api.post("/v1/rooms/ev-88/admit", json={"n": -1}), 422, "validation_error")


async def test_rate_sold_out_close(app: Server) -> None:
    api = app.http
    ok(await api.put("/v1/rooms/ev-88", json={"admit_rate": 10}))
    assert ok(await api.put("/v1/rooms/ev-88/rate", json={"rate": 250}))["admit_rate"] == 250.0
    assert ok(await api.get("/v1/rooms/ev-88"))["admit_rate"] == 250.0
    err(await api.put("/v1/rooms/ev-88/rate", json={"rate": -1}), 422, "validation_error")
    tickets = [
        ok(await api.post("/v1/rooms/ev-88/join", json={"fan": f"fan-{i}"}))["ticket"]
        for i in range(3)
    ]
    assert ok(await api.post("/v1/rooms/ev-88/sold-out")) == {"waiting": 3}
    st = ok(await api.get("/v1/rooms/ev-88/status", params={"ticket": tickets[2]}))
    assert st["state"] == "sold_out"
    late = ok(await api.post("/v1/rooms/ev-88/join", json={"fan": "late"}))
    assert (late["state"], late["ticket"]) == ("sold_out", None)
    stats = ok(await api.get("/v1/rooms/ev-88"))
    assert (stats["phase"], stats["told_sold_out"], stats["joined"]) == ("sold_out", 3, 3)
    assert ok(await api.post("/v1/rooms/ev-88/close"))["phase"] == "closed"
    err(await api.post("/v1/rooms/nope/sold-out"), 404, "room_not_found")
    err(await api.post("/v1/rooms/nope/close"), 404, "room_not_found")


async def test_a_room_opening_later_puts_early_fans_in_the_pre_queue(
    app: Server, clock: fairq.ManualClock
) -> None:
    api = app.http
    ok(await api.put("/v1/rooms/ev-88", json={"opens_at": clock.now() + 60}))
    t = ok(await api.post("/v1/rooms/ev-88/join", json={"fan": "early"}))
    assert (t["state"], t["position"], t["eta"]) == ("pre_queue", None, 60.0)
    assert ok(await api.get("/v1/rooms/ev-88"))["phase"] == "scheduled"
    clock.advance(61)
    st = ok(await api.get("/v1/rooms/ev-88/status", params={"ticket": t["ticket"]}))
    assert (st["state"], st["position"]) == ("waiting", 0)


async def test_a_room_made_with_its_own_secret_is_managed_but_not_joined(app: Server) -> None:
    await app.broker.waiting_room("vip", admit_rate=0, secret=secrets.token_bytes(32))
    api = app.http
    assert ok(await api.get("/v1/rooms/vip"))["name"] == "vip"
    assert ok(await api.post("/v1/rooms/vip/admit", json={"n": 5})) == {"admitted": 0}
    assert ok(await api.put("/v1/rooms/vip/rate", json={"rate": 3}))["admit_rate"] == 3.0
    answer = err(
        await api.post("/v1/rooms/vip/join", json={"fan": "f"}), 503, "room_secret_missing"
    )
    assert "FAIRQ_ROOM_SECRETS" in answer["detail"]
    assert ok(await api.post("/v1/rooms/vip/sold-out")) == {"waiting": 0}


async def test_a_room_made_with_its_own_secret_is_joined_with_the_servers_copy(
    broker: fairq.Broker,
) -> None:
    secret = secrets.token_bytes(32)
    room = await broker.waiting_room("vip", admit_rate=0, secret=secret)
    async with serving(broker, room_secrets={"vip": secret}) as s:
        t = ok(await s.http.post("/v1/rooms/vip/join", json={"fan": "f"}))
        assert t["position"] == 0
        await room.admit(1)
        st = ok(await s.http.get("/v1/rooms/vip/status", params={"ticket": t["ticket"]}))
        assert st["state"] == "admitted" and room.verify(st["token"])["fan"] == "f"


# -- idempotency keys --------------------------------------------------------------------------
KEY = "/v1/idempotency/pdf-worker/keys/order-7731"


async def test_claim_complete_and_the_key_stays_done(app: Server) -> None:
    api = app.http
    first = ok(await api.post(f"{KEY}/claim", json={"lease": 30}))
    assert first["claimed"] is True and first["token"] and first["record"] is None
    held = ok(await api.post(f"{KEY}/claim", json={}))
    assert held["claimed"] is False and held["token"] is None
    assert held["record"]["state"] == "running"
    record = ok(await api.get(KEY))
    assert (record["state"], record["key"], record["namespace"]) == (
        "running", "order-7731", "pdf-worker",
    )  # fmt: skip
    result = {"pdf": "tickets/o-7731.pdf"}
    ok(await api.post(f"{KEY}/complete", json={"token": first["token"], "result": result}), 204)
    done = ok(await api.post(f"{KEY}/claim", json={}))
    assert done["claimed"] is False
    assert (done["record"]["state"], done["record"]["result"]) == ("completed", result)
    assert ok(await api.get(KEY))["result"] == result
    # the same store in-process sees the same record
    stored = await app.broker.idempotency("pdf-worker").get("order-7731")
    assert stored is not None and stored.result == result


async def test_release_extend_expire_and_claim_lost(app: Server, clock: fairq.ManualClock) -> None:
    api = app.http
    first = ok(await api.post(f"{KEY}/claim", json={"lease": 10}))
    assert ok(await api.post(f"{KEY}/release", json={"token": "not-the-token"})) == {
        "released": False
    }
    assert ok(await api.post(f"{KEY}/release", json={"token": first["token"]})) == {
        "released": True
    }
    second = ok(await api.post(f"{KEY}/claim", json={"lease": 10}))  # taken again at once
    assert second["claimed"] is True
    clock.advance(8)
    ok(await api.post(f"{KEY}/extend", json={"token": second["token"], "lease": 10}), 204)
    clock.advance(8)  # 16 s after the claim: alive only thanks to the extension
    assert ok(await api.post(f"{KEY}/claim", json={}))["claimed"] is False
    clock.advance(3)  # now it has expired: another claimer takes the key
    third = ok(await api.post(f"{KEY}/claim", json={"lease": 10}))
    assert third["claimed"] is True
    stale = {"token": second["token"], "result": "late"}
    err(await api.post(f"{KEY}/complete", json=stale), 409, "claim_lost")
    err(await api.post(f"{KEY}/extend", json={"token": second["token"]}), 409, "claim_lost")
    ok(await api.post(f"{KEY}/complete", json={"token": third["token"]}), 204)


async def test_results_as_bytes_forget_and_bad_input(app: Server) -> None:
    api = app.http
    token = ok(await api.post(f"{KEY}/claim", json={}))["token"]
    raw = b"\x00\xffpdf"
    bad = {"token": token, "result": "!", "encoding": "base64"}
    err(await api.post(f"{KEY}/complete", json=bad), 422, "invalid_message")
    body = {"token": token, "result": base64.b64encode(raw).decode(), "encoding": "base64"}
    ok(await api.post(f"{KEY}/complete", json=body), 204)
    record = ok(await api.get(KEY))
    assert record["encoding"] == "base64" and base64.b64decode(record["result"]) == raw
    ok(await api.delete(KEY), 204)
    err(await api.get(KEY), 404, "not_found")
    err(await api.delete(KEY), 404, "not_found")
    assert ok(await api.post(f"{KEY}/claim", json={}))["claimed"] is True  # forgotten: runs again
    err(await api.post(f"{KEY}/claim", json={"lease": 0}), 422, "validation_error")
    err(await api.post("/v1/idempotency/pdf-worker/keys/a%20b/claim", json={}), 400, "invalid_name")
    err(await api.post("/v1/idempotency/bad%20ns/keys/k/claim", json={}), 400, "invalid_name")


async def test_of_concurrent_claims_exactly_one_wins(app: Server) -> None:
    got = await asyncio.gather(
        *(app.http.post("/v1/idempotency/ns/keys/race/claim", json={}) for _ in range(20))
    )
    assert sum(ok(r)["claimed"] for r in got) == 1


# -- version gates -----------------------------------------------------------------------------
async def test_version_gate(app: Server) -> None:
    api = app.http
    path = "/v1/versions/user-birthdate/user-42"
    err(await api.get(path), 404, "not_found")
    for version, advanced in ((5, True), (3, False), (5, False), (6, True)):
        r = await api.post(f"{path}/advance", json={"version": version})
        assert ok(r) == {"advanced": advanced}, version
    assert ok(await api.get(path)) == {
        "namespace": "user-birthdate", "entity": "user-42", "version": 6,
    }  # fmt: skip
    assert await app.broker.versions("user-birthdate").current("user-42") == 6
    # event times: aware datetimes, compared as seconds since the epoch
    times = "/v1/versions/events/e-1"
    assert ok(await api.post(f"{times}/advance", json={"version": "2026-03-01T10:00:00+01:00"}))[
        "advanced"
    ]
    assert not ok(await api.post(f"{times}/advance", json={"version": "2026-03-01T08:59:59Z"}))[
        "advanced"
    ]
    assert ok(await api.get(times))["version"] == 1772355600.0
    naive = {"version": "2026-03-01T10:00:00"}
    err(await api.post(f"{times}/advance", json=naive), 422, "validation_error")
    err(await api.post(f"{path}/advance", json={"version": 2**64}), 422, "validation_error")
    err(await api.post(f"{path}/advance", json={"version": True}), 422, "validation_error")


# -- scopes ------------------------------------------------------------------------------------
async def test_scopes_of_the_new_operations() -> None:
    async with serving(keys=KeyRing.parse(KEYS)) as s:

        async def call(key: str, method: str, path: str, body: Any = None) -> int | str:
            """The status, or for a 403 its code (a missing scope is ``forbidden``)."""
            r = await s.http.request(
                method, path, json=body, headers={"Authorization": f"Bearer {key}"}
            )
            return str(r.json()["error"]) if r.status_code == 403 else r.status_code

        assert await call(SENDER, "PUT", "/v1/rooms/ev-1", {}) == "forbidden"
        assert await call(ADMIN, "PUT", "/v1/rooms/ev-1", {"admit_rate": 0}) == 200
        assert await call(RECEIVER, "GET", "/v1/rooms/ev-1") == 200  # any key reads
        assert await call(RECEIVER, "POST", "/v1/rooms/ev-1/join", {"fan": "f"}) == "forbidden"
        assert await call(SENDER, "POST", "/v1/rooms/ev-1/join", {"fan": "f"}) == 200
        for op, body in (("admit", {"n": 1}), ("sold-out", None), ("close", None)):
            assert await call(BOTH, "POST", f"/v1/rooms/ev-1/{op}", body) == "forbidden", op
        assert await call(BOTH, "PUT", "/v1/rooms/ev-1/rate", {"rate": 1}) == "forbidden"
        assert await call(ADMIN, "POST", "/v1/rooms/ev-1/admit", {"n": 1}) == 200
        assert await call(SENDER, "GET", "/v1/rooms/ev-1/status?ticket=x") == "forbidden"
        assert await call(RECEIVER, "GET", "/v1/rooms/ev-1/status?ticket=x") == 400
        assert await call(SENDER, "POST", "/v1/rooms/ev-1/verify", {"token": "x"}) == "forbidden"
        assert (
            await call(RECEIVER, "POST", "/v1/rooms/ev-1/verify", {"token": "x"}) == "invalid_token"
        )

        claim = "/v1/idempotency/ns/keys/k/claim"
        assert await call(SENDER, "POST", claim, {}) == "forbidden"
        assert await call(RECEIVER, "POST", claim, {}) == 200
        assert await call(SENDER, "GET", "/v1/idempotency/ns/keys/k") == 200
        assert await call(RECEIVER, "DELETE", "/v1/idempotency/ns/keys/k") == "forbidden"
        assert await call(ADMIN, "DELETE", "/v1/idempotency/ns/keys/k") == 204
        assert (
            await call(SENDER, "POST", "/v1/versions/ns/e/advance", {"version": 1}) == "forbidden"
        )
        assert await call(RECEIVER, "POST", "/v1/versions/ns/e/advance", {"version": 1}) == 200
        assert (await s.http.get("/v1/rooms")).status_code == 401


# -- the Idempotency-Key header on sends and publishes -----------------------------------------
def _send(text: str) -> dict[str, Any]:
    return {"messages": [{"body": text}]}


async def test_a_repeated_send_is_replayed_not_stored_twice(app: Server) -> None:
    api = app.http
    ok(await api.put("/v1/queues/jobs", json={}))
    key = {"Idempotency-Key": "order-7731-send"}
    first = await api.post("/v1/queues/jobs/messages", json=_send("pdf"), headers=key)
    again = await api.post("/v1/queues/jobs/messages", json=_send("pdf"), headers=key)
    assert ok(first) == ok(again) and "idempotent-replayed" not in first.headers
    assert again.headers["idempotent-replayed"] == "true"
    assert (await app.broker.queue("jobs").stats()).sent == 1
    other = await api.post("/v1/queues/jobs/messages", json=_send("other"), headers=key)
    assert (other.status_code, other.json()["error"]) == (422, "idempotency_key_reused")
    elsewhere = await api.post("/v1/queues/jobs.dlq/messages", json=_send("pdf"), headers=key)
    assert elsewhere.status_code == 422  # another path is another request
    # without the header every send runs
    ok(await api.post("/v1/queues/jobs/messages", json=_send("pdf")))
    assert (await app.broker.queue("jobs").stats()).sent == 2
    bad = await api.post(
        "/v1/queues/jobs/messages", json=_send("pdf"), headers={"Idempotency-Key": "a b"}
    )
    assert (bad.status_code, bad.json()["error"]) == (400, "idempotency_key_invalid")
    assert bad.headers["content-type"] == "application/problem+json"


async def test_a_repeated_publish_is_replayed(app: Server) -> None:
    api = app.http
    ok(await api.put("/v1/topics/orders", json={}))
    ok(await api.put("/v1/topics/orders/subscriptions/sms", json={}))
    key = {"Idempotency-Key": "evt-1"}
    body = {"messages": [{"body": {"order": 1}, "routing_key": "order.new"}]}
    first = ok(await api.post("/v1/topics/orders/messages", json=body, headers=key))
    r = await api.post("/v1/topics/orders/messages", json=body, headers=key)
    assert ok(r) == first and r.headers["idempotent-replayed"] == "true"
    assert (await app.broker.queue("orders.sms").stats()).visible == 1


async def test_a_repeat_while_the_first_runs_is_409_and_a_full_queue_is_not_kept() -> None:
    async with serving() as s:  # the real clock: a blocked send waits for room
        api = s.http
        ok(await api.put("/v1/queues/tight", json={"max_length": 1, "overflow": "block"}))
        ok(await api.post("/v1/queues/tight/messages", json=_send("first")))
        key = {"Idempotency-Key": "blocked-1"}
        body = {**_send("second"), "timeout": 5.0}
        # two identical requests at once: one claims the key and waits for room in the
        # queue, the other is told at once that the first is still running
        both = {
            asyncio.create_task(api.post("/v1/queues/tight/messages", json=body, headers=key))
            for _ in range(2)
        }
        done, pending = await asyncio.wait(both, timeout=4, return_when=asyncio.FIRST_COMPLETED)
        assert len(done) == 1 and len(pending) == 1
        r = done.pop().result()
        assert (r.status_code, r.json()["error"]) == (409, "idempotency_key_in_use")
        assert r.headers["retry-after"] == "1"
        (msg,) = await s.broker.queue("tight").receive()
        await msg.ack()  # room again: the blocked send goes through
        first = await pending.pop()
        replay = await api.post("/v1/queues/tight/messages", json=body, headers=key)
        assert ok(replay) == ok(first) and replay.headers["idempotent-replayed"] == "true"

        # 429 stored nothing, so a retry with the same key runs again
        ok(await api.put("/v1/queues/tight", json={"max_length": 1, "overflow": "reject"}))
        key = {"Idempotency-Key": "full-1"}
        r = await api.post("/v1/queues/tight/messages", json=_send("third"), headers=key)
        assert r.status_code == 429
        (msg,) = await s.broker.queue("tight").receive()
        await msg.ack()
        r = await api.post("/v1/queues/tight/messages", json=_send("third"), headers=key)
        assert ok(r)["ids"] and "idempotent-replayed" not in r.headers


async def test_keys_belong_to_the_api_key_that_sent_them() -> None:
    async with serving(keys=KeyRing.parse(KEYS)) as s:
        api = s.http

        def auth(key: str) -> dict[str, str]:
            return {"Authorization": f"Bearer {key}", "Idempotency-Key": "shared-1"}

        ok(await api.put("/v1/queues/jobs", json={}, headers={"Authorization": f"Bearer {ADMIN}"}))
        # refused before the key is looked at: it stays free for the real request
        path = "/v1/queues/jobs/messages"
        nobody = {"Idempotency-Key": "shared-1"}
        assert (await api.post(path, json=_send("x"), headers=nobody)).status_code == 401
        assert (await api.post(path, json=_send("x"), headers=auth(RECEIVER))).status_code == 403
        a = await api.post("/v1/queues/jobs/messages", json=_send("x"), headers=auth(SENDER))
        b = await api.post("/v1/queues/jobs/messages", json=_send("x"), headers=auth(BOTH))
        assert ok(a) != ok(b) and "idempotent-replayed" not in b.headers
        c = await api.post("/v1/queues/jobs/messages", json=_send("x"), headers=auth(SENDER))
        assert ok(c) == ok(a) and c.headers["idempotent-replayed"] == "true"
        assert (await s.broker.queue("jobs").stats()).sent == 2


async def test_with_workers_the_server_admits_at_the_room_rate() -> None:
    async with serving(workers=True) as s:  # the real clock: the admitter ticks
        api = s.http
        ok(await api.put("/v1/rooms/ev-done", json={}))
        ok(await api.post("/v1/rooms/ev-done/sold-out"))
        ok(await api.put("/v1/rooms/ev-88", json={"admit_rate": 20}))
        tickets = [
            ok(await api.post("/v1/rooms/ev-88/join", json={"fan": f"fan-{i}"}))["ticket"]
            for i in range(3)
        ]
        for _ in range(200):
            states = [
                ok(await api.get("/v1/rooms/ev-88/status", params={"ticket": t}))["state"]
                for t in tickets
            ]
            if states == ["admitted"] * 3:
                break
            await asyncio.sleep(0.05)
        assert states == ["admitted"] * 3
        assert ok(await api.get("/v1/rooms/ev-88"))["admitter"] is not None
        assert ok(await api.get("/v1/rooms/ev-done"))["admitter"] is None


async def test_a_send_to_a_queue_not_declared_yet_is_not_kept() -> None:
    """A 404 stored nothing: once the queue is declared, the retry with the same key runs
    (it was replayed as 404 for 24 hours)."""
    async with serving() as s:
        api = s.http
        key = {"Idempotency-Key": "early-1"}
        r = await api.post("/v1/queues/later/messages", json=_send("x"), headers=key)
        assert r.status_code == 404
        ok(await api.put("/v1/queues/later", json={}))
        r = await api.post("/v1/queues/later/messages", json=_send("x"), headers=key)
        assert ok(r)["ids"] and "idempotent-replayed" not in r.headers
        again = await api.post("/v1/queues/later/messages", json=_send("x"), headers=key)
        assert ok(again) == ok(r) and again.headers["idempotent-replayed"] == "true"
