"""``fairq.http.Client``: the in-process API's method names, over HTTP (httpx).

    from fairq.http import Client

    async with Client("http://127.0.0.1:8040", api_key="...") as fq:
        q = await fq.declare_queue("ticket-pdf", max_attempts=5)
        await q.send({"order": "o-7731"})
        for msg in await q.receive(max_messages=10, wait=20):    # long poll
            print(msg.json())
            await msg.ack()                                       # or nack/extend/dead_letter
        await fq.topic("order-events").publish({"order": "o-1"}, routing_key="order.new")
        await fq.attention("marketplace").publish("store-873", {"sync": "stock"})
        room = await fq.waiting_room("ev-88", admit_rate=500)   # rooms, as fairq.WaitingRoom
        claim = await fq.idempotency("pdf-worker").claim("o-7731")  # as fairq.IdempotencyStore

Received messages are :class:`fairq.Received` objects; their ``ack``, ``nack``,
``extend`` and ``dead_letter`` go to the server by receipt. Stats come back as the
library's own dataclasses (``QueueStats``, ``TopicStats``, ``AttentionStats``,
``KeyStats``), and error answers as the fairq exception the server mapped them from
(``QueueNotFound``, ``LeaseLost``, ``QueueFull`` ...; anything else as
:class:`~fairq.http.errors.RemoteError`). Bodies go as the in-process API takes them:
bytes (sent base64), str (text), or any JSON value. ``send``, ``send_batch``,
``publish`` and ``publish_batch`` take ``idempotency_key=``: a retry with the same key
gets the first answer back instead of storing the messages again.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import TracebackType
from typing import Any

import httpx
import orjson

from ..attention import Plan
from ..clock import Clock, SystemClock
from ..errors import ConnectionError
from ..queue import QueueConfig, QueueStats
from .errors import RemoteError, exception_from
from .remote import RemoteAttention, RemoteQueue, RemoteTopic, dataclass_from, dots_kept
from .remote_idempotency import RemoteIdempotencyStore, RemoteVersionGate
from .remote_rooms import RemoteRoom

__all__ = ["DEFAULT_SERVER", "Client"]

DEFAULT_SERVER = "http://127.0.0.1:8040"


class Client:
    """A connection to a ``fairq serve``; see the module docstring.

    ``transport`` is handed to httpx (``httpx.ASGITransport(app=...)`` talks to an app in
    the same process, as the tests do).
    """

    def __init__(
        self,
        server: str = DEFAULT_SERVER,
        api_key: str | None = None,
        *,
        timeout: float = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.url = server.rstrip("/")
        self.timeout = timeout
        self.clock: Clock = SystemClock()
        self._http = httpx.AsyncClient(
            base_url=self.url, headers=headers, timeout=timeout, transport=transport
        )

    def __repr__(self) -> str:
        return f"Client({self.url!r})"

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the connections."""
        await self._http.aclose()

    async def request(
        self,
        method: str,
        path: str,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
        wait: float = 0.0,
        headers: Mapping[str, str] | None = None,
    ) -> Any:
        """One API call; the decoded JSON answer (None for 204), or the mapped error."""
        content = orjson.dumps(json) if json is not None else None
        path = dots_kept(path)
        sent = dict(headers or {})
        if content is not None:
            sent["Content-Type"] = "application/json"
        try:
            response = await self._http.request(
                method,
                path,
                content=content,
                params=params,
                headers=sent or None,
                timeout=self.timeout + wait,
            )
        except httpx.TimeoutException as exc:
            raise ConnectionError(
                f"the fairq server at {self.url} did not answer {method} {path} within "
                f"{self.timeout + wait:g} s"
            ) from exc
        except httpx.TransportError as exc:
            if content is not None and isinstance(
                exc, httpx.WriteError | httpx.ReadError | httpx.RemoteProtocolError
            ):
                # a server refuses a body over its limit from Content-Length and closes the
                # connection before reading it: the client may fail writing, not reading
                raise ConnectionError(
                    f"the fairq server at {self.url} closed the connection while a "
                    f"{len(content)}-byte request was sent (a body over the server's "
                    f"--max-body is refused that way), or it went away: {exc!r}"
                ) from exc
            raise ConnectionError(f"cannot reach the fairq server at {self.url}: {exc}") from exc
        if response.status_code == 204:
            return None
        try:
            data = orjson.loads(response.content) if response.content else None
        except orjson.JSONDecodeError:
            data = None
        if response.is_success:
            return data
        if isinstance(data, dict) and "error" in data:
            raise exception_from(response.status_code, data["error"], data.get("detail", ""), data)
        raise RemoteError(response.status_code, "http_error", response.text[:200])

    async def _delete(self, path: str, missing: type[Exception]) -> bool:
        """DELETE ``path``; False when the server says ``missing`` (there was nothing)."""
        try:
            await self.request("DELETE", path)
        except missing:
            return False
        return True

    # -- queues ----------------------------------------------------------------------------
    async def declare_queue(self, name: str, **options: Any) -> RemoteQueue:
        """Create a queue or update its options (``declare_queue``'s keywords)."""
        await self.request("PUT", f"/v1/queues/{name}", options)
        return self.queue(name)

    def queue(self, name: str) -> RemoteQueue:
        """A handle to a queue on the server."""
        return RemoteQueue(self, name)

    async def delete_queue(self, name: str) -> bool:
        """Delete a queue and its messages; False if there was none."""
        from ..errors import QueueNotFound

        return await self._delete(f"/v1/queues/{name}", QueueNotFound)

    async def list_queues(self, prefix: str = "") -> list[str]:
        """Names of the queues that start with ``prefix``, sorted."""
        return list(await self.queue_stats(prefix))

    async def queue_stats(self, prefix: str = "") -> dict[str, QueueStats]:
        """Every queue starting with ``prefix`` and its stats (a call per 1,000 queues)."""
        return {name: stats for name, (stats, _) in (await self.queue_infos(prefix)).items()}

    async def queue_infos(self, prefix: str = "") -> dict[str, tuple[QueueStats, QueueConfig]]:
        """Every queue starting with ``prefix``, its stats and its options (a call per
        1,000 queues)."""
        out: dict[str, tuple[QueueStats, QueueConfig]] = {}
        params: dict[str, Any] = {"prefix": prefix, "limit": 1000}
        while True:
            data = await self.request("GET", "/v1/queues", params=params)
            out.update(
                (
                    q["name"],
                    (dataclass_from(QueueStats, q["stats"]), QueueConfig.from_dict(q["config"])),
                )
                for q in data["queues"]
            )
            cursor = data.get("next_cursor")
            if not cursor:
                return out
            params["cursor"] = cursor

    async def redrive(self, queue: str, to: str | None = None, limit: int | None = None) -> int:
        """Move dead letters back to their source queue (or ``to``); how many moved."""
        data = await self.request("POST", f"/v1/queues/{queue}/redrive", {"to": to, "limit": limit})
        return int(data["moved"])

    # -- topics ----------------------------------------------------------------------------
    async def declare_topic(self, name: str, *, dedup_window: float = 300.0) -> RemoteTopic:
        """Create a topic (or update its options)."""
        await self.request("PUT", f"/v1/topics/{name}", {"dedup_window": dedup_window})
        return self.topic(name)

    def topic(self, name: str) -> RemoteTopic:
        """A handle to a topic on the server."""
        return RemoteTopic(self, name)

    async def delete_topic(self, name: str) -> bool:
        """Delete a topic, its subscriptions and their queues; False if there was none."""
        from ..errors import TopicNotFound

        return await self._delete(f"/v1/topics/{name}", TopicNotFound)

    async def list_topics(self, prefix: str = "") -> list[str]:
        """Names of the topics that start with ``prefix``, sorted."""
        data = await self.request("GET", "/v1/topics", params={"prefix": prefix})
        return [t["name"] for t in data["topics"]]

    # -- attention -------------------------------------------------------------------------
    async def declare_attention(
        self,
        domain: str,
        *,
        plans: Mapping[str, Plan] | None = None,
        default_plan: str = "basic",
        work_queue: str | None = None,
        queue_options: Mapping[str, Any] | None = None,
        slice_lease: float = 30.0,
        charge: str = "time",
        shards: int = 1,
    ) -> RemoteAttention:
        """Create an attention domain (or update its options)."""
        body: dict[str, Any] = {
            "default_plan": default_plan,
            "slice_lease": slice_lease,
            "charge": charge,
            "shards": shards,
        }
        if work_queue is not None:
            body["work_queue"] = work_queue
        if plans is not None:
            body["plans"] = {n: p.to_dict() for n, p in plans.items()}
        if queue_options is not None:
            body["queue_options"] = dict(queue_options)
        await self.request("PUT", f"/v1/attention/{domain}", body)
        return self.attention(domain)

    def attention(self, domain: str) -> RemoteAttention:
        """A handle to an attention domain on the server."""
        return RemoteAttention(self, domain)

    async def list_attention(self, prefix: str = "") -> list[str]:
        """Names of the attention domains that start with ``prefix``, sorted."""
        data = await self.request("GET", "/v1/attention", params={"prefix": prefix})
        return [d["name"] for d in data["domains"]]

    async def delete_attention(self, domain: str) -> bool:
        """Delete an attention domain's keys and signals; False if there was none."""
        from ..errors import AttentionNotFound

        return await self._delete(f"/v1/attention/{domain}", AttentionNotFound)

    # -- waiting rooms ---------------------------------------------------------------------
    async def waiting_room(self, name: str, **options: Any) -> RemoteRoom:
        """Create a waiting room, or update the options given (``admit_rate``,
        ``token_ttl``, ``opens_at``, ``max_active``); its handle. The room signs with a key
        kept in the backend (a ``secret`` stays with the library)."""
        await self.request("PUT", f"/v1/rooms/{name}", options)
        return RemoteRoom(self, name)

    async def room(self, name: str) -> RemoteRoom:
        """A handle to an existing waiting room (``fairq.RoomNotFound`` otherwise)."""
        await self.request("GET", f"/v1/rooms/{name}")
        return RemoteRoom(self, name)

    async def list_rooms(self, prefix: str = "") -> list[str]:
        """Names of the waiting rooms that start with ``prefix``, sorted."""
        data = await self.request("GET", "/v1/rooms", params={"prefix": prefix})
        return [r["name"] for r in data["rooms"]]

    async def delete_room(self, name: str) -> bool:
        """Delete a waiting room, its fans and tokens; False if there was none."""
        from ..errors import RoomNotFound

        return await self._delete(f"/v1/rooms/{name}", RoomNotFound)

    # -- idempotency -----------------------------------------------------------------------
    def idempotency(self, namespace: str, ttl: float = 86_400.0) -> RemoteIdempotencyStore:
        """The idempotency keys of ``namespace``; completed keys are kept ``ttl`` seconds."""
        return RemoteIdempotencyStore(self, namespace, ttl)

    def versions(self, namespace: str) -> RemoteVersionGate:
        """The version gate of ``namespace``: the newest version seen per entity."""
        return RemoteVersionGate(self, namespace)

    # -- the server ------------------------------------------------------------------------
    async def overview(self) -> dict[str, Any]:
        """What the dashboard shows (queues with measured rates, topics, domains)."""
        data: dict[str, Any] = await self.request("GET", "/v1/overview")
        return data

    async def health(self) -> dict[str, Any]:
        """``/healthz``."""
        data: dict[str, Any] = await self.request("GET", "/healthz")
        return data
