"""Idempotency keys and version gates on a ``fairq serve`` server, with the method names of
:class:`fairq.IdempotencyStore`, :class:`fairq.Claim` and :class:`fairq.VersionGate`
(get them from :meth:`fairq.http.Client.idempotency` and
:meth:`~fairq.http.Client.versions`)::

    store = fq.idempotency("pdf-worker", ttl=86_400)
    claim = await store.claim(order_id, lease=60)      # None: someone holds or finished it
    if claim is not None:
        await claim.complete({"pdf": path})            # or: await claim.release()
    async with store.once(order_id) as first: ...
    ok = await fq.versions("user-birthdate").advance(user_id, version)

A claim lost to another claimer raises :class:`fairq.ClaimLost`, as in-process. Results
are JSON values or bytes (sent base64).
"""

from __future__ import annotations

import base64
import contextlib
from collections.abc import AsyncIterator
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ..idempotency import (
    DEFAULT_LEASE,
    ClaimLost,
    IdempotencyRecord,
    KeptAlive,
    Version,
    check_version,
    encode_result,
)
from .errors import RemoteError

if TYPE_CHECKING:
    from .client import Client

__all__ = ["RemoteClaim", "RemoteIdempotencyStore", "RemoteVersionGate"]


def _record(data: dict[str, Any]) -> IdempotencyRecord:
    result = data["result"]
    if data["encoding"] == "base64":
        result = base64.b64decode(result)
    return IdempotencyRecord(
        data["key"], data["state"], data["expires_at"], data["fingerprint"], encode_result(result)
    )


async def _or_none(call: Any) -> Any:
    """The answer of ``call``, or None when the server says there is nothing (404)."""
    try:
        return await call
    except RemoteError as exc:
        if exc.status == 404 and exc.code == "not_found":
            return None
        raise


class RemoteClaim(KeptAlive):
    """The right to do the work of one key, for ``lease`` seconds (see :class:`fairq.Claim`;
    ``keep_alive`` and ``kept_alive`` extend it while long work runs)."""

    __slots__ = ("_settled", "key", "lease", "store", "token")

    def __init__(self, store: RemoteIdempotencyStore, key: str, token: str, lease: float) -> None:
        self.store = store
        self.key = key
        self.token = token
        self.lease = lease
        self._settled: str | None = None
        self._keeper = None

    def __repr__(self) -> str:
        return f"RemoteClaim({self.store.namespace!r}, {self.key!r}, lease={self.lease:g})"

    @property
    def settled(self) -> bool:
        """True once completed or released."""
        return self._settled is not None

    async def _post(self, op: str, body: dict[str, Any]) -> Any:
        return await self.store._post(self.key, op, {"token": self.token, **body})

    async def complete(self, result: object = None) -> None:
        """Record the work as done with ``result`` (None, bytes or a JSON value), kept for
        the store's ttl; :class:`fairq.ClaimLost` if another claimer took the key."""
        if self._settled is not None:
            raise ClaimLost(self.key, f"this claim of {self.key!r} was already {self._settled}")
        encode_result(result)  # InvalidMessage here, as in-process, for what cannot be kept
        self.stop_keeping()
        body: dict[str, Any] = {"ttl": self.store.ttl}
        if isinstance(result, bytes | bytearray | memoryview):
            body |= {"result": base64.b64encode(bytes(result)).decode(), "encoding": "base64"}
        else:
            body["result"] = result
        try:
            await self._post("complete", body)
        except ClaimLost:
            self._settled = "lost"
            raise
        self._settled = "completed"

    async def release(self) -> bool:
        """Give the key up; False if it was no longer this claim's."""
        if self._settled is not None:
            return False
        self._settled = "released"
        self.stop_keeping()
        return bool((await self._post("release", {}))["released"])

    async def extend(self, lease: float | None = None) -> None:
        """Make the claim last ``lease`` seconds (default: its own) from now."""
        if self._settled is not None:
            raise ClaimLost(self.key, f"this claim of {self.key!r} was already {self._settled}")
        await self._post("extend", {"lease": self.lease if lease is None else lease})


class RemoteIdempotencyStore:
    """Idempotency keys of one ``namespace`` on a server; completed keys are kept ``ttl``
    seconds (see :class:`fairq.IdempotencyStore`)."""

    def __init__(self, client: Client, namespace: str, ttl: float = 86_400.0) -> None:
        self._client = client
        self.namespace = namespace
        self.ttl = ttl

    def __repr__(self) -> str:
        return f"RemoteIdempotencyStore({self.namespace!r}, ttl={self.ttl:g})"

    @property
    def name(self) -> str:
        return self.namespace

    def _path(self, key: str) -> str:
        return f"/v1/idempotency/{self.namespace}/keys/{key}"

    async def _post(self, key: str, op: str, body: dict[str, Any]) -> Any:
        return await self._client.request("POST", f"{self._path(key)}/{op}", body)

    async def try_claim(
        self, key: str, lease: float = DEFAULT_LEASE, *, holder: str | None = None
    ) -> RemoteClaim | IdempotencyRecord:
        """Take ``key`` for ``lease`` seconds, or the record of what holds it."""
        data = await self._post(key, "claim", {"lease": lease, "holder": holder})
        if data["claimed"]:
            return RemoteClaim(self, key, data["token"], lease)
        return _record(data["record"])

    async def claim(
        self, key: str, lease: float = DEFAULT_LEASE, *, holder: str | None = None
    ) -> RemoteClaim | None:
        """Take ``key`` for ``lease`` seconds; None if another claim holds it or it was
        completed within the ttl."""
        got = await self.try_claim(key, lease, holder=holder)
        return got if isinstance(got, RemoteClaim) else None

    async def get(self, key: str) -> IdempotencyRecord | None:
        """The key's record (running or completed), or None."""
        data = await _or_none(self._client.request("GET", self._path(key)))
        return None if data is None else _record(data)

    async def forget(self, key: str) -> bool:
        """Drop the key's record so the next claim takes it; False if there was none."""
        try:
            await self._client.request("DELETE", self._path(key))
        except RemoteError as exc:
            if exc.status == 404 and exc.code == "not_found":
                return False
            raise
        return True

    @contextlib.asynccontextmanager
    async def once(self, key: str, lease: float = DEFAULT_LEASE) -> AsyncIterator[bool]:
        """``async with store.once(key) as first:`` — True for the one caller that claimed
        the key (the block's end completes it, an exception releases it); else False."""
        claim = await self.claim(key, lease)
        if claim is None:
            yield False
            return
        async with claim.working():  # kept alive, completed or released, as in-process
            yield True


class RemoteVersionGate:
    """The newest version seen per entity of one ``namespace`` on a server (see
    :class:`fairq.VersionGate`)."""

    def __init__(self, client: Client, namespace: str) -> None:
        self._client = client
        self.namespace = namespace

    def __repr__(self) -> str:
        return f"RemoteVersionGate({self.namespace!r})"

    @property
    def name(self) -> str:
        return self.namespace

    async def advance(self, entity: str, version: int | float | datetime) -> bool:
        """Record ``version`` and return True only if it is greater than the stored one."""
        data = await self._client.request(
            "POST",
            f"/v1/versions/{self.namespace}/{entity}/advance",
            {"version": check_version(version)},
        )
        return bool(data["advanced"])

    async def current(self, entity: str) -> Version | None:
        """The stored version of ``entity``, or None."""
        path = f"/v1/versions/{self.namespace}/{entity}"
        data = await _or_none(self._client.request("GET", path))
        return None if data is None else data["version"]
