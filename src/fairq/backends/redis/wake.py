"""Cross-process wake-ups and ephemeral listeners over Redis pub/sub.

Every script that may wake a waiter (a send, an ack, a nack, a redrive ...) ends with one
``PUBLISH <prefix>wake "<queue> <queue> ..."``; each broker keeps one subscribed
connection and fires the wake-up tokens of the queues named. ``Topic.listen`` rides on
the same connection (channels ``<prefix>listen:<topic>``). When the connection drops the
subscriber reconnects by itself and then wakes every waiter once, since it may have
missed something meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from .conn import DriverErrors, RedisOptions, make_pubsub_client

log = logging.getLogger("fairq.redis")


class Subscriber:
    """One pub/sub connection per broker: the wake channel plus any listen channels."""

    def __init__(
        self,
        opts: RedisOptions,
        node: tuple[str, int],
        on_wake: Callable[[list[str]], None],
        on_reset: Callable[[], None],
        on_listen: Callable[[str, bytes], None],
    ) -> None:
        self._opts = opts
        self._node = node
        self._wake_channel = f"{opts.prefix}wake"
        self._listen_prefix = f"{opts.prefix}listen:"
        self._on_wake = on_wake
        self._on_reset = on_reset
        self._on_listen = on_listen
        self._channels: set[str] = set()
        self._task: asyncio.Task[None] | None = None
        self._pubsub: Any = None
        self._client: Any = None
        self._ready = asyncio.Event()
        self.resets = 0  # how many times the connection was (re)established

    async def start(self, timeout: float) -> None:
        self._task = asyncio.create_task(self._run(), name="fairq-redis-wake")
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._ready.wait()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        await self._drop()

    async def listen(self, topic: str) -> None:
        channel = self._listen_prefix + topic
        if channel in self._channels:
            return
        self._channels.add(channel)
        if self._pubsub is not None:
            with contextlib.suppress(*DriverErrors):
                await self._pubsub.subscribe(channel)

    async def unlisten(self, topic: str) -> None:
        channel = self._listen_prefix + topic
        if channel not in self._channels:
            return
        self._channels.discard(channel)
        if self._pubsub is not None:
            with contextlib.suppress(*DriverErrors):
                await self._pubsub.unsubscribe(channel)

    async def _drop(self) -> None:
        ps, client = self._pubsub, self._client
        self._pubsub = self._client = None
        if ps is not None:
            with contextlib.suppress(Exception):
                await ps.aclose()
        if client is not None:
            with contextlib.suppress(Exception):
                await client.aclose()

    async def _run(self) -> None:
        backoff = 0.05
        while True:
            try:
                self._client = make_pubsub_client(self._opts, *self._node)
                self._pubsub = self._client.pubsub(ignore_subscribe_messages=True)
                await self._pubsub.subscribe(self._wake_channel, *self._channels)
                self.resets += 1
                self._ready.set()
                self._on_reset()  # anything may have happened while we were away
                backoff = 0.05
                while True:
                    msg = await self._pubsub.get_message(timeout=30.0)
                    if msg is None or msg.get("type") != "message":
                        continue
                    channel = msg["channel"]
                    if isinstance(channel, bytes):
                        channel = channel.decode()
                    data = msg["data"]
                    if channel == self._wake_channel:
                        text = data.decode() if isinstance(data, bytes) else str(data)
                        self._on_wake(text.split(" "))
                    elif channel.startswith(self._listen_prefix):
                        self._on_listen(channel[len(self._listen_prefix) :], data)
            except asyncio.CancelledError:
                raise
            except Exception:  # the subscriber must outlive any outage
                log.debug("redis wake-up connection lost; reconnecting", exc_info=True)
                await self._drop()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 1.0)
