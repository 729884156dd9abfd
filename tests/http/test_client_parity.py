"""``fairq.http.Client``'s handles have the methods of their in-process twins: the public
methods are compared by name (the few that differ on purpose are listed, with why), and the
ones added for parity are exercised here (releasing deliveries, a topic's options, a
listener's ``get``, an attention domain's options, key queue and reconciler)."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator

import httpx
import pytest
from httpsupport import Server, uvicorn_serving

import fairq
from fairq.http import Client
from fairq.http.app import create_app
from fairq.http.client import RemoteQueue
from fairq.http.remote import RemoteAttention, RemoteListener, RemoteTopic
from fairq.http.remote_idempotency import RemoteIdempotencyStore
from fairq.http.remote_rooms import RemoteRoom
from fairq.idempotency import IdempotencyStore
from fairq.model.topics import TopicConfig
from fairq.pubsub import Listener

# in-process methods a remote handle does not have, and why
NOT_REMOTE = {
    "Broker": {"clock"},  # the server's clock is its own
    # the admitter runs beside the backend (library or `fairq serve --workers`); the key id
    # is in the JWKS document (`jwks()`); fans join one request each (rate-limited per IP)
    "WaitingRoom": {"run_admitter", "kid", "join_many"},
}
# methods that are coroutines remotely (a call to the server) but not in-process
ASYNC_REMOTELY = {"WaitingRoom": {"verify", "jwks"}}

PAIRS = [
    (fairq.Broker, Client),
    (fairq.Queue, RemoteQueue),
    (fairq.Topic, RemoteTopic),
    (Listener, RemoteListener),
    (fairq.Attention, RemoteAttention),
    (fairq.WaitingRoom, RemoteRoom),
    (IdempotencyStore, RemoteIdempotencyStore),
]


def public(cls: type) -> dict[str, bool]:
    """Public attribute name -> whether it is a coroutine function."""
    return {
        n: inspect.iscoroutinefunction(getattr(cls, n)) for n in dir(cls) if not n.startswith("_")
    }


@pytest.mark.parametrize(("local", "remote"), PAIRS, ids=[p[0].__name__ for p in PAIRS])
def test_each_remote_handle_has_the_in_process_methods(local: type, remote: type) -> None:
    mine, theirs = public(local), public(remote)
    missing = set(mine) - set(theirs) - NOT_REMOTE.get(local.__name__, set())
    assert not missing, f"{remote.__name__} lacks {sorted(missing)}"
    differ = {n for n in set(mine) & set(theirs) if mine[n] != theirs[n]}
    assert differ == ASYNC_REMOTELY.get(local.__name__, set())


@pytest.fixture
async def client(server: Server) -> AsyncIterator[Client]:
    async with Client("http://fairq", transport=httpx.ASGITransport(app=server.app)) as c:
        yield c


async def test_a_mistake_raises_the_in_process_exception_through_the_client(
    server: Server, client: Client
) -> None:
    """The same mistake raises the same exception class through ``fairq.http.Client`` as
    in-process (the client checks what the library checks before it sends)."""
    local_q = await server.broker.declare_queue("mistakes")
    remote_q = client.queue("mistakes")
    room = await server.broker.waiting_room("sale")
    too_many = {f"k{i}": "v" for i in range(33)}
    cases = [
        ("an unencodable body", lambda q: q.send(object())),
        ("an integer too big for JSON", lambda q: q.send(10**30)),
        ("33 attributes", lambda q: q.send(b"x", attributes=too_many)),
        ("a non-str attribute", lambda q: q.send(b"x", attributes={"a": 1})),
        ("an empty attribute key", lambda q: q.send(b"x", attributes={"": "v"})),
        ("an infinite delay", lambda q: q.send(b"x", delay=float("inf"))),
        ("a NaN wait", lambda q: q.receive(wait=float("nan"))),
        ("0 messages", lambda q: q.receive(max_messages=0)),
        ("a malformed receipt", lambda q: q.ack_batch(["garbage"])),
        ("a malformed receipt to extend", lambda q: q.extend_batch(["garbage"], 5)),
    ]
    for what, call in cases:
        with pytest.raises(fairq.FairqError) as local:
            await call(local_q)
        with pytest.raises(fairq.FairqError) as remote:
            await call(remote_q)
        assert type(local.value) in type(remote.value).__mro__, (what, local.value, remote.value)
    with pytest.raises(fairq.InvalidName):
        await room.join("bad fan")
    with pytest.raises(fairq.InvalidName):
        await (await client.room("sale")).join("bad fan")


async def test_release_batch_gives_deliveries_back_without_an_attempt(client: Client) -> None:
    q = await client.declare_queue("jobs", max_attempts=1)
    await q.send_batch([fairq.Outgoing(b"a"), fairq.Outgoing(b"b")])
    taken = await q.receive(max_messages=2)
    assert await q.release_batch([]) == []
    assert await q.release_batch([m.receipt for m in taken]) == []
    assert (await q.stats()).visible == 2
    again = await q.receive(max_messages=2)
    assert [m.attempt for m in again] == [1, 1], "a release is not an attempt"
    await again[0].ack()
    assert await q.release_batch([again[0].receipt, again[1].receipt]) == [again[0].receipt]
    assert (await q.stats()).visible == 1
    with pytest.raises(fairq.QueueNotFound):
        await client.queue("nope").release_batch([again[1].receipt])


async def test_a_topics_options(client: Client) -> None:
    t = await client.declare_topic("orders", dedup_window=60)
    assert await t.config() == TopicConfig(dedup_window=60)
    with pytest.raises(fairq.TopicNotFound):
        await client.topic("nope").config()


async def test_an_attention_domains_options_key_queue_and_reconciler(
    server: Server, client: Client
) -> None:
    plans = {"basic": fairq.Plan(max_concurrency=1, max_messages=5, rate=10.0, burst=2)}
    await client.declare_attention("market", plans=plans, slice_lease=12)
    a = client.attention("market")
    local = server.broker.attention("market")
    assert await a.config() == await local.config()
    q = await a.queue("store-1")
    assert isinstance(q, RemoteQueue) and q.name == (await local.queue("store-1")).name
    with pytest.raises(fairq.InvalidName):
        await a.queue("bad key")
    # a key whose work reached its queue without a signal (written past the attention API)
    await a.publish("store-1", b"1")
    s = await local._take(0)
    assert s is not None
    msgs, retry_at = await local._receive(s, 5, None)
    for m in msgs:
        await m.ack()
    await local._end(s, len(msgs), retry_at)
    await q.send(b"orphan")
    assert await a.reconcile() == 1
    assert await a.reconcile() == 0, "a signal is pending now"
    with pytest.raises(fairq.AttentionNotFound):
        await client.attention("nope").reconcile()


async def test_a_remote_listeners_get() -> None:
    broker = await fairq.connect("memory://")
    async with uvicorn_serving(create_app(broker)) as url, Client(url) as client:
        t = await client.declare_topic("orders")
        listener = t.listen()
        waiting = asyncio.create_task(listener.get(timeout=5))
        await asyncio.sleep(0.3)  # the stream is open before the publish
        await t.publish({"n": 1})
        got = await waiting
        assert got is not None and got.json() == {"n": 1}
        assert await listener.get(timeout=0.2) is None, "nothing more within the timeout"
        # a get that timed out leaves the stream open: the next message still comes
        later = asyncio.create_task(listener.get(timeout=5))
        await asyncio.sleep(0.1)
        await t.publish({"n": 2})
        got = await later
        assert got is not None and got.json() == {"n": 2}
        await listener.close()
        assert await listener.get(timeout=1) is None, "closed: iteration has ended"
    await broker.close()


async def test_a_remote_listener_hears_what_is_published_once_entered() -> None:
    """As in-process: inside ``async with topic.listen()`` the listener is registered, so a
    publish made before the first ``get`` is heard (the stream used to open at that get)."""
    broker = await fairq.connect("memory://")
    async with uvicorn_serving(create_app(broker)) as url, Client(url) as client:
        t = await client.declare_topic("news")
        async with t.listen() as listener:
            await t.publish_batch([fairq.Outgoing(f"{i}") for i in range(3)])
            got = [await listener.get(timeout=5) for _ in range(3)]
            assert [m.body for m in got if m is not None] == [b"0", b"1", b"2"]
        with pytest.raises(fairq.TopicNotFound):
            async with client.topic("nope").listen():
                pass
    await broker.close()


async def test_a_topic_named_dot_streams_through_the_client() -> None:
    broker = await fairq.connect("memory://")
    async with uvicorn_serving(create_app(broker)) as url, Client(url) as client:
        for name in (".", ".."):
            t = await client.declare_topic(name)
            async with t.listen() as listener:
                await t.publish(name.encode())
                got = await listener.get(timeout=5)
                assert got is not None and got.body == name.encode()
    await broker.close()
