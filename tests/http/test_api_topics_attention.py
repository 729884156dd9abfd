"""The REST API of topics (``/v1/topics``) and attention domains (``/v1/attention``)."""

from __future__ import annotations

import httpx


async def test_topics_subscribe_publish_list_unsubscribe(api: httpx.AsyncClient) -> None:
    r = await api.put("/v1/topics/orders", json={"dedup_window": 60})
    assert r.status_code == 200 and r.json()["dedup_window"] == 60
    r = await api.put(
        "/v1/topics/orders/subscriptions/sms",
        json={
            "filter": {"channel": ["sms"]},
            "routing": "order.#",
            "queue_options": {"max_attempts": 2},
        },
    )
    assert r.status_code == 200, r.text
    assert r.json() == {
        "topic": "orders",
        "name": "sms",
        "queue": "orders.sms",
        "filter": {"channel": ["sms"]},
        "routing": "order.#",
        "push": None,
    }
    assert (await api.get("/v1/queues/orders.sms")).json()["config"]["max_attempts"] == 2
    await api.put("/v1/topics/orders/subscriptions/all")
    r = await api.post(
        "/v1/topics/orders/messages",
        json={
            "messages": [
                {"body": {"o": 1}, "attributes": {"channel": "sms"}, "routing_key": "order.new"},
                {"body": "x", "attributes": {"channel": "mail"}, "routing_key": "order.new"},
                {"body": "y", "routing_key": "other", "dedup_id": "d-1"},
                {"body": "y again", "routing_key": "other", "dedup_id": "d-1"},
            ]
        },
    )
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert [x["subscriptions"] for x in results] == [["all", "sms"], ["all"], ["all"], ["all"]]
    assert results[2]["message_id"] == results[3]["message_id"]
    got = (await api.post("/v1/queues/orders.sms/receive", json={"max_messages": 10})).json()
    assert [m["body"] for m in got["messages"]] == ['{"o":1}']
    assert got["messages"][0]["attributes"]["fairq.routing_key"] == "order.new"
    topic = (await api.get("/v1/topics/orders")).json()
    assert topic["stats"]["published"] == 3 and topic["stats"]["subscriptions"] == 2
    assert [s["name"] for s in topic["subscriptions"]] == ["all", "sms"]
    assert [t["name"] for t in (await api.get("/v1/topics")).json()["topics"]] == ["orders"]
    subs = (await api.get("/v1/topics/orders/subscriptions")).json()["subscriptions"]
    assert [s["queue"] for s in subs] == ["orders.all", "orders.sms"]
    assert (await api.delete("/v1/topics/orders/subscriptions/sms")).status_code == 204
    r = await api.delete("/v1/topics/orders/subscriptions/sms")
    assert r.status_code == 404 and r.json()["error"] == "not_found"
    assert (await api.delete("/v1/topics/orders")).status_code == 204
    r = await api.get("/v1/topics/orders")
    assert r.status_code == 404 and r.json()["error"] == "topic_not_found"


async def test_topic_errors(api: httpx.AsyncClient) -> None:
    r = await api.put("/v1/topics/nope/subscriptions/x")
    assert r.status_code == 404 and r.json()["error"] == "topic_not_found"
    await api.put("/v1/topics/t")
    r = await api.put("/v1/topics/t/subscriptions/x", json={"filter": {"a": [{"bogus": 1}]}})
    assert r.status_code == 422 and r.json()["error"] == "invalid_filter"
    r = await api.put("/v1/topics/t/subscriptions/x", json={"routing": "a.#x"})
    assert r.status_code == 422 and r.json()["error"] == "invalid_filter"
    r = await api.put("/v1/topics/t/subscriptions/x", json={"push": "ftp://x"})
    assert r.status_code == 422 and r.json()["error"] == "validation_error"
    r = await api.post("/v1/topics/t/messages", json={"messages": [{"body": 1, "priority": 1}]})
    assert r.status_code == 422 and r.json()["error"] == "validation_error"
    r = await api.get("/v1/topics/t/stream", params={"filter": "{not json"})
    assert r.status_code == 400 and r.json()["error"] == "bad_request"
    r = await api.get("/v1/topics/t/stream", params={"filter": '{"a": [{"bogus": 1}]}'})
    assert r.status_code == 422 and r.json()["error"] == "invalid_filter"
    r = await api.get("/v1/topics/nope/stream")
    assert r.status_code == 404 and r.json()["error"] == "topic_not_found"


async def test_attention_declare_publish_resources_stats(api: httpx.AsyncClient) -> None:
    r = await api.put(
        "/v1/attention/market",
        json={
            "plans": {"basic": {"max_messages": 5}, "pro": {"max_concurrency": 3}},
            "queue_options": {"max_attempts": 4},
        },
    )
    assert r.status_code == 200, r.text
    info = r.json()
    assert info["queue"] == "attention.market.work"
    assert info["config"]["plans"]["pro"]["max_concurrency"] == 3
    assert info["config"]["queue_options"] == {"max_attempts": 4}
    r = await api.post(
        "/v1/attention/market/keys/store-1/messages",
        json={"messages": [{"body": "a"}, {"body": "b"}, {"body": "c"}]},
    )
    assert r.status_code == 200 and len(r.json()["ids"]) == 3
    await api.post("/v1/attention/market/keys/store-2/messages", json={"messages": [{"body": 1}]})
    stats = (await api.get("/v1/attention/market")).json()["stats"]
    assert stats["keys"] == 2 and stats["signals_pending"] == 2
    keys = (await api.get("/v1/attention/market/keys?top=1")).json()["keys"]
    assert [(k["key"], k["backlog"]) for k in keys] == [("store-1", 3)]
    r = await api.patch(
        "/v1/attention/market/keys/store-1",
        json={"plan": "pro", "state": "paused", "tenant": "group-a"},
    )
    assert r.status_code == 200, r.text
    assert (r.json()["plan"], r.json()["state"], r.json()["tenant"]) == ("pro", "paused", "group-a")
    key = (await api.get("/v1/attention/market/keys/store-1")).json()
    assert key["state"] == "paused" and key["backlog"] == 3
    r = await api.patch("/v1/attention/market/keys/store-1", json={"plan": "gold"})
    assert r.status_code == 422 and r.json()["error"] == "invalid_option"
    r = await api.patch("/v1/attention/market/keys/store-1", json={"state": "asleep"})
    assert r.status_code == 422
    r = await api.get("/v1/attention/market/keys/store-9")
    assert r.status_code == 404 and r.json()["error"] == "not_found"
    r = await api.delete("/v1/attention/market/keys/store-2", params={"purge": "true"})
    assert r.status_code == 204
    assert (await api.get("/v1/attention/market/keys/store-2")).json()["state"] == "removed"
    assert (await api.get("/v1/queues/process.market.store-2.work")).json()["stats"]["visible"] == 0
    assert [d["name"] for d in (await api.get("/v1/attention")).json()["domains"]] == ["market"]
    assert (await api.delete("/v1/attention/market")).status_code == 204
    r = await api.get("/v1/attention/market")
    assert r.status_code == 404 and r.json()["error"] == "attention_not_found"


async def test_attention_errors(api: httpx.AsyncClient) -> None:
    r = await api.post("/v1/attention/none/keys/k/messages", json={"messages": [{"body": 1}]})
    assert r.status_code == 404 and r.json()["error"] == "attention_not_found"
    await api.put("/v1/attention/market")
    r = await api.post(
        "/v1/attention/market/keys/bad key/messages", json={"messages": [{"body": 1}]}
    )
    assert r.status_code == 400 and r.json()["error"] == "invalid_name"
    r = await api.put("/v1/attention/other", json={"work_queue": "no-key-here"})
    assert r.status_code == 422 and r.json()["error"] == "invalid_option"
    r = await api.put("/v1/attention/other", json={"plans": {"basic": {"max_concurrency": 0}}})
    assert r.status_code == 422 and r.json()["error"] == "validation_error"


async def test_attention_weights_charge_and_tenants(api: httpx.AsyncClient) -> None:
    r = await api.put(
        "/v1/attention/shared",
        json={
            "plans": {"basic": {"max_messages": 5}, "gold": {"max_messages": 5, "weight": 2}},
            "charge": "messages",
        },
    )
    assert r.status_code == 200, r.text
    config = r.json()["config"]
    assert config["charge"] == "messages" and config["plans"]["gold"]["weight"] == 2
    assert config["plans"]["basic"]["weight"] == 1
    for key, tenant in (("k1", "acme"), ("k2", "acme"), ("k3", "zeta")):
        await api.patch(f"/v1/attention/shared/keys/{key}", json={"tenant": tenant})
        await api.post(
            f"/v1/attention/shared/keys/{key}/messages", json={"messages": [{"body": 1}]}
        )
    r = await api.get("/v1/attention/shared/tenants", params={"top": 5})
    assert r.status_code == 200, r.text
    rows = {t["tenant"]: t for t in r.json()["tenants"]}
    assert (rows["acme"]["backlog"], rows["acme"]["keys"], rows["zeta"]["backlog"]) == (2, 2, 1)
    assert rows["acme"]["share"] == 0 and rows["acme"]["at_cap"] is False
    assert (await api.get("/v1/attention/shared/tenants", params={"top": 0})).status_code == 422
    assert (await api.get("/v1/attention/none/tenants")).status_code == 404
    for bad in ({"charge": "bytes"}, {"plans": {"basic": {"weight": 0}}}):
        r = await api.put("/v1/attention/other", json=bad)
        assert r.status_code == 422, r.text
