"""The handles of :class:`fairq.http.Client`: a queue, topic, attention domain and
received message on a ``fairq serve`` server, with the method names of their in-process
twins (:class:`fairq.Queue`, :class:`fairq.Topic`, :class:`fairq.Attention`,
:class:`fairq.Received`).
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import fields
from typing import TYPE_CHECKING, Any

import httpx
import orjson

from ..attention import AttentionConfig, AttentionStats, KeyStats, TenantStats
from ..errors import ConnectionError, LeaseLost, QueueFull
from ..message import Outgoing, Received, check_key, parse_receipt
from ..model.topics import Subscription, TopicConfig
from ..pubsub import PublishResult, TopicStats, next_within
from ..queue import QueueConfig, QueueStats, check_receive, make_envelopes
from .errors import RemoteError, exception_from

if TYPE_CHECKING:
    from .client import Client

__all__ = [
    "RemoteAttention",
    "RemoteListener",
    "RemoteQueue",
    "RemoteReceived",
    "RemoteTopic",
    "dataclass_from",
    "dots_kept",
]


def dots_kept(path: str) -> str:
    """``path`` with its segments ``.`` and ``..`` (valid names: a queue called ``.``)
    percent-encoded, which HTTP clients would otherwise resolve away, reaching another
    route (the server decodes them back into the name)."""
    if "/." not in path:
        return path
    parts = path.split("/")
    return "/".join(p.replace(".", "%2E") if p in (".", "..") else p for p in parts)


def _message_json(body: object) -> dict[str, Any]:
    if isinstance(body, bytes | bytearray | memoryview):
        return {"body": base64.b64encode(bytes(body)).decode("ascii"), "encoding": "base64"}
    if isinstance(body, str):
        return {"body": body, "encoding": "text"}
    return {"body": body}


#: the remote client leaves the body's size to the server (its max_message_bytes)
_ANY_SIZE = 2**62


def _items(messages: Iterable[Outgoing], op: str, topic: bool = False) -> list[dict[str, Any]]:
    """The JSON of a batch, checked first by the library's own rules, so a bad message
    raises here what it raises in-process (``InvalidMessage``, ``InvalidOption``)."""
    batch = list(messages)
    make_envelopes(batch, _ANY_SIZE, op, topic)
    return [_outgoing(m, topic) for m in batch]


def _receipts(receipts: Sequence[str]) -> list[str]:
    """Receipts checked as in-process (``InvalidMessage`` for a malformed one)."""
    for r in receipts:
        parse_receipt(r)
    return list(receipts)


def _outgoing(m: Outgoing, topic: bool = False) -> dict[str, Any]:
    out = _message_json(m.body)
    if m.attributes:
        out["attributes"] = dict(m.attributes)
    if m.delay:
        out["delay"] = m.delay
    if m.dedup_id is not None:
        out["dedup_id"] = m.dedup_id
    if topic:  # (group and priority refused before, by make_envelopes in _items)
        if m.routing_key:
            out["routing_key"] = m.routing_key
    else:
        if m.priority:
            out["priority"] = m.priority
        if m.group is not None:
            out["group"] = m.group
    return out


#: seconds one request may wait for room in a full ``overflow="block"`` queue (the server's
#: ``max_wait``): a longer ``timeout``, or None, is several such requests
_WAIT_CAP = 20.0


async def _sending(
    client: Client,
    path: str,
    items: list[dict[str, Any]],
    timeout: float | None,
    headers: Mapping[str, str] | None = None,
) -> Any:
    """POST a batch of messages to ``path``, waiting up to ``timeout`` seconds (None: as
    long as it takes) for room in a full blocking queue, as in-process. The server waits
    at most ``_WAIT_CAP`` per request; a ``QueueFull`` that comes back after waiting its
    whole time stored nothing (a batch is all or none), so the next request is safe. One
    that comes back at once is a queue that refuses (``reject``): raised."""
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + max(0.0, timeout)
    while True:
        wait = _WAIT_CAP if deadline is None else min(_WAIT_CAP, max(0.0, deadline - loop.time()))
        started = loop.time()
        try:
            return await client.request(
                "POST", path, {"messages": items, "timeout": wait}, wait=wait, headers=headers
            )
        except QueueFull:
            waited = loop.time() - started
            more = deadline is None or deadline - loop.time() > 0.05
            if wait <= 0 or waited < 0.9 * wait or not more:
                raise


def _key_header(idempotency_key: str | None) -> dict[str, str] | None:
    return None if idempotency_key is None else {"Idempotency-Key": idempotency_key}


def dataclass_from(cls: Any, data: Mapping[str, Any]) -> Any:
    known = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in known})


class RemoteReceived(Received):
    """A message received through a server; settling it goes back over HTTP."""

    __slots__ = ("_remote",)

    def __init__(self, remote: RemoteQueue, data: Mapping[str, Any]) -> None:
        raw = data["body"]
        body = base64.b64decode(raw) if data["encoding"] == "base64" else raw.encode("utf-8")
        super().__init__(
            data["id"],
            body,
            dict(data["attributes"]),
            data["attempt"],
            data["enqueued_at"],
            data["priority"],
            data["group"],
            data["receipt"],
            data["queue"],
            data.get("key"),
        )
        self._remote = remote

    async def ack(self, connection: object | None = None) -> None:
        """Delete the message (``LeaseLost`` if its lease is gone). Through a server there
        is no caller's transaction to join: ``connection`` raises ``Unsupported``."""
        if connection is not None:
            from ..errors import Unsupported

            raise Unsupported("ack(connection=...) needs the PostgreSQL backend, not a server")
        await self._remote.ack_batch([self.receipt])

    async def nack(self, delay: float = 0.0, *, error: str | None = None) -> None:
        """Give the message back, visible again after ``delay`` seconds; ``error`` (why
        this attempt failed) becomes ``fairq.detail`` if the nack dead-letters it."""
        body: dict[str, object] = {"receipt": self.receipt, "delay": delay}
        if error:
            body["error"] = error[:1000]
        await self._remote._post("nack", body)

    async def extend(self, seconds: float) -> None:
        """Keep the lease until ``seconds`` from now."""
        lost = await self._remote.extend_batch([self.receipt], seconds)
        if lost:
            raise LeaseLost(lost)

    async def dead_letter(self, reason: str = "rejected") -> None:
        """Move the message to the dead-letter queue at once."""
        await self._remote._post("dead-letter", {"receipt": self.receipt, "reason": reason})


class _RemoteHandle:
    """What the server-side handles share: the client and the name."""

    __slots__ = ("_client", "name")

    def __init__(self, client: Client, name: str) -> None:
        self._client = client
        self.name = name

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class RemoteQueue(_RemoteHandle):
    """A queue on a server; the methods of :class:`fairq.Queue`."""

    __slots__ = ()

    async def _post(
        self, op: str, body: Any, wait: float = 0.0, headers: Mapping[str, str] | None = None
    ) -> Any:
        return await self._client.request(
            "POST", f"/v1/queues/{self.name}/{op}", body, wait=wait, headers=headers
        )

    async def send(
        self,
        body: object,
        attributes: Mapping[str, str] | None = None,
        delay: float = 0.0,
        priority: int = 0,
        group: str | None = None,
        dedup_id: str | None = None,
        timeout: float | None = None,
        *,
        idempotency_key: str | None = None,
    ) -> str:
        """Store one message; its id."""
        (mid,) = await self.send_batch(
            [Outgoing(body, attributes, delay, priority, group, dedup_id)],
            timeout,
            idempotency_key=idempotency_key,
        )
        return mid

    async def send_batch(
        self,
        messages: Iterable[Outgoing],
        timeout: float | None = None,
        *,
        idempotency_key: str | None = None,
    ) -> list[str]:
        """Store all messages or none; their ids in order. With ``idempotency_key`` a retry
        of the same batch gets the first answer back and stores nothing again."""
        items = _items(messages, "send_batch")
        if not items:
            return []
        data = await _sending(
            self._client,
            f"/v1/queues/{self.name}/messages",
            items,
            timeout,
            _key_header(idempotency_key),
        )
        return list(data["ids"])

    async def receive(
        self, max_messages: int = 1, visibility_timeout: float | None = None, wait: float = 0.0
    ) -> list[Received]:
        """Lease up to ``max_messages``; ``wait`` long-polls."""
        visibility_timeout, wait = check_receive(max_messages, visibility_timeout, wait)
        body = {
            "max_messages": max_messages,
            "visibility_timeout": visibility_timeout,
            "wait": wait,
        }
        data = await self._post("receive", body, wait=wait)
        return [RemoteReceived(self, m) for m in data["messages"]]

    async def ack_batch(self, receipts: Sequence[str]) -> None:
        """Ack many deliveries; ``LeaseLost`` lists the lost ones after the others are acked."""
        if not receipts:
            return
        data = await self._post("ack", {"receipts": _receipts(receipts)})
        if data["lost"]:
            raise LeaseLost(data["lost"])

    async def release_batch(self, receipts: Sequence[str]) -> list[str]:
        """Give deliveries back at once without counting them as attempts (taken, never
        started); the receipts whose lease was gone."""
        if not receipts:
            return []
        data = await self._post("release", {"receipts": _receipts(receipts)})
        return list(data["lost"])

    async def extend_batch(self, receipts: Sequence[str], seconds: float) -> list[str]:
        """Extend leases; the receipts whose lease was gone."""
        data = await self._post("extend", {"receipts": _receipts(receipts), "seconds": seconds})
        return list(data["lost"])

    async def stats(self) -> QueueStats:
        """The queue's counts and counters."""
        return (await self._info())[0]

    async def config(self) -> QueueConfig:
        """The options the queue is declared with."""
        return (await self._info())[1]

    async def _info(self) -> tuple[QueueStats, QueueConfig]:
        """The queue's stats and options, in one request."""
        data = await self._client.request("GET", f"/v1/queues/{self.name}")
        stats: QueueStats = dataclass_from(QueueStats, data["stats"])
        return stats, QueueConfig.from_dict(data["config"])

    async def purge(self) -> int:
        """Delete every message; how many."""
        return int((await self._post("purge", None))["purged"])

    async def peek(self, limit: int = 10) -> list[Received]:
        """Messages, oldest sent first (ready, delayed or leased), not leased (receipt is "")."""
        data = await self._client.request(
            "GET", f"/v1/queues/{self.name}/messages", params={"limit": limit}
        )
        return [RemoteReceived(self, m) for m in data["messages"]]


class RemoteTopic(_RemoteHandle):
    """A topic on a server; the methods of :class:`fairq.Topic`."""

    __slots__ = ()

    async def subscribe(
        self,
        name: str,
        filter: Mapping[str, Any] | None = None,
        routing: str | None = None,
        push: str | None = None,
        **queue_options: Any,
    ) -> RemoteQueue:
        """Create (or update) a subscription; its queue ``<topic>.<name>``."""
        data = await self._client.request(
            "PUT",
            f"/v1/topics/{self.name}/subscriptions/{name}",
            {"filter": filter, "routing": routing, "push": push, "queue_options": queue_options},
        )
        return RemoteQueue(self._client, data["queue"])

    async def unsubscribe(self, name: str) -> bool:
        """Remove a subscription and delete its queue; False if there was none."""
        try:
            await self._client.request("DELETE", f"/v1/topics/{self.name}/subscriptions/{name}")
        except RemoteError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    async def subscriptions(self) -> list[Subscription]:
        """The topic's subscriptions, sorted by name, as in-process."""
        data = await self._client.request("GET", f"/v1/topics/{self.name}/subscriptions")
        return [
            Subscription(
                s["topic"], s["name"], s["queue"], s.get("filter"), s.get("routing"), s.get("push")
            )
            for s in data["subscriptions"]
        ]

    async def publish(
        self,
        body: object,
        attributes: Mapping[str, str] | None = None,
        routing_key: str = "",
        dedup_id: str | None = None,
        delay: float = 0.0,
        timeout: float | None = None,
        *,
        idempotency_key: str | None = None,
    ) -> PublishResult:
        """Copy a message into every matching subscription (all or none)."""
        (result,) = await self.publish_batch(
            [Outgoing(body, attributes, delay=delay, dedup_id=dedup_id, routing_key=routing_key)],
            timeout,
            idempotency_key=idempotency_key,
        )
        return result

    async def publish_batch(
        self,
        messages: Iterable[Outgoing],
        timeout: float | None = None,
        *,
        idempotency_key: str | None = None,
    ) -> list[PublishResult]:
        """Publish many messages in one atomic step (``idempotency_key``: as for
        :meth:`RemoteQueue.send_batch`)."""
        items = _items(messages, "publish_batch", topic=True)
        if not items:
            return []
        data = await _sending(
            self._client,
            f"/v1/topics/{self.name}/messages",
            items,
            timeout,
            _key_header(idempotency_key),
        )
        return [
            PublishResult(r["message_id"], r["subscriptions"], r.get("duplicate", False))
            for r in data["results"]
        ]

    async def config(self) -> TopicConfig:
        """The options the topic is declared with."""
        data = await self._client.request("GET", f"/v1/topics/{self.name}")
        return TopicConfig(dedup_window=data["dedup_window"])

    async def stats(self) -> TopicStats:
        """The topic's counters."""
        data = await self._client.request("GET", f"/v1/topics/{self.name}")
        stats: TopicStats = dataclass_from(TopicStats, data["stats"])
        return stats

    def listen(
        self,
        routing: str | None = None,
        filter: Mapping[str, Any] | None = None,
        buffer: int = 1000,
    ) -> RemoteListener:
        """Listen live through the server's stream endpoint (at most once)."""
        params: dict[str, Any] = {"buffer": buffer}
        if routing is not None:
            params["routing"] = routing
        if filter is not None:
            params["filter"] = orjson.dumps(filter).decode()
        return RemoteListener(self._client, f"/v1/topics/{self.name}/stream", params)


class RemoteListener:
    """``async for msg in topic.listen(): ...`` over Server-Sent Events. ``dropped``
    counts what the server's buffer lost while this listener was slow.

    ``async with topic.listen() as listener:`` returns once the server listens, so what is
    published after that is heard, as in-process; without it the stream opens at the first
    ``get`` or iteration (:meth:`start` opens it earlier)."""

    def __init__(self, client: Client, path: str, params: dict[str, Any]) -> None:
        self._client = client
        self._path = path
        self._params = params
        self._response: httpx.Response | None = None
        self.dropped = 0
        # the stream is read by one task into a small buffer, so a wait that gives up (get's
        # timeout, a cancelled __anext__) leaves the stream open; when the buffer is full
        # the task stops reading, and the server's buffer (``buffer=``) drops the oldest
        self._buffer: asyncio.Queue[Received | BaseException | None] = asyncio.Queue(
            maxsize=max(1, min(int(params.get("buffer", 1000)), 1000))
        )
        self._reader: asyncio.Task[None] | None = None
        self._ended: BaseException | None = None
        self._listening = asyncio.Event()  # the server said it listens (": listening")

    def _open(self) -> asyncio.Task[None]:
        """The task reading the stream into the buffer, started at the first need."""
        if self._reader is None:
            self._reader = asyncio.create_task(self._read(), name=f"fairq-listen:{self._path}")
        return self._reader

    async def start(self) -> None:
        """Open the stream and return once the server listens; raise what refused it
        (``TopicNotFound``, ``ConnectionError`` ...)."""
        reader = self._open()
        if not self._listening.is_set() and not reader.done():
            listening = asyncio.ensure_future(self._listening.wait())
            try:
                await asyncio.wait({listening, reader}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                listening.cancel()
        if not self._listening.is_set() and not self._buffer.empty():
            item = self._buffer.get_nowait()  # the reader ended before the server listened
            if isinstance(item, BaseException):
                self._ended = item
                raise item
            self._buffer.put_nowait(item)

    def __aiter__(self) -> RemoteListener:
        return self

    async def __anext__(self) -> Received:
        if self._ended is not None:
            raise self._ended
        self._open()
        item = await self._buffer.get()
        if item is None:
            self._ended = StopAsyncIteration()
            raise self._ended
        if isinstance(item, BaseException):
            self._ended = item
            raise item
        return item

    async def _read(self) -> None:
        try:
            async for message in self._events():
                await self._buffer.put(message)
        except Exception as exc:
            await self._buffer.put(exc)
        else:
            await self._buffer.put(None)

    async def get(self, timeout: float | None = None) -> Received | None:
        """The next message, or None after ``timeout`` seconds (or once the stream ended)."""
        return await next_within(self, timeout)

    async def _events(self) -> AsyncIterator[Received]:
        http = self._client._http
        path = dots_kept(self._path)
        request = http.build_request("GET", path, params=self._params, timeout=None)
        try:
            response = await http.send(request, stream=True)
        except httpx.TransportError as exc:
            raise ConnectionError(
                f"cannot reach the fairq server at {self._client.url}: {exc}"
            ) from exc
        self._response = response
        if not response.is_success:
            await response.aread()
            data = orjson.loads(response.content)
            raise exception_from(response.status_code, data["error"], data.get("detail", ""), data)
        queue = RemoteQueue(self._client, self._path.split("/")[3])
        try:
            async for message in self._parse(response, queue):
                yield message
        except httpx.TransportError as exc:  # the server went away mid-stream
            raise ConnectionError(
                f"the stream from the fairq server at {self._client.url} broke: {exc!r}"
            ) from exc

    async def _parse(self, response: httpx.Response, queue: RemoteQueue) -> AsyncIterator[Received]:
        """The messages of an SSE stream (``event``/``data`` lines, blank line ends one)."""
        event, data_lines = "message", list[str]()
        async for line in response.aiter_lines():
            if line.startswith(":"):
                if line.startswith(": listening"):
                    self._listening.set()
                continue
            if not line:
                if data_lines:
                    payload = "\n".join(data_lines)
                    if event == "message":
                        yield RemoteReceived(queue, orjson.loads(payload))
                    elif event == "dropped":
                        self.dropped = int(payload)
                event, data_lines = "message", list[str]()
                continue
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "event":
                event = value
            elif name == "data":
                data_lines.append(value)

    async def close(self) -> None:
        """Stop listening; iteration ends."""
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
        if self._buffer.empty():  # wakes an __anext__ waiting now
            self._buffer.put_nowait(None)
        if self._response is not None:
            await self._response.aclose()

    async def __aenter__(self) -> RemoteListener:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class RemoteAttention(_RemoteHandle):
    """An attention domain on a server; the methods of :class:`fairq.Attention`."""

    __slots__ = ()

    @property
    def queue_name(self) -> str:
        return f"attention.{self.name}.work"

    async def publish(
        self,
        key: str,
        body: object,
        attributes: Mapping[str, str] | None = None,
        delay: float = 0.0,
        priority: int = 0,
        group: str | None = None,
        dedup_id: str | None = None,
        timeout: float | None = None,
    ) -> str:
        """Store a work message for ``key`` and signal the key, atomically; its id."""
        (mid,) = await self.publish_batch(
            key, [Outgoing(body, attributes, delay, priority, group, dedup_id)], timeout
        )
        return mid

    async def publish_batch(
        self, key: str, messages: list[Outgoing], timeout: float | None = None
    ) -> list[str]:
        """Publish many work messages for one key in one atomic step."""
        items = _items(messages, "publish_batch")
        if not items:
            return []
        data = await _sending(
            self._client, f"/v1/attention/{self.name}/keys/{key}/messages", items, timeout
        )
        return list(data["ids"])

    async def set_resource(
        self,
        key: str,
        plan: str | None = None,
        state: str | None = None,
        tenant: str | None = None,
    ) -> None:
        """Set a key's plan, state and/or tenant."""
        await self._client.request(
            "PATCH",
            f"/v1/attention/{self.name}/keys/{key}",
            {"plan": plan, "state": state, "tenant": tenant},
        )

    async def remove(self, key: str, purge: bool = False) -> None:
        """Mark ``key`` removed; ``purge`` also deletes its waiting messages."""
        await self._client.request(
            "DELETE",
            f"/v1/attention/{self.name}/keys/{key}",
            params={"purge": "true" if purge else "false"},
        )

    async def config(self) -> AttentionConfig:
        """The options the domain is declared with."""
        data = await self._client.request("GET", f"/v1/attention/{self.name}")
        return AttentionConfig.from_dict(data["config"])

    async def queue(self, key: str) -> RemoteQueue:
        """The work queue handle of ``key`` (for stats, peeking, redrive)."""
        config = await self.config()
        return RemoteQueue(self._client, config.queue_for(self.name, check_key(key)))

    async def reconcile(self) -> int:
        """Signal every active key that has backlog, no pending signal and no running slice
        (a lost signal); return how many."""
        data = await self._client.request("POST", f"/v1/attention/{self.name}/reconcile")
        return int(data["signalled"])

    async def stats(self) -> AttentionStats:
        """The domain's counters."""
        data = await self._client.request("GET", f"/v1/attention/{self.name}")
        stats: AttentionStats = dataclass_from(AttentionStats, data["stats"])
        return stats

    async def key_stats(self, top: int = 50) -> list[KeyStats]:
        """The ``top`` keys by backlog."""
        data = await self._client.request(
            "GET", f"/v1/attention/{self.name}/keys", params={"top": top}
        )
        return [dataclass_from(KeyStats, k) for k in data["keys"]]

    async def tenant_stats(self, top: int = 50) -> list[TenantStats]:
        """The ``top`` tenants over the last minute, by worker-time share."""
        data = await self._client.request(
            "GET", f"/v1/attention/{self.name}/tenants", params={"top": top}
        )
        return [dataclass_from(TenantStats, t) for t in data["tenants"]]
