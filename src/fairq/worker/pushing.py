"""Push subscriptions in the worker: every push subscription's queue gets a consumer whose
handler POSTs each message (:mod:`fairq.push`). A rescan picks up new ones, follows a
changed URL, and stops the consumer of one that was removed or no longer pushes; a
subscription deleted under its consumer stops that consumer alone, never the worker."""

from __future__ import annotations

import asyncio
import logging

from ..errors import FairqError, InvalidOption, QueueNotFound, TopicNotFound
from ..model.topics import Subscription
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
        pushing: dict[str, tuple[str, Subscription]] = {}
        for topic in topics:
            try:
                subs = await broker.topic(topic).subscriptions()
            except TopicNotFound:  # deleted meanwhile (or not made yet): none of its own
                continue
            for sub in subs:
                if sub.push is not None:
                    pushing[sub.queue] = (topic, sub)
        urls = self._push_urls
        for name, url in list(urls.items()):
            c = self._consumers.get(name)
            got = pushing.get(name)
            if got is None or c is None:
                self._retire_push(name, "was removed or no longer pushes")
            elif got[1].push != url:
                topic, sub = got
                c.handler = push_handler(sub, self._http, settings.timeout)
                urls[name] = sub.push or ""
                log.info("push subscription %s.%s now delivers to %s", topic, sub.name, sub.push)
        for name, (topic, sub) in pushing.items():
            if name in self._consumers:
                continue
            handler = push_handler(sub, self._http, settings.timeout)
            c = _Consumer(name, handler, settings.concurrency, settings.retry, None, True)
            self._consumers[name] = c
            await self._attach(c)
            urls[name] = sub.push or ""
            c.runners = self._runners(c)
            self._spawn(self._consume_push(c), f"fairq-push:{name}")
            log.info("delivering push subscription %s.%s to %s", topic, sub.name, sub.push)

    async def _consume_push(self, c: _Consumer) -> None:
        """A push subscription's consumer: its queue deleted (the subscription removed, its
        topic deleted) ends this consumer, not the worker."""
        try:
            await self._consume(c)
        except (QueueNotFound, TopicNotFound):
            if self._consumers.get(c.name) is c:
                self._retire_push(c.name, "was deleted")
        if c.retired and c.runners is not None:
            c.runners.close()  # its runners end once what it received is delivered

    def _retire_push(self, name: str, why: str) -> None:
        """Stop receiving for the push subscription queue ``name`` (what was received is
        still delivered or, at shutdown, comes back when its lease ends)."""
        self._push_urls.pop(name, None)
        c = self._consumers.pop(name, None)
        if c is not None:
            c.retired = True
            self._retired = [r for r in self._retired if r.runners and r.runners.tasks]
            self._retired.append(c)  # what it received is delivered or given back at stop
            log.info("push subscription queue %s %s: its deliveries stop", name, why)

    async def _rescan_push(self) -> None:
        assert self._push is not None
        while True:
            await asyncio.sleep(self._push.rescan)
            try:
                await self._scan_push()
            except FairqError as exc:  # a topic deleted meanwhile: try again next time
                log.warning("push subscription scan failed: %s", exc)
