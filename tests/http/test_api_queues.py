"""The REST API of queues (``/v1/queues``), through httpx's ASGI transport."""

from __future__ import annotations

import asyncio
import base64
import time

import httpx
import orjson
import pytest
from httpsupport import Server, serving


def send_body(*bodies: object, **extra: object) -> dict[str, object]:
    return {"messages": [{"body": b} for b in bodies], **extra}


async def test_declare_list_get_delete(api: httpx.AsyncClient) -> None:
    r = await api.put("/v1/queues/jobs", json={"max_attempts": 3, "freshness_slo": 60})
    assert r.status_code == 200
    info = r.json()
    assert info["name"] == "jobs"
    assert info["config"]["max_attempts"] == 3
    assert info["config"]["dead_letter"] == "jobs.dlq"  # the default, as declare_queue
    assert info["stats"]["visible"] == 0
    r = await api.put("/v1/queues/plain", json={"dead_letter": None})
    assert r.json()["config"]["dead_letter"] is None
    names = [q["name"] for q in (await api.get("/v1/queues")).json()["queues"]]
    assert names == ["jobs", "jobs.dlq", "plain"]
    assert [q["name"] for q in (await api.get("/v1/queues?prefix=jobs.")).json()["queues"]] == [
        "jobs.dlq"
    ]
    assert (await api.get("/v1/queues/jobs")).json()["config"]["freshness_slo"] == 60
    r = await api.put("/v1/queues/jobs", json={"fifo": True})
    assert r.status_code == 409 and r.json()["error"] == "config_conflict"
    assert (await api.delete("/v1/queues/plain")).status_code == 204
    r = await api.delete("/v1/queues/plain")
    assert r.status_code == 404 and r.json()["error"] == "queue_not_found"


async def test_send_receive_ack_roundtrip_with_every_encoding(api: httpx.AsyncClient) -> None:
    await api.put("/v1/queues/jobs")
    raw = bytes(range(256))
    r = await api.post(
        "/v1/queues/jobs/messages",
        json={
            "messages": [
                {"body": {"order": "o-1"}, "attributes": {"channel": "sms"}},
                {"body": "plain text"},
                {"body": base64.b64encode(raw).decode(), "encoding": "base64"},
                {"body": "a json string", "encoding": "json"},
            ]
        },
    )
    assert r.status_code == 200, r.text
    ids = r.json()["ids"]
    assert len(ids) == 4 and ids == sorted(ids)
    r = await api.post("/v1/queues/jobs/receive", json={"max_messages": 10})
    msgs = r.json()["messages"]
    assert [m["id"] for m in msgs] == ids
    first, text, binary, json_string = msgs
    assert first["body"] == '{"order":"o-1"}' and first["encoding"] == "text"
    assert first["attributes"] == {"channel": "sms", "content-type": "application/json"}
    assert first["attempt"] == 1 and first["queue"] == "jobs" and first["receipt"]
    assert text["body"] == "plain text" and "content-type" not in text["attributes"]
    assert binary["encoding"] == "base64" and base64.b64decode(binary["body"]) == raw
    assert json_string["body"] == '"a json string"'
    assert json_string["attributes"]["content-type"] == "application/json"
    receipts = [m["receipt"] for m in msgs]
    r = await api.post("/v1/queues/jobs/ack", json={"receipts": receipts + receipts[:2]})
    assert r.json() == {"acked": 4, "lost": []}  # a receipt named twice acks one message
    r = await api.post("/v1/queues/jobs/ack", json={"receipts": receipts[:1]})
    assert r.json() == {"acked": 0, "lost": receipts[:1]}
    stats = (await api.get("/v1/queues/jobs")).json()["stats"]
    assert stats["sent"] == 4 and stats["acked"] == 4 and stats["visible"] == 0


async def test_nack_extend_dead_letter_peek_purge_redrive(api: httpx.AsyncClient) -> None:
    await api.put("/v1/queues/jobs", json={"max_attempts": 5})
    await api.post("/v1/queues/jobs/messages", json=send_body("a", "b", "c"))
    msgs = (await api.post("/v1/queues/jobs/receive", json={"max_messages": 3})).json()["messages"]
    a, b, c = (m["receipt"] for m in msgs)
    assert (await api.post("/v1/queues/jobs/nack", json={"receipt": a})).status_code == 204
    r = await api.post("/v1/queues/jobs/nack", json={"receipt": a})
    assert r.status_code == 409 and r.json()["error"] == "lease_lost"
    r = await api.post("/v1/queues/jobs/extend", json={"receipts": [b, a], "seconds": 60})
    assert r.json() == {"lost": [a]}
    r = await api.post("/v1/queues/jobs/dead-letter", json={"receipt": c, "reason": "bad order"})
    assert r.status_code == 204
    peeked = (await api.get("/v1/queues/jobs.dlq/messages")).json()["messages"]
    assert [m["body"] for m in peeked] == ["c"] and peeked[0]["receipt"] == ""
    assert peeked[0]["attributes"]["fairq.reason"] == "rejected"
    assert peeked[0]["attributes"]["fairq.detail"] == "bad order"
    peeked = (await api.get("/v1/queues/jobs/messages")).json()["messages"]
    assert [m["body"] for m in peeked] == ["a", "b"]  # b in flight, a nacked
    r = await api.post("/v1/queues/jobs.dlq/redrive", json={})
    assert r.json() == {"moved": 1}
    r = await api.post("/v1/queues/jobs/purge")
    assert r.json() == {"purged": 3}
    assert (await api.get("/v1/queues/jobs")).json()["stats"]["in_flight"] == 0


async def test_long_poll_returns_when_a_message_arrives(api: httpx.AsyncClient) -> None:
    await api.put("/v1/queues/jobs")
    start = time.monotonic()
    poll = asyncio.create_task(api.post("/v1/queues/jobs/receive", json={"wait": 5}))
    await asyncio.sleep(0.2)
    assert not poll.done()
    await api.post("/v1/queues/jobs/messages", json=send_body("wake up"))
    r = await asyncio.wait_for(poll, 3)
    assert [m["body"] for m in r.json()["messages"]] == ["wake up"]
    assert time.monotonic() - start < 3
    empty = await api.post("/v1/queues/jobs/receive", json={"wait": 0.2})
    assert empty.json() == {"messages": []}


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "code"),
    [
        ("POST", "/v1/queues/nope/messages", send_body("x"), 404, "queue_not_found"),
        ("POST", "/v1/queues/nope/receive", {}, 404, "queue_not_found"),
        ("GET", "/v1/queues/bad name", None, 400, "invalid_name"),
        ("POST", "/v1/queues/jobs/receive", {"max_messages": "ten"}, 422, "validation_error"),
        ("POST", "/v1/queues/jobs/receive", {"max_message": 1}, 422, "validation_error"),
        ("POST", "/v1/queues/jobs/receive", {"max_messages": 101}, 422, "validation_error"),
        ("POST", "/v1/queues/jobs/receive", {"wait": 21}, 422, "validation_error"),
        ("POST", "/v1/queues/jobs/messages", {"messages": []}, 422, "validation_error"),
        ("POST", "/v1/queues/jobs/messages", send_body(*range(101)), 422, "validation_error"),
        ("POST", "/v1/queues/jobs/messages", None, 422, "validation_error"),
        (
            "POST",
            "/v1/queues/jobs/messages",
            {"messages": [{"body": "%%%", "encoding": "base64"}]},
            422,
            "invalid_message",
        ),
        (
            "POST",
            "/v1/queues/jobs/messages",
            {"messages": [{"body": 1, "priority": 3}]},
            422,
            "invalid_option",
        ),
        ("POST", "/v1/queues/jobs/ack", {"receipts": ["zz"]}, 422, "validation_error"),
        (
            "POST",
            "/v1/queues/jobs/ack",
            {"receipts": ["f" * 16 + ".1"]},
            422,
            "validation_error",
        ),
        ("PUT", "/v1/queues/jobs", {"overflow": "explode"}, 422, "validation_error"),
        ("PUT", "/v1/queues/jobs", {"dead_letter": "jobs"}, 409, "config_conflict"),
        ("GET", "/v1/nothing-here", None, 404, "not_found"),
        ("PATCH", "/v1/queues/jobs", None, 405, "method_not_allowed"),
    ],
)
async def test_bad_input_is_4xx_json(
    api: httpx.AsyncClient, method: str, path: str, body: object, status: int, code: str
) -> None:
    await api.put("/v1/queues/jobs")
    r = await api.request(method, path, json=body)
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    assert r.json()["error"] == code and r.json()["detail"]


async def test_malformed_json_is_400(api: httpx.AsyncClient) -> None:
    await api.put("/v1/queues/jobs")
    r = await api.post("/v1/queues/jobs/receive", content=b'{"wait": ')
    assert r.status_code == 400 and r.json()["error"] == "bad_request"


async def test_405_lists_every_method_of_the_path(api: httpx.AsyncClient) -> None:
    r = await api.post("/v1/queues/jobs")
    assert r.status_code == 405
    assert set(r.headers["allow"].split(", ")) >= {"GET", "PUT", "DELETE"}


async def test_full_queue_is_429_with_retry_after(api: httpx.AsyncClient) -> None:
    await api.put("/v1/queues/small", json={"max_length": 1})
    await api.post("/v1/queues/small/messages", json=send_body("1"))
    r = await api.post("/v1/queues/small/messages", json=send_body("2"))
    assert r.status_code == 429 and r.json()["error"] == "queue_full"
    assert r.headers["retry-after"] == "1"


async def test_message_too_large_is_413() -> None:
    import fairq

    broker = await fairq.connect("memory://", max_message_bytes=100)
    async with serving(broker) as s:
        await s.http.put("/v1/queues/jobs")
        r = await s.http.post("/v1/queues/jobs/messages", json=send_body("x" * 101))
        assert r.status_code == 413 and r.json()["error"] == "message_too_large"
    await broker.close()


async def test_a_body_over_the_limit_is_refused_before_it_is_read_whole() -> None:
    from fairq.http.api import Limits

    async with serving(limits=Limits(max_body=1000)) as s:
        await s.http.put("/v1/queues/jobs")
        big = b'{"messages": [{"body": "' + b"x" * 5000 + b'"}]}'
        r = await s.http.post("/v1/queues/jobs/messages", content=big)
        assert r.status_code == 413 and r.json()["error"] == "body_too_large"
        assert f"{len(big)} bytes" in r.json()["detail"]

        chunks_read = 0

        async def chunked():  # no Content-Length: the limit counts bytes as they come
            nonlocal chunks_read
            for _ in range(50):
                chunks_read += 1
                yield b" " * 100

        r = await s.http.post("/v1/queues/jobs/messages", content=chunked())
        assert r.status_code == 413 and r.json()["error"] == "body_too_large"
        assert chunks_read < 50, "the body was read to its end"
        assert (await s.http.get("/v1/queues/jobs")).json()["stats"]["sent"] == 0


async def test_default_body_limit_takes_a_whole_batch_of_base64_bodies(server: Server) -> None:
    """A batch of max_batch binary messages of the largest size travels as base64 (4/3 of
    the bytes) in JSON: the default limit takes it (it was size × batch, which refused
    batches that were legal message by message)."""
    from fairq.http.api import Limits

    size = server.broker.max_message_bytes
    limit = Limits().body_limit(size)
    assert limit == (-(-size * 4 // 3) + 1024) * 100
    one = {"body": base64.b64encode(b"\xff" * size).decode(), "encoding": "base64"}
    whole = len(orjson.dumps({"messages": [one] * 100}))
    assert whole <= limit
    r = await server.http.post(
        "/v1/queues/jobs/messages",
        content=b"{}",
        headers={"content-length": str(limit + 1)},
    )
    assert r.status_code == 413
    assert "the server's --max-body" in r.json()["detail"]


async def test_a_batch_that_never_fits_is_422_not_retry_later(api: httpx.AsyncClient) -> None:
    await api.put("/v1/queues/blk", json={"max_length": 1, "overflow": "block"})
    r = await api.post("/v1/queues/blk/messages", json=send_body("b", "c"))
    assert (r.status_code, r.json()["error"]) == (422, "queue_full")
    assert "Retry-After" not in r.headers and "larger than max_length" in r.json()["detail"]
    await api.put("/v1/queues/rej", json={"max_length": 1})
    await api.post("/v1/queues/rej/messages", json=send_body("a"))
    r = await api.post("/v1/queues/rej/messages", json=send_body("b"))
    assert (r.status_code, r.json()["error"], r.headers["Retry-After"]) == (429, "queue_full", "1")


async def test_a_query_parameter_given_twice_is_refused(api: httpx.AsyncClient) -> None:
    # which of the two was meant is anyone's guess: the API answers neither (422)
    r = await api.get("/v1/queues?cursor=a&cursor=b")
    assert r.status_code == 422, r.text
    assert r.json()["error"] == "validation_error" and "cursor" in r.text
    assert (await api.get("/v1/queues?cursor=a&limit=2")).status_code == 200
