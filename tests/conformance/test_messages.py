"""SPEC §1–§2 on every backend: connecting, message ids, bodies, attributes, sizes, names,
and that every bad input is a clear error that stores nothing."""

from __future__ import annotations

import pytest

import fairq
from fairq.errors import FairqError


async def test_ids_are_unique_and_sort_by_send_time(
    broker: fairq.Broker, clock: fairq.ManualClock
) -> None:
    q = await broker.declare_queue("ids")
    ids = []
    for i in range(50):
        ids.append(await q.send(f"m{i}"))
        if i % 10 == 0:
            clock.advance(0.001)
    ids += await q.send_batch([fairq.Outgoing(b"x") for _ in range(50)])
    assert len(set(ids)) == 100
    assert all(isinstance(i, str) for i in ids)
    assert ids == sorted(ids)
    got = await q.receive(max_messages=100)
    assert [m.id for m in got] == ids


async def test_bodies_bytes_str_and_json(broker: fairq.Broker) -> None:
    q = await broker.declare_queue("bodies")
    await q.send(b"\x00\xffraw")
    await q.send("olá")
    await q.send({"order": "o-7731", "seats": ["B-12", "B-13"]})
    await q.send([1, 2, 3], attributes={"content-type": "application/x-mine"})
    m1, m2, m3, m4 = await q.receive(max_messages=4)
    assert m1.body == b"\x00\xffraw" and m1.attributes == {}
    assert m2.body == "olá".encode() and m2.text() == "olá" and m2.attributes == {}
    assert m3.json() == {"order": "o-7731", "seats": ["B-12", "B-13"]}
    assert m3.attributes == {"content-type": "application/json"}
    assert m4.json() == [1, 2, 3]
    assert m4.attributes == {"content-type": "application/x-mine"}  # the user's own wins


async def test_received_fields(broker: fairq.Broker, clock: fairq.ManualClock) -> None:
    q = await broker.declare_queue("fields", max_priority=5)
    sent_at = clock.now()
    mid = await q.send(b"x", attributes={"k": "v"}, priority=3, group="g1")
    (m,) = await q.receive()
    assert (m.id, m.body, m.attributes, m.attempt, m.priority, m.group, m.queue, m.key) == (
        mid,
        b"x",
        {"k": "v"},
        1,
        3,
        "g1",
        "fields",
        None,
    )
    assert abs(m.enqueued_at - sent_at) < 0.002
    assert isinstance(m.receipt, str) and m.receipt


async def test_nul_characters_are_refused_before_anything_is_stored(broker: fairq.Broker) -> None:
    q = await broker.declare_queue("nul")
    for options in ({"group": "a\x00b"}, {"dedup_id": "d\x00"}):
        with pytest.raises(fairq.InvalidMessage, match="NUL"):
            await q.send(b"x", **options)  # type: ignore[arg-type]
    if "pubsub" not in broker.backend.missing:
        topic = await broker.declare_topic("nul-t")
        with pytest.raises(fairq.InvalidMessage, match="NUL"):
            await topic.publish(b"x", routing_key="a\x00b")
    assert (await q.stats()).sent == 0


async def test_a_batch_mixing_a_zero_delay_and_a_delay_is_stored(broker: fairq.Broker) -> None:
    q = await broker.declare_queue("mixed")
    await q.send_batch([fairq.Outgoing("now", delay=0), fairq.Outgoing("later", delay=30)])
    assert [m.body for m in await q.receive(max_messages=5)] == [b"now"]
    if "stats.delayed" not in broker.backend.missing:  # RabbitMQ cannot count them
        assert (await q.stats()).delayed == 1


async def test_a_group_on_a_plain_queue_is_delivered_with_the_message(broker: fairq.Broker) -> None:
    q = await broker.declare_queue("grouped")
    await q.send(b"x", group="A")
    (m,) = await q.receive()
    assert m.group == "A"


async def test_attributes_limits(broker: fairq.Broker) -> None:
    q = await broker.declare_queue("attrs")
    ok = {f"k{i}": "v" for i in range(32)}
    await q.send(b"x", attributes=ok)
    (m,) = await q.receive()
    assert m.attributes == ok
    for bad in (
        {f"k{i}": "v" for i in range(33)},  # too many
        {"": "v"},  # empty key
        {"k" * 129: "v"},  # key too long
        {"k": 1},  # not a str value
        {1: "v"},  # not a str key
        ["k", "v"],  # not a mapping
        {"k": "a\x00b"},  # NUL: PostgreSQL's text refuses it, so every engine does
        {"k\x00": "v"},
    ):
        with pytest.raises(fairq.InvalidMessage):
            await q.send(b"x", attributes=bad)  # type: ignore[arg-type]
    with pytest.raises(fairq.InvalidMessage):  # 32 user attributes leave no room for content-type
        await q.send({"json": True}, attributes=ok)
    assert (await q.stats()).sent == 1


async def test_message_too_large_stores_nothing(url: str, clock: fairq.ManualClock) -> None:
    async with await fairq.connect(url, clock=clock, max_message_bytes=1000) as broker:
        q = await broker.declare_queue("big")
        await q.send(b"x" * 1000)
        with pytest.raises(fairq.MessageTooLarge) as info:
            await q.send(b"x" * 1001)
        assert info.value.size == 1001 and info.value.limit == 1000
        with pytest.raises(fairq.MessageTooLarge):
            await q.send_batch([fairq.Outgoing(b"ok"), fairq.Outgoing(b"y" * 5000)])
        s = await q.stats()
        assert s.sent == 1 and s.visible == 1


async def test_default_size_limit_is_256_kib(broker: fairq.Broker) -> None:
    q = await broker.declare_queue("limit")
    await q.send(b"x" * 262_144)
    with pytest.raises(fairq.MessageTooLarge):
        await q.send(b"x" * 262_145)


async def test_unencodable_body(broker: fairq.Broker) -> None:
    q = await broker.declare_queue("enc")
    with pytest.raises(fairq.InvalidMessage):
        await q.send(object())
    assert (await q.stats()).sent == 0


@pytest.mark.parametrize(
    "name", ["", "a" * 201, "has space", "slash/no", "ünïcode", "tab\t", "q?", "a*b", None, 7]
)
async def test_invalid_queue_names(broker: fairq.Broker, name: object) -> None:
    with pytest.raises(fairq.InvalidName):
        await broker.declare_queue(name)  # type: ignore[arg-type]
    with pytest.raises(fairq.InvalidName):
        broker.queue(name)  # type: ignore[arg-type]
    assert await broker.list_queues() == []


async def test_a_name_too_long_for_its_default_dlq_says_so(broker: fairq.Broker) -> None:
    await broker.declare_queue("a" * 196)  # with ".dlq": 200 characters
    assert await broker.list_queues() == ["a" * 196, "a" * 196 + ".dlq"]
    with pytest.raises(fairq.InvalidName, match="use at most 196, or pass dead_letter="):
        await broker.declare_queue("b" * 197)
    assert len(await broker.list_queues()) == 2


@pytest.mark.parametrize("name", ["a", "A" * 200, "ticket-pdf", "orders.v2:eu_west-1", "1.2.3"])
async def test_valid_queue_names(broker: fairq.Broker, name: str) -> None:
    q = await broker.declare_queue(name, dead_letter=None)
    assert q.name == name
    assert await broker.list_queues() == [name]


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("visibility_timeout", 0),
        ("visibility_timeout", -1),
        ("visibility_timeout", float("nan")),
        ("visibility_timeout", "30"),
        ("max_attempts", 0),
        ("max_attempts", 1.5),
        ("dead_letter", "bad name"),
        ("retention", 0),
        ("retention", 1e12),
        ("max_length", 0),
        ("max_length", True),
        ("overflow", "explode"),
        ("fifo", "yes"),
        ("max_priority", -1),
        ("max_priority", 256),
        ("dedup_window", -1),
        ("freshness_slo", 0),
    ],
)
async def test_invalid_options(broker: fairq.Broker, option: str, value: object) -> None:
    with pytest.raises((fairq.InvalidOption, fairq.InvalidName)) as info:
        await broker.declare_queue("opts", **{option: value})  # type: ignore[arg-type]
    assert isinstance(info.value, FairqError)
    assert await broker.list_queues() == []


async def test_invalid_send_arguments_store_nothing(broker: fairq.Broker) -> None:
    q = await broker.declare_queue("args", max_priority=2)
    for kwargs in (
        {"delay": -1},
        {"delay": float("inf")},
        {"priority": 3},
        {"priority": -1},
        {"group": ""},
        {"dedup_id": "x" * 129},
    ):
        with pytest.raises(FairqError):
            await q.send(b"x", **kwargs)  # type: ignore[arg-type]
    with pytest.raises(FairqError):
        await q.send_batch([fairq.Outgoing(b"ok"), fairq.Outgoing(b"bad", priority=9)])
    with pytest.raises(fairq.InvalidMessage):
        await q.send_batch([b"not an Outgoing"])  # type: ignore[list-item]
    assert (await q.stats()).sent == 0


async def test_invalid_receive_arguments(broker: fairq.Broker) -> None:
    q = await broker.declare_queue("rargs")
    for kwargs in (
        {"max_messages": 0},
        {"max_messages": 10_001},
        {"visibility_timeout": 0},
        {"wait": -1},
    ):
        with pytest.raises(fairq.InvalidOption):
            await q.receive(**kwargs)  # type: ignore[arg-type]


async def test_malformed_receipt(broker: fairq.Broker) -> None:
    q = await broker.declare_queue("receipts")
    with pytest.raises(fairq.InvalidMessage):
        await q.ack_batch(["not-a-receipt"])


async def test_a_receipt_with_numbers_too_large_is_lost_or_malformed(broker: fairq.Broker) -> None:
    """A well-formed receipt whose lease needs 64 bits names no current lease (SQLite and
    PostgreSQL store 63): lost, like any stale receipt, not an engine error; a message id
    of 64 bits is malformed (fairq makes them of 63)."""
    q = await broker.declare_queue("receipts")
    msg_id = await q.send(b"x")
    (m,) = await q.receive()
    for lease in ("ffffffffffffffff", "8000000000000000"):
        with pytest.raises(fairq.LeaseLost):
            await q.ack_batch([f"{msg_id}.{lease}"])
    stale = f"{msg_id}.ffffffffffffffff"
    assert await q.extend_batch([stale], 30) == [stale]
    with pytest.raises(fairq.InvalidMessage):
        await q.ack_batch(["ffffffffffffffff.1"])
    await m.ack()  # the real lease lived on
    assert (await q.stats()).acked == 1


async def test_unknown_scheme_is_connection_error() -> None:
    with pytest.raises(fairq.ConnectionError) as info:
        await fairq.connect("nosuch://user:secret@host/db")
    assert "secret" not in str(info.value) and "***" in str(info.value)


async def test_unreachable_sqlite_path(tmp_path: object) -> None:
    with pytest.raises(fairq.ConnectionError) as info:
        await fairq.connect("sqlite:////nonexistent-dir/deeper/fairq.db")
    assert "does not exist" in str(info.value)
    assert info.value.__cause__ is not None


async def test_every_error_is_a_fairq_error() -> None:
    for name in (
        "ConnectionError",
        "InvalidName",
        "InvalidMessage",
        "MessageTooLarge",
        "InvalidOption",
        "ConfigConflict",
        "QueueNotFound",
        "QueueFull",
        "LeaseLost",
        "Unsupported",
        "Reject",
        "BackendError",
    ):
        assert issubclass(getattr(fairq, name), fairq.FairqError), name
