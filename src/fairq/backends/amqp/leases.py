"""Leases on RabbitMQ deliveries: receive, ack, nack, extend, release, dead letters and
the ends of visibility timeouts (see ``queues.py`` for how attempts are counted)."""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
from typing import Any

from ...errors import LeaseLost, QueueFull, QueueNotFound
from ...message import Received, id_time, make_receipt, parse_id, parse_receipt
from ...model.queues import QueueConfig
from .. import heaps
from ..rules import ROUTING_KEY, dead_letter_attributes
from . import topology
from .core import AmqpCore
from .feeds import Delivered, Feed, Lease
from .headers import GROUP, PRIOR, attributes_of, hidden, text
from .link import driver_errors

__all__ = ["AmqpLeases"]

log = logging.getLogger("fairq.amqp")

_ID_MASK = 2**63 - 1  # a receipt's first part: the message id, as 16 hex digits
#: seconds without a receive after which a queue's consumer gives back what it holds
FEED_IDLE = 0.5
#: seconds a consumer's buffer may stay non-empty while receives go on before what it
#: holds beyond one receive's worth goes back
SLOW_HELD = 2.0


class AmqpLeases(AmqpCore):
    """Receiving and settling, over the core."""

    # -- receiving -------------------------------------------------------------------------
    def _feed(self, queue: str) -> Feed:
        feed = self._feeds.get(queue)
        if feed is None:
            feed = Feed(queue, self.link, self._prefetch(queue), self._delivered)
            self._feeds[queue] = feed
        return feed

    def consumer_window(self, queue: str, n: int) -> None:
        """The consumer of ``queue`` holds at most what this process's workers can run of
        it (the sum of their ``n``; ``basic.qos``): a delivery this process holds counts an
        attempt when the process dies or RabbitMQ restarts, started or not, and is out of
        other workers' reach — so a worker that can run ``n`` at a time prefetches ``n``,
        not the URL's ``prefetch`` (200). A consumer already started takes it when its
        channel next opens. While a window is set, a receive takes only what the consumer
        was pushed (see ``receive``); with none left, the URL's prefetch comes back."""
        total = self._windows.get(queue, 0) + n
        if total > 0:
            self._windows[queue] = total
        else:
            self._windows.pop(queue, None)
        feed = self._feeds.get(queue)
        if feed is not None:
            feed.prefetch = self._prefetch(queue)

    def _prefetch(self, queue: str) -> int:
        """The prefetch of ``queue``'s consumer: the URL's, or less while workers set a
        window."""
        return min(self.url.prefetch, self._windows.get(queue, self.url.prefetch))

    def _delivered(self, queue: str) -> None:
        self.wakeups.notify([queue])
        if not self._idle_check and queue not in self._windows:
            # pushed to a consumer nobody may be asking of (a message this process gave
            # back comes straight back to it, most often): given back if that stays so
            feed = self._feeds.get(queue)
            if feed is not None and feed.consume:
                self._idle_soon(feed)

    async def receive(
        self, queue: str, max_messages: int, visibility_timeout: float | None
    ) -> list[Received]:
        config = await self._config(queue)
        await self._expire_leases()
        feed = self._feed(queue)
        # a worker's queue (consumer_window) takes only what its consumer was pushed: a
        # basic.get is outside the prefetch count, so each one let RabbitMQ push one more
        # to the consumer (11 held for 8 slots), each an attempt counted if the process
        # dies; the worker waits for the push instead (the delivery wakes it)
        windowed = queue in self._windows
        if not windowed:
            feed.asked(asyncio.get_running_loop().time())
            feed.asked_most = max(feed.asked_most, max_messages)
            wanted = min(self.url.prefetch, max_messages)
            if feed.prefetch < wanted:  # cut by a release (below): asked for more now
                await feed.resize(wanted)
        await feed.start()
        vt = config.visibility_timeout if visibility_timeout is None else visibility_timeout
        out: list[Received] = []
        empty_answers = 0
        while len(out) < max_messages:
            if feed.held:
                delivered = feed.held.popleft()
            elif windowed:
                break
            else:
                got = await feed.get()
                if got is None:
                    empty_answers += 1
                    if empty_answers >= 2 and not feed.held:
                        break
                    continue
                if feed.held:
                    # the consumer's deliveries that came before the get's answer are
                    # earlier in the queue (a new consumer's first ones, most often): they
                    # go first, the got message after them
                    feed.held.append(got)
                    got = feed.held.popleft()
                delivered = got
            received = await self._lease(feed, config, delivered, vt)
            if received is not None:
                out.append(received)
        if feed.held and not windowed:  # if no receive takes them soon, they go back
            self._idle_soon(feed)
        return out

    def _idle_soon(self, feed: Feed) -> None:
        """Look for idle consumers once ``feed``'s would be idle (one look pending at a
        time; the lease timer also looks every second)."""
        if not self._idle_check:
            self._idle_check = True
            loop = asyncio.get_running_loop()
            wait = max(0.0, feed.asked_at + feed.idle_after(FEED_IDLE) - loop.time())
            loop.call_later(wait + 0.001, self._check_idle)

    def _check_idle(self) -> None:
        self._idle_check = False
        self._kick.set()

    async def _release_idle(self) -> None:
        """Give back what consumers hold beyond what their process asks for. A consumer is
        pushed deliveries up to its prefetch (the URL's, 200) whether or not its process
        asks for more, and those are out of every other process's reach; a message this
        process nacked or let expire often comes straight back to it, too. So:

        * once no receive has asked for a queue for ``FEED_IDLE`` seconds (or three times
          the usual gap between its receives, up to 5 s: a process that asks every 0.6 s is
          not idle between two asks), its consumer is cancelled and all it held goes back
          to the queue;
        * when receives go on but the next delivery in the buffer has waited there for
          ``SLOW_HELD`` seconds (a process that takes one message now and then; one that
          takes them as fast as they come never has one wait), the consumer is cancelled
          and what it held beyond one receive's worth goes back; what it kept goes back
          too once the process stops asking.

        Back means as copies with their attempts so far (a plain requeue would count one
        more on a quorum queue), at the back of the queue. The consumer starts again at the
        next receive with a prefetch of the most one receive asked for meanwhile (so it
        holds one receive's worth from then on), back up to the URL's when a receive asks
        for more."""
        now = asyncio.get_running_loop().time()
        for feed in list(self._feeds.values()):
            if not feed.held or not feed.consume or feed.queue in self._windows or not feed.live():
                continue
            idle = now - feed.asked_at >= feed.idle_after(FEED_IDLE)
            if not idle and (feed.consumer_tag is None or feed.held_for(now) < SLOW_HELD):
                continue  # (a consumer cut down already keeps one receive's worth)
            keep = 0 if idle else max(1, feed.asked_most)
            if feed.consumer_tag is not None:
                feed.prefetch = max(1, min(self.url.prefetch, feed.asked_most))
                feed.asked_most = 0
            generation = feed.generation
            held = await feed.stop()
            feed.held.extend(held[:keep])  # still unacked on the channel: this process's
            try:
                await self._put_back_all(feed, generation, held[keep:])
            finally:
                self.wakeups.notify([feed.queue])

    async def _lease(
        self,
        feed: Feed,
        config: QueueConfig,
        delivered: Delivered,
        vt: float,
        queue: str | None = None,
    ) -> Received | None:
        """Start a lease on a delivery of ``queue`` (default: the feed's) — or dead-letter
        it if it is past its attempts."""
        queue = feed.queue if queue is None else queue
        props = delivered.header.properties
        headers = dict(props.headers or {})
        exchange, key = delivered.delivery.exchange, delivered.delivery.routing_key
        if exchange and "/" not in exchange and key and ROUTING_KEY not in headers:
            # published to a topic's exchange by another AMQP client (fairq's own copies go
            # through the default exchange): its routing key is the attribute fairq's carry
            headers[ROUTING_KEY] = key
        prior = int(headers.get(PRIOR, 0))
        if "x-delivery-count" in headers:  # a quorum queue counts every return
            returned = int(headers["x-delivery-count"])
        else:  # a first delivery, or a classic queue's "returned at least once"
            returned = 1 if delivered.delivery.redelivered else 0
        attempt = prior + returned + 1
        mid = props.message_id or self._new_id()
        try:
            enqueued_at = id_time(parse_id(mid))
        except ValueError:
            enqueued_at = self.clock.now()
        now = self.clock.now()
        lease = Lease(
            queue,
            feed,
            feed.generation,
            delivered.delivery.delivery_tag,
            mid,
            delivered.body,
            headers,
            props.priority or 0,
            attempt,
            now + vt,
            enqueued_at,
        )
        if config.max_attempts is not None and attempt > config.max_attempts:
            # its consumers died holding it: it had its attempts, it is not delivered again
            await self._dead_letter(lease, config, "max_attempts", attempts=attempt - 1)
            return None
        try:
            number = parse_id(mid) & _ID_MASK
        except ValueError:  # a message from another publisher: any number will do
            number = self._tag
        receipt = make_receipt(number, (self._tag << 32) | next(self._seq))
        self._leases[receipt] = lease
        feed.leases += 1
        self._deadline(lease.deadline, receipt)
        self._kick.set()
        if attempt > 1:
            self._count(queue, "redelivered")
        return Received(
            mid,
            delivered.body,
            attributes_of(headers, mid, self._level_queues),
            attempt,
            enqueued_at,
            lease.priority,
            text(headers[GROUP]) if GROUP in headers else None,
            receipt,
            queue,
        )

    # -- settling --------------------------------------------------------------------------
    def _current(self, queue: str, receipt: str) -> Lease | None:
        parse_receipt(receipt)  # InvalidMessage for one fairq never made
        lease = self._leases.get(receipt)
        if lease is None or lease.queue != queue:
            return None
        if lease.generation != self.link.generation or not lease.feed.live():
            self._end(receipt)
            return None
        if lease.deadline <= self.clock.now():
            return None  # ran out: _expire_leases returns it
        return lease

    def _end(self, receipt: str) -> Lease | None:
        lease = self._leases.pop(receipt, None)
        if lease is not None:
            lease.feed.leases -= 1
        return lease

    async def _settle(self, lease: Lease, how: str, requeue: bool = False) -> None:
        """Ack (``ack``) or nack (``nack``, requeue or not) the lease's delivery."""
        ch = lease.feed.channel
        if ch is None or ch.is_closed:
            raise LeaseLost([], "the channel of this delivery closed")
        if how == "ack":
            lease.feed.ack(lease.tag)
            return
        lease.feed.nacked(lease.tag)
        with driver_errors(f"settling a delivery of {lease.queue!r}", self.url.masked):
            await ch.basic_nack(lease.tag, requeue=requeue)

    async def ack(self, queue: str, receipts: list[str]) -> list[str]:
        await self._config(queue)
        await self._expire_leases()
        lost = []
        acked = 0
        ticketed: list[Lease] = []
        for receipt in receipts:
            lease = self._current(queue, receipt)
            if lease is None:
                lost.append(receipt)
                continue
            self._end(receipt)
            await self._settle(lease, "ack")
            acked += 1
            if lease.ticket is not None:
                ticketed.append(lease)
        if acked:
            self._count(queue, "acked", acked)
            self.wakeups.notify([queue])
        if ticketed:
            await self._tickets_done(ticketed)
        return lost

    def _one(self, queue: str, receipt: str) -> Lease:
        lease = self._current(queue, receipt)
        if lease is None:
            raise LeaseLost([receipt])
        self._end(receipt)
        return lease

    async def nack(self, queue: str, receipt: str, delay: float, error: str | None = None) -> None:
        config = await self._config(queue)
        await self._expire_leases()
        lease = self._one(queue, receipt)
        self._count(queue, "nacked")
        await self._give_back(lease, config, delay, error)

    async def _give_back(
        self, lease: Lease, config: QueueConfig, delay: float, error: str | None = None
    ) -> None:
        """A delivery ended without success (nack or expired lease): visible again after
        ``delay``, or dead-lettered if it was the last allowed attempt (``error``: why it
        failed, the dead letter's ``fairq.detail``)."""
        if config.max_attempts is not None and lease.attempt >= config.max_attempts:
            if not lease.settled:
                await self._dead_letter(lease, config, "max_attempts", error)
                lease.settled = True
            if lease.ticket is not None:
                await self._tickets_done([lease])
        else:
            if lease.settled:
                pass  # a retry (the store step failed before): RabbitMQ has it back
            elif delay > 0:
                await self._copy(lease, lease.queue, lease.attempt, delay)
            elif topology.quorum(config) and not await self._classic(lease.queue):
                lease.feed.returns(lease.message_id)
                await self._settle(lease, "nack", requeue=True)  # to the tail, delivery count + 1
            else:
                await self._copy(lease, lease.queue, lease.attempt, 0.0)
            lease.settled = True
            if lease.ticket is not None:
                await self._ticket_back(lease, delay)
        self.wakeups.notify([lease.queue])

    async def _copy(self, lease: Lease, queue: str, prior: int, delay: float) -> None:
        """Publish a copy of the leased message to ``queue`` (after ``delay``) whose deliveries
        start after ``prior`` attempts, then ack the original."""
        headers = {k: v for k, v in lease.headers.items() if not hidden(k)}
        if prior:
            headers[PRIOR] = prior
        exchange, key = await self._route(queue, delay)
        (took,) = await self._publish(
            [(exchange, key, lease.body, headers, lease.priority, lease.message_id)],
            f"requeueing a message of {lease.queue!r}",
        )
        if not took:
            raise QueueFull(queue, 0, "RabbitMQ refused the message back", "reject")
        await self._settle(lease, "ack")

    async def _dead_letter(
        self,
        lease: Lease,
        config: QueueConfig,
        reason: str,
        detail: str | None = None,
        attempts: int | None = None,
    ) -> None:
        if reason == "expired":
            self._count(lease.queue, "expired")
        target = config.dead_letter
        if target is None:
            self._count(lease.queue, "discarded")
            await self._settle(lease, "ack")
            return
        attrs = attributes_of(lease.headers, lease.message_id, self._level_queues)
        headers: dict[str, Any] = dead_letter_attributes(
            attrs,
            reason,
            lease.queue,
            lease.message_id,
            lease.attempt if attempts is None else attempts,
            detail,
        )
        (took,) = await self._publish(
            [("", target, lease.body, headers, 0, self._new_id())],
            f"dead-lettering a message of {lease.queue!r}",
        )
        if not took:
            raise QueueFull(target, 0, "the dead-letter queue refused the message", "reject")
        await self._settle(lease, "ack")
        self._count(lease.queue, "dead_lettered")
        self._count(target, "sent")  # as on every engine: a dead letter is sent to its queue

    async def extend(self, queue: str, receipts: list[str], seconds: float) -> list[str]:
        await self._config(queue)
        await self._expire_leases()
        lost = []
        ticketed: list[Lease] = []
        now = self.clock.now()
        for receipt in receipts:
            lease = self._current(queue, receipt)
            if lease is None:
                lost.append(receipt)
                continue
            lease.deadline = now + seconds
            self._deadline(lease.deadline, receipt)
            if lease.ticket is not None:
                ticketed.append(lease)
        self._kick.set()
        if ticketed:
            await self._tickets_extended(ticketed, seconds)
        return lost

    async def release(self, queue: str, receipts: list[str]) -> list[str]:
        await self._config(queue)
        await self._expire_leases()
        lost = []
        for receipt in receipts:
            lease = self._current(queue, receipt)
            if lease is None:
                lost.append(receipt)
                continue
            self._end(receipt)
            await self._copy(lease, queue, lease.attempt - 1, 0.0)
            if lease.ticket is not None:
                await self._ticket_back(lease, None)
        self.wakeups.notify([queue])
        return lost

    async def dead_letter(self, queue: str, receipt: str, reason: str) -> None:
        config = await self._config(queue)
        await self._expire_leases()
        lease = self._one(queue, receipt)
        await self._dead_letter(lease, config, "rejected", reason)
        if lease.ticket is not None:
            await self._tickets_done([lease])
        self.wakeups.notify([queue])

    # -- tickets: the store's side of an attention work queue's leases (attention.py) -----
    async def _tickets_done(self, leases: list[Lease]) -> None:
        """The deliveries of ``leases`` are gone for good (acked, dead-lettered): so are
        their tickets."""

    async def _ticket_back(self, lease: Lease, delay: float | None) -> None:
        """The lease's delivery went back to its queue, visible after ``delay`` (None: at
        once, without counting an attempt): so does its ticket."""

    async def _tickets_extended(self, leases: list[Lease], seconds: float) -> None:
        """The leases now end ``seconds`` from now: their tickets' leases follow."""

    # -- lease ends ------------------------------------------------------------------------
    def _deadline(self, deadline: float, receipt: str) -> None:
        """Keep the lease of ``receipt`` until ``deadline`` (its entry in the heap)."""
        self._deadlines_limit = heaps.push(
            self._deadlines, (deadline, receipt), self._deadlines_limit, self._standing
        )

    def _standing(self, entry: tuple[float, str]) -> bool:
        """Whether a heap entry is still its lease's end (not settled, not extended)."""
        lease = self._leases.get(entry[1])
        return lease is not None and lease.deadline == entry[0]

    async def _expire_leases(self) -> None:
        """Give back every lease of this process whose visibility timeout has run out. A
        give-back that fails (the store away) is tried again at the next call, so the
        message never stays unacked on a live channel, out of everyone's reach."""
        heap = self._deadlines
        if not heap and not self._returns:
            return
        expired, self._returns = self._returns, []
        now = self.clock.now()
        while heap and heap[0][0] <= now:
            deadline, receipt = heapq.heappop(heap)
            lease = self._leases.get(receipt)
            if lease is None or lease.deadline != deadline:
                continue  # settled, or extended (a later entry)
            self._end(receipt)
            expired.append(lease)
        for i, lease in enumerate(expired):
            if lease.generation != self.link.generation or not lease.feed.live():
                continue  # its channel closed: the broker has it back already
            try:
                config = await self._config(lease.queue)
                await self._give_back(lease, config, 0.0)
            except QueueNotFound:
                continue
            except Exception as exc:
                if not self._returns_failing:
                    self._returns_failing = True
                    log.warning(
                        "could not return an expired lease of %s (%s); trying again every "
                        "second until it works",
                        lease.queue,
                        exc,
                    )
                self._returns.extend(expired[i:])
                return
        if self._returns_failing:
            self._returns_failing = False
            log.info("expired leases are returned again")

    async def _lease_timer(self) -> None:
        """Return expired leases while nobody calls in (other processes wait for them)."""
        while True:
            self._kick.clear()
            heap = self._deadlines
            sleep = 1.0
            if heap:
                sleep = min(sleep, max(0.0, heap[0][0] - self.clock.now()))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(sleep):
                    await self._kick.wait()
            try:
                await self._expire_leases()
                await self._release_idle()
            except Exception:
                log.warning("lease timer failed", exc_info=True)

    async def _return_held(self) -> None:
        """On close: give back what the feeds prefetched but nobody leased, each as a copy
        with its attempts so far (a channel close would count one more on quorum queues)."""
        for feed in list(self._feeds.values()):
            held = await feed.stop()
            if held and feed.live():
                await self._put_back_all(feed, feed.generation, held)

    async def _put_back_all(self, feed: Feed, generation: int, held: list[Delivered]) -> None:
        """Put back deliveries ``feed`` held (:meth:`_put_back`); if one cannot go back
        (the broker went away), it and the rest go back to the queue with a plain requeue,
        or with the channel when it closes: none stays unacked out of everyone's reach."""
        for i, delivered in enumerate(held):
            if not feed.live() or feed.generation != generation:
                return  # the channel closed: the broker has them back already
            try:
                await self._put_back(feed, delivered)
            except Exception as exc:
                log.warning(
                    "could not give back %d message(s) of %s: %s", len(held) - i, feed.queue, exc
                )
                if feed.channel is not None and feed.live() and feed.generation == generation:
                    for rest in held[i:]:
                        feed.give_back(feed.channel, int(rest.delivery.delivery_tag))
                return

    async def _put_back(self, feed: Feed, delivered: Delivered) -> None:
        """A delivery ``feed`` holds and nobody leased, back to its queue as a copy with
        its attempts so far; if the queue refuses the copy (full), a plain requeue."""
        headers = dict(delivered.header.properties.headers or {})
        lease = Lease(
            feed.queue,
            feed,
            feed.generation,
            delivered.delivery.delivery_tag,
            delivered.header.properties.message_id or self._new_id(),
            delivered.body,
            headers,
            delivered.header.properties.priority or 0,
            0,
            0.0,
            0.0,
        )
        prior = int(headers.get(PRIOR, 0)) + int(headers.get("x-delivery-count", 0))
        try:
            await self._copy(lease, feed.queue, prior, 0.0)
        except QueueFull:
            if feed.channel is not None:
                feed.give_back(feed.channel, int(delivered.delivery.delivery_tag))

    async def next_due(self) -> float | None:
        heap = self._deadlines
        while heap and heap[0][1] not in self._leases:
            heapq.heappop(heap)
        return heap[0][0] if heap else None
