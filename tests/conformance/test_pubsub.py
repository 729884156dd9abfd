"""SPEC §4 (publish/subscribe) on every backend: copies per subscription, atomic
publishes, filters, routing, deduplication, ephemeral listeners."""

from __future__ import annotations

import asyncio
import time

import pytest

import fairq

Outgoing = fairq.Outgoing


async def drain(q: fairq.Queue) -> list[fairq.Received]:
    out = []
    while batch := await q.receive(max_messages=100):
        out += batch
        await q.ack_batch([m.receipt for m in batch])
    return out


# -- rule 1: a copy per subscription; a subscription is a queue ------------------------------
async def test_rule1_every_subscription_gets_a_copy(broker: fairq.Broker) -> None:
    t = await broker.declare_topic("order-events")
    subs = {name: await t.subscribe(name) for name in ("notification", "search", "analytics")}
    r = await t.publish({"type": "OrderConfirmed", "order": "o-7731"})
    assert r.subscriptions == ["analytics", "notification", "search"]
    for name, q in subs.items():
        assert q.name == f"order-events.{name}"
        (m,) = await q.receive()
        assert m.json() == {"type": "OrderConfirmed", "order": "o-7731"}
        assert m.queue == f"order-events.{name}"
        await m.ack()


async def test_rule1_consumers_compete_inside_a_subscription(broker: fairq.Broker) -> None:
    t = await broker.declare_topic("events")
    q = await t.subscribe("workers", visibility_timeout=5, max_attempts=2)
    await t.publish_batch([Outgoing(str(i)) for i in range(10)])
    a, b = await asyncio.gather(q.receive(max_messages=6), q.receive(max_messages=6))
    assert sorted(m.body for m in a + b) == sorted(str(i).encode() for i in range(10))
    assert {m.id for m in a}.isdisjoint({m.id for m in b})
    # queue behaviours apply: nack to the last attempt dead-letters into <queue>.dlq
    m = a[0]
    await m.nack()
    (m,) = [x for x in await q.receive(max_messages=10) if x.id == m.id]
    await m.nack()
    (dead,) = await broker.queue("events.workers.dlq").receive()
    assert dead.attributes["fairq.reason"] == "max_attempts"
    assert (await q.stats()).dead_lettered == 1


@pytest.mark.requires("bounded.atomic")
async def test_rule1_copies_are_atomic_when_a_subscription_is_full(broker: fairq.Broker) -> None:
    t = await broker.declare_topic("atomic")
    roomy = await t.subscribe("roomy")
    tight = await t.subscribe("tight", max_length=2)
    await t.publish_batch([Outgoing(b"1"), Outgoing(b"2")])
    with pytest.raises(fairq.QueueFull):
        await t.publish(b"3")
    with pytest.raises(fairq.QueueFull):
        await t.publish_batch([Outgoing(b"x") for _ in range(3)])
    assert (await roomy.stats()).sent == 2, "no copy may land when another cannot"
    assert (await tight.stats()).sent == 2
    assert (await t.stats()).published == 2


async def test_rule1_a_batch_larger_than_a_bounded_subscription_is_refused_whole(
    broker: fairq.Broker,
) -> None:
    """More copies for a bounded ``reject`` subscription than its ``max_length``: nothing of
    the batch goes anywhere, on every engine (RabbitMQ checks before publishing)."""
    t = await broker.declare_topic("whole")
    roomy = await t.subscribe("roomy")
    small = await t.subscribe("small", max_length=3, overflow="reject")
    with pytest.raises(fairq.QueueFull, match=r"larger than max_length|full"):
        await t.publish_batch([Outgoing(f"{i}") for i in range(5)])
    assert ((await roomy.stats()).sent, (await small.stats()).sent) == (0, 0)
    assert (await roomy.stats()).visible == 0
    s = await t.stats()
    assert (s.published, s.copies) == (0, 0)


@pytest.mark.requires("overflow.block")
async def test_rule1_publish_blocks_on_a_full_blocking_subscription(
    live_broker: fairq.Broker,
) -> None:
    t = await live_broker.declare_topic("blocky")
    q = await t.subscribe("slow", max_length=1, overflow="block")
    await t.publish(b"1")
    pending = asyncio.create_task(t.publish(b"2", timeout=10))
    await asyncio.sleep(0.2)
    assert not pending.done()
    (m,) = await q.receive()
    await m.ack()
    r = await asyncio.wait_for(pending, 5)
    assert r.subscriptions == ["slow"]
    with pytest.raises(fairq.QueueFull):
        await t.publish(b"3", timeout=0.2)


# -- rule 2: only what is published after subscribing ----------------------------------------
async def test_rule2_new_subscription_sees_only_later_messages(broker: fairq.Broker) -> None:
    t = await broker.declare_topic("history")
    early = await t.subscribe("early")
    await t.publish(b"before")
    late = await t.subscribe("late")
    await t.publish(b"after")
    assert [m.body for m in await drain(early)] == [b"before", b"after"]
    assert [m.body for m in await drain(late)] == [b"after"]


# -- rule 3: filter policies -----------------------------------------------------------------
async def test_rule3_filter_policies(broker: fairq.Broker) -> None:
    t = await broker.declare_topic("orders")
    sms = await t.subscribe("sms", filter={"channel": ["sms"]})
    big = await t.subscribe(
        "big", filter={"total": [{"numeric": [">=", 100]}], "country": ["br", "pt"]}
    )
    not_test = await t.subscribe("real", filter={"env": [{"anything-but": ["test"]}]})
    vip = await t.subscribe(
        "vip", filter={"tier": [{"prefix": "gold"}], "flagged": [{"exists": False}]}
    )
    plan = [
        ({"channel": "sms", "env": "prod"}, {"sms", "real"}),
        ({"channel": "email", "total": "250", "country": "br", "env": "test"}, {"big"}),
        ({"total": "99.5", "country": "br"}, set()),
        ({"tier": "gold-plus"}, {"vip"}),
        ({"tier": "gold", "flagged": "yes"}, set()),
        ({"env": "staging"}, {"real"}),
    ]
    for attrs, expected in plan:
        r = await t.publish(b"e", attributes=attrs)
        assert set(r.subscriptions) == expected, attrs
    assert len(await drain(sms)) == 1
    assert len(await drain(big)) == 1
    assert len(await drain(not_test)) == 2
    assert len(await drain(vip)) == 1


@pytest.mark.parametrize(
    "policy",
    [
        {"channel": []},
        {"channel": [{"prefix": 3}]},
        {"channel": [{"no-such-operator": "x"}]},
        {"total": [{"numeric": [">", "x"]}]},
        {"total": [{"numeric": ["<", 10, ">", 20]}]},
        {"a": [{"exists": "maybe"}]},
        {"": ["x"]},
        ["not", "a", "dict"],
    ],
)
async def test_rule3_invalid_filter_at_subscribe(broker: fairq.Broker, policy: object) -> None:
    t = await broker.declare_topic("strict")
    with pytest.raises(fairq.InvalidFilter):
        await t.subscribe("bad", filter=policy)  # type: ignore[arg-type]
    assert await t.subscriptions() == []
    assert await broker.list_queues() == []


# -- rule 4: routing -------------------------------------------------------------------------
async def test_rule4_topic_direct_and_fanout_routing(broker: fairq.Broker) -> None:
    t = await broker.declare_topic("routed")
    await t.subscribe("br", routing="order.*.br")
    await t.subscribe("orders", routing="order.#")
    await t.subscribe("direct", routing="order.confirmed.pt")
    await t.subscribe("all")
    cases = [
        ("order.confirmed.br", {"br", "orders", "all"}),
        ("order.confirmed.pt", {"orders", "direct", "all"}),
        ("order", {"orders", "all"}),
        ("order.cancelled.x.br", {"orders", "all"}),
        ("payment.done", {"all"}),
        ("", {"all"}),
    ]
    for key, expected in cases:
        r = await t.publish(b"x", routing_key=key)
        assert set(r.subscriptions) == expected, key
    (m,) = await broker.queue("routed.direct").receive()
    assert m.attributes == {"fairq.routing_key": "order.confirmed.pt"}


async def test_rule4_routing_and_filter_together(broker: fairq.Broker) -> None:
    t = await broker.declare_topic("both")
    await t.subscribe("br-sms", routing="order.*.br", filter={"channel": ["sms"]})
    assert (
        await t.publish(b"x", {"channel": "sms"}, routing_key="order.confirmed.br")
    ).subscriptions == ["br-sms"]
    assert (
        await t.publish(b"x", {"channel": "sms"}, routing_key="order.confirmed.pt")
    ).subscriptions == []
    assert (
        await t.publish(b"x", {"channel": "app"}, routing_key="order.confirmed.br")
    ).subscriptions == []


@pytest.mark.parametrize("pattern", ["a*.b", "a.#x", "*a", "a.b#"])
async def test_rule4_invalid_routing_pattern(broker: fairq.Broker, pattern: str) -> None:
    t = await broker.declare_topic("patterns")
    with pytest.raises(fairq.InvalidFilter):
        await t.subscribe("bad", routing=pattern)


async def test_no_matching_subscription_is_fine(broker: fairq.Broker) -> None:
    t = await broker.declare_topic("lonely")
    r = await t.publish(b"anyone?")
    assert r.subscriptions == [] and isinstance(r.message_id, str)
    s = await t.stats()
    assert (s.published, s.copies, s.unmatched, s.subscriptions) == (1, 0, 1, 0)


# -- deduplication, delay, batches -----------------------------------------------------------
async def test_dedup_per_topic(broker: fairq.Broker, clock: fairq.ManualClock) -> None:
    t = await broker.declare_topic("dedup", dedup_window=60)
    q = await t.subscribe("s")
    first = await t.publish(b"1", dedup_id="evt-1")
    again = await t.publish(b"2", dedup_id="evt-1")
    assert not first.duplicate and again.duplicate
    assert (again.message_id, again.subscriptions) == (first.message_id, first.subscriptions)
    other = await broker.declare_topic("other")
    assert (await other.publish(b"x", dedup_id="evt-1")).message_id != first.message_id
    clock.advance(61)
    later = await t.publish(b"3", dedup_id="evt-1")
    assert later.message_id != first.message_id
    assert [m.body for m in await drain(q)] == [b"1", b"3"]


@pytest.mark.requires("clock.delays")
async def test_publish_batch_and_delay(broker: fairq.Broker, clock: fairq.ManualClock) -> None:
    t = await broker.declare_topic("batch")
    q = await t.subscribe("s", routing="keep.#")
    results = await t.publish_batch(
        [
            Outgoing(b"a", routing_key="keep.a"),
            Outgoing(b"b", routing_key="drop"),
            Outgoing(b"c", routing_key="keep.c", delay=10),
        ]
    )
    assert [r.subscriptions for r in results] == [["s"], [], ["s"]]
    assert len({r.message_id for r in results}) == 3
    assert [m.body for m in await drain(q)] == [b"a"]
    clock.advance(11)
    assert [m.body for m in await drain(q)] == [b"c"]
    with pytest.raises(fairq.InvalidMessage):
        await t.publish_batch([Outgoing(b"x", priority=1)])


# -- managing topics and subscriptions -------------------------------------------------------
async def test_manage_topics(broker: fairq.Broker) -> None:
    t = await broker.declare_topic("orders")
    await broker.declare_topic("payments")
    assert await broker.list_topics() == ["orders", "payments"]
    assert await broker.list_topics(prefix="pay") == ["payments"]
    q = await t.subscribe("sms", filter={"channel": ["sms"]})
    await t.subscribe("sms", filter={"channel": ["email"]}, visibility_timeout=9)  # update
    (sub,) = await t.subscriptions()
    assert (sub.name, sub.queue, sub.filter) == ("sms", "orders.sms", {"channel": ["email"]})
    assert (await q.config()).visibility_timeout == 9
    assert (await t.publish(b"x", {"channel": "email"})).subscriptions == ["sms"]
    assert await t.unsubscribe("sms") is True
    assert await t.unsubscribe("sms") is False
    with pytest.raises(fairq.QueueNotFound):
        await q.receive()
    await t.subscribe("again")
    assert await broker.delete_topic("orders") is True
    assert "orders.again" not in await broker.list_queues()
    with pytest.raises(fairq.TopicNotFound):
        await broker.topic("orders").publish(b"x")
    with pytest.raises(fairq.TopicNotFound):
        await broker.topic("never").subscribe("s")


async def test_subscription_queue_name_clash(broker: fairq.Broker) -> None:
    await broker.declare_queue("t.s")
    t = await broker.declare_topic("t")
    with pytest.raises(fairq.ConfigConflict):
        await t.subscribe("s")


async def test_deleting_a_subscription_queue_removes_the_subscription(broker: fairq.Broker) -> None:
    t = await broker.declare_topic("t2")
    await t.subscribe("s")
    await broker.delete_queue("t2.s")
    assert await t.subscriptions() == []
    assert (await t.publish(b"x")).subscriptions == []


# -- rule 6: ephemeral listeners -------------------------------------------------------------
async def test_rule6_listen_gets_only_what_is_published_while_listening(
    broker: fairq.Broker,
) -> None:
    t = await broker.declare_topic("live")
    await t.publish(b"before")
    async with t.listen() as listener:
        await t.publish(b"one")
        await t.publish_batch([Outgoing(b"two"), Outgoing(b"three")])
        got = [await listener.get(timeout=1) for _ in range(3)]
        assert [m.body for m in got if m] == [b"one", b"two", b"three"]
        assert await listener.get(timeout=0.05) is None
    await t.publish(b"after")
    assert (await t.stats()).copies == 0, "nothing is stored for a listener"


async def test_rule6_listen_gets_no_duplicates(broker: fairq.Broker) -> None:
    t = await broker.declare_topic("live-dedup", dedup_window=60)
    async with t.listen() as listener:
        await t.publish(b"one", dedup_id="e-1")
        again = await t.publish(b"one again", dedup_id="e-1")
        batch = await t.publish_batch(
            [Outgoing(b"two", dedup_id="e-2"), Outgoing(b"two again", dedup_id="e-2")]
        )
        assert again.duplicate and [r.duplicate for r in batch] == [False, True]
        got = [await listener.get(timeout=1) for _ in range(2)]
        assert [m.body for m in got if m] == [b"one", b"two"]
        assert await listener.get(timeout=0.05) is None, "a duplicate publishes nothing"


async def test_rule6_listen_with_routing_and_filter(broker: fairq.Broker) -> None:
    t = await broker.declare_topic("live2")
    async with t.listen(routing="typing.#", filter={"room": ["42"]}) as listener:
        await t.publish(b"no", {"room": "42"}, routing_key="message.sent")
        await t.publish(b"no", {"room": "7"}, routing_key="typing.start")
        await t.publish(b"yes", {"room": "42"}, routing_key="typing.start")
        m = await listener.get(timeout=1)
        assert m is not None and m.body == b"yes"
        assert await listener.get(timeout=0.05) is None
    # a listener's message reads as a subscription's copy of it does
    copies = await t.subscribe("copies")
    async with t.listen() as listener:
        await t.publish(b"both", {"room": "1"}, routing_key="typing.stop")
        heard = await listener.get(timeout=1)
    (copy,) = await copies.receive()
    assert heard is not None
    assert (
        (heard.attempt, heard.attributes)
        == (copy.attempt, copy.attributes)
        == (
            1,
            {"room": "1", "fairq.routing_key": "typing.stop"},
        )
    )
    assert heard.enqueued_at == copy.enqueued_at


async def test_rule6_slow_listener_loses_the_oldest(broker: fairq.Broker) -> None:
    t = await broker.declare_topic("firehose")
    listener = t.listen(buffer=3)
    await t.publish_batch([Outgoing(str(i)) for i in range(10)])
    got = [await listener.get(timeout=1) for _ in range(3)]
    assert [m.body for m in got if m] == [b"7", b"8", b"9"]
    assert listener.dropped == 7
    await listener.close()
    assert [m async for m in listener] == []


async def test_rule6_listen_as_async_iterator(live_broker: fairq.Broker) -> None:
    t = await live_broker.declare_topic("iter")
    seen: list[bytes] = []

    async def consume() -> None:
        async for m in t.listen():
            seen.append(m.body)
            if len(seen) == 3:
                return

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.05)
    started = time.monotonic()
    for i in range(3):
        await t.publish(str(i))
    await asyncio.wait_for(task, 2)
    assert seen == [b"0", b"1", b"2"] and time.monotonic() - started < 1


# -- property: publish reaches exactly the matching subscriptions ----------------------------
POLICIES = [
    None,
    {"channel": ["sms"]},
    {"channel": ["sms", "push"], "country": [{"anything-but": ["us"]}]},
    {"total": [{"numeric": [">", 10, "<=", 100]}]},
    {"tier": [{"prefix": "go"}]},
    {"flag": [{"exists": True}]},
    {"flag": [{"exists": False}], "channel": ["email"]},
]
PATTERNS = [None, "#", "order.*", "order.#", "*.*.br", "order.confirmed.br", "#.br", "a.#.b", ""]
KEYS = ["", "order", "order.confirmed", "order.confirmed.br", "x.y.br", "a.b", "a.x.y.b", "br"]


@pytest.mark.parametrize("seed", range(3))
async def test_publish_matches_brute_force(broker: fairq.Broker, seed: int) -> None:
    import random

    from fairq.filters import compile_filter
    from fairq.routing import topic_matches

    rng = random.Random(seed)
    t = await broker.declare_topic(f"prop{seed}")
    subs = {}
    for i in range(12):
        policy, pattern = rng.choice(POLICIES), rng.choice(PATTERNS)
        subs[f"s{i}"] = (policy, pattern)
        await t.subscribe(f"s{i}", filter=policy, routing=pattern, dead_letter=None)
    for _ in range(60):
        attrs = {
            k: rng.choice(values)
            for k, values in {
                "channel": ["sms", "push", "email"],
                "country": ["us", "br"],
                "total": ["5", "10", "50", "100", "101", "x"],
                "tier": ["gold", "silver", "go"],
                "flag": ["1"],
            }.items()
            if rng.random() < 0.5
        }
        key = rng.choice(KEYS)
        expected = sorted(
            name
            for name, (policy, pattern) in subs.items()
            if (pattern is None or topic_matches(pattern, key))
            and compile_filter(policy).matches(attrs)
        )
        assert (await t.publish(b"m", attrs, routing_key=key)).subscriptions == expected, (
            attrs,
            key,
        )


async def test_delayed_publish_on_the_real_clock(live_broker: fairq.Broker) -> None:
    t = await live_broker.declare_topic("later")
    a = await t.subscribe("a")
    b = await t.subscribe("b", routing="keep.#")
    started = time.monotonic()
    r = await t.publish(b"x", routing_key="keep.1", delay=1.0)
    assert r.subscriptions == ["a", "b"]
    early = await a.receive(wait=0.1)
    # never before its delay; a machine slow enough to spend the whole delay
    # between publish and this receive may see it, but not sooner
    assert early == [] or time.monotonic() - started >= 1.0
    for q in (a, b):
        (m,) = early if q is a and early else await q.receive(wait=5)
        assert m.body == b"x" and m.attributes["fairq.routing_key"] == "keep.1"
    assert time.monotonic() - started >= 0.95


async def test_a_filter_dict_changed_after_subscribe_does_not_change_the_subscription(
    broker: fairq.Broker,
) -> None:
    t = await broker.declare_topic("copied-filter")
    policy: dict[str, object] = {"channel": ["sms"]}
    await t.subscribe("sms", filter=policy)
    policy["channel"] = ["email"]
    got = await t.publish({"x": 1}, {"channel": "sms"})
    assert got.subscriptions == ["sms"]
    (sub,) = await t.subscriptions()
    assert sub.filter == {"channel": ["sms"]}


async def test_rule2_a_subscription_made_by_another_broker_gets_the_next_publish(
    live_broker: fairq.Broker, url: str, backend_name: str
) -> None:
    """SPEC §4 rule 2 across brokers (processes): a publisher that has published to the
    topic before reaches a subscription made elsewhere as soon as its subscribe returned,
    and stops naming one removed elsewhere."""
    other = live_broker if backend_name == "memory" else await fairq.connect(url)
    try:
        t = await live_broker.declare_topic("seen-elsewhere")
        await t.subscribe("first")
        assert (await t.publish("warm")).subscriptions == ["first"]  # the publisher's view
        elsewhere = other.topic("seen-elsewhere")
        late = await elsewhere.subscribe("late")
        assert sorted((await t.publish("next")).subscriptions) == ["first", "late"]
        (got,) = await late.receive(wait=2)
        assert got.body == b"next"
        await elsewhere.unsubscribe("late")
        assert (await t.publish("after")).subscriptions == ["first"]
        await other.delete_queue("seen-elsewhere.first")
        assert (await t.publish("none")).subscriptions == []
    finally:
        if other is not live_broker:
            await other.close()


async def test_a_subscription_whose_dead_letters_would_go_to_another_subscription_is_refused(
    broker: fairq.Broker,
) -> None:
    """Subscription "y" dead-letters to "<topic>.y.dlq" by default: when that is subscription
    "y.dlq"'s queue, dead letters would mix with its copies (the other order of the two
    subscribes is refused by the queue's own check)."""
    t = await broker.declare_topic("names")
    await t.subscribe("y.dlq")
    with pytest.raises(fairq.ConfigConflict, match=r"is subscription 'y\.dlq'"):
        await t.subscribe("y")
    assert [s.name for s in await t.subscriptions()] == ["y.dlq"]
    await t.subscribe("y", dead_letter="names.y.dead")  # another DLQ: fine


async def test_unsubscribe_and_delete_topic_leave_the_dead_letter_queues(
    broker: fairq.Broker,
) -> None:
    t = await broker.declare_topic("leaving")
    for name in ("a", "b"):
        await t.subscribe(name, max_attempts=1)
    await t.publish("poison")
    for name in ("a", "b"):
        (m,) = await broker.queue(f"leaving.{name}").receive()
        await m.nack()  # its last attempt: dead-lettered
    await t.unsubscribe("a")
    assert await broker.delete_topic("leaving")
    left = await broker.list_queues(prefix="leaving.")
    assert left == ["leaving.a.dlq", "leaving.b.dlq"]
    for name in left:
        assert (await broker.queue(name).stats()).visible == 1


async def test_listening_to_a_topic_that_does_not_exist_raises(broker: fairq.Broker) -> None:
    """It would wait for ever; the server's stream answers TopicNotFound too."""
    with pytest.raises(fairq.TopicNotFound):
        async with broker.topic("never-declared").listen():
            pass
    listener = broker.topic("never-declared").listen()
    with pytest.raises(fairq.TopicNotFound):
        await asyncio.wait_for(listener.__anext__(), 5)
    await listener.close()
