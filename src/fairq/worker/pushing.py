"""Push subscriptions in the worker: every push subscription's queue gets a consumer whose
handler POSTs each message (:mod:`fairq.push`); new ones are picked up on a rescan."""

from __future__ import annotations

import asyncio
import logging

from ..errors import FairqError, InvalidOption
from .parts import Backoff, _Consumer, _PushSettings
from .slices import SliceRuntime

log = logging.getLogger("fairq.worker")


class PushRuntime(SliceRuntime):
    """The runtime with push deliveries (``worker.push()``)."""

    def push(
        self,
        topics: list[str] | None = None,
        concurrency: int = 8,
        timeout: float = 10.0,
        retry: Backoff | None = None,
        rescan: float = 10.0,
    ) -> None:
        """Also deliver the push subscriptions of ``topics`` (None: of every topic) by HTTP
        POST (see :mod:`fairq.push`): 2xx acks; anything else or a timeout retries with
        backoff, then dead-letters. Push subscriptions made later are picked up within
        ``rescan`` seconds. Needs httpx (``pip install 'fairq[push]'``)."""
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise InvalidOption(f"concurrency must be a positive integer, got {concurrency!r}")
        self._push = _PushSettings(topics, concurrency, timeout, retry or Backoff(), rescan)

    # -- hooks -----------------------------------------------------------------------------
    def _has_handlers(self) -> bool:
        return super()._has_handlers() or self._push is not None

    async def _start_more(self) -> None:
        await super()._start_more()
        if self._push is not None:
            await self._scan_push()
            self._spawn(self._rescan_push(), "fairq-push-scan")

    async def _close_more(self) -> None:
        await super()._close_more()
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    # -- deliveries ------------------------------------------------------------------------
    async def _scan_push(self) -> None:
        """Start a consumer for every push subscription not consumed yet."""
        settings = self._push
        assert settings is not None and self._broker is not None
        from ..push import push_handler

        if self._http is None:
            try:
                import httpx
            except ImportError as exc:  # pragma: no cover - depends on the install
                raise InvalidOption("push delivery needs httpx: pip install 'fairq[push]'") from exc
            self._http = httpx.AsyncClient()
        broker = self._broker
        topics = settings.topics if settings.topics is not None else await broker.list_topics()
        for topic in topics:
            for sub in await broker.topic(topic).subscriptions():
                if sub.push is None or sub.queue in self._consumers:
                    continue
                handler = push_handler(sub, self._http, settings.timeout)
                c = _Consumer(sub.queue, handler, settings.concurrency, settings.retry, None, True)
                self._consumers[sub.queue] = c
                await self._attach(c)
                self._start(c)
                log.info("delivering push subscription %s.%s to %s", topic, sub.name, sub.push)

    async def _rescan_push(self) -> None:
        assert self._push is not None
        while True:
            await asyncio.sleep(self._push.rescan)
            try:
                await self._scan_push()
            except FairqError as exc:  # a topic deleted meanwhile: try again next time
                log.warning("push subscription scan failed: %s", exc)
