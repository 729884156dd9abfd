"""Deliveries from RabbitMQ and fairq's leases on them.

A *feed* is one consumer per queue per broker process (``basic.consume`` with a prefetch on
a channel of its own). What RabbitMQ pushes waits in the feed's buffer (``held``) until a
``receive`` takes it and starts a *lease*: the delivery stays unacked on that channel until
it is acked, nacked, dead-lettered or its visibility timeout ends, so a crashed consumer's
messages return to the queue at once (the channel closes with the connection).

``receive`` with an empty buffer asks with ``basic.get``; an empty answer is asked once more
on the same channel: deliveries the broker had already sent this consumer arrive before that
second answer (a channel's frames keep their order), so an empty receive means the queue
has nothing visible for this process, not "still in flight".

A *lane* is a feed that does not consume (``consume=False``): a channel that asks for the
messages of any queue — attention slices use a few of them rather than a consumer per work
queue (``attention.py``). It asks with ``basic.get``, one message a round trip (aiormq
answers one ``basic.get`` of a channel at a time: a lock, one waiting future), or, for
several messages at once, with ``take``: a consumer that lives for two or three round
trips — ``basic.qos`` (prefetch ``n``, for the consumers made after it; skipped when the
lane's last one set ``n``), ``basic.consume``, ``basic.cancel`` — and so receives at most
``n`` messages, those ready when it started;
everything delivered to it arrives before the broker's ``cancel-ok`` (AMQP 0-9-1: no
message for a consumer after it), so nothing is left in flight when ``take`` returns.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .link import Channel, Link, driver_errors, spec

__all__ = ["Feed", "Lease"]

log = logging.getLogger("fairq.amqp")

Delivered = Any  # aiormq.abc.DeliveredMessage
_RETURN_WAIT = 0.25  # seconds stats wait for a nacked-back delivery to come back
_GAP_MAX = 10.0  # a gap between receives counts at most this long in the average
_IDLE_MAX = 5.0  # a process that asked nothing for this long is idle on the queue


@dataclass(slots=True, eq=False)
class Lease:
    """One current delivery handed to user code."""

    queue: str
    feed: Feed
    generation: int
    tag: int
    message_id: str
    body: bytes
    headers: dict[str, Any]
    priority: int
    attempt: int
    deadline: float
    enqueued_at: float
    #: the store's receipt of the message's ticket (an attention work queue's message,
    #: ``attention.py``), settled along with the delivery; None for other queues
    ticket: str | None = None
    #: the delivery was settled with RabbitMQ by a give-back whose store step then failed:
    #: a retry does the store step only (``_give_back``)
    settled: bool = False


@dataclass(slots=True, eq=False)
class Feed:
    """The consumer of one queue in this process."""

    queue: str
    link: Link
    prefetch: int
    on_delivery: Callable[[str], None]
    #: False for a *lane*: a channel that only asks (``basic.get``) from any queue
    consume: bool = True
    held: collections.deque[Delivered] = field(default_factory=collections.deque)
    channel: Channel | None = None
    generation: int = -1
    consumer_tag: str | None = None
    leases: int = 0  # this feed's live leases
    #: delivery tags of this channel not acked or nacked yet (held, leased)
    unsettled: set[int] = field(default_factory=set)
    _acks: list[int] = field(default_factory=list)
    _acking: asyncio.Task[None] | None = None
    #: message ids this process nacked back, until the broker delivers them again here
    returning: dict[str, float] = field(default_factory=dict)
    returned: asyncio.Event = field(default_factory=asyncio.Event)
    _starting: asyncio.Lock = field(default_factory=asyncio.Lock)
    #: held while this channel's ``basic.qos`` is set for a consumer about to start (``take``)
    _qos: asyncio.Lock = field(default_factory=asyncio.Lock)
    #: the channel whose last ``basic.qos`` set ``_qos_count`` (None: not known)
    _qos_channel: Channel | None = None
    _qos_count: int = 0
    #: acks confirmed by a later answer (``sync_acks``): on ``_ack_channel``, ``_sent`` ack
    #: flushes were written, the first ``_confirmed`` of them are known to be processed
    _ack_channel: Channel | None = None
    _sent: int = 0
    _confirmed: int = 0
    _flushing: int = 0  # flushes writing their frames right now
    _written: asyncio.Event = field(default_factory=asyncio.Event)  # set: none is
    _confirms: list[tuple[int, asyncio.Future[None]]] = field(default_factory=list)
    _holding: bool = False  # acks wait for the consumer's cancel (hold_acks)
    #: when this process last asked for messages of the queue (``receive``), loop time,
    #: and the most it asked for in one call since the consumer last started: an idle
    #: consumer's deliveries go back to the queue (``AmqpLeases._release_idle``)
    asked_at: float = 0.0
    asked_most: int = 0
    #: when each delivery the consumer pushed arrived (loop time), by delivery tag
    arrived: dict[int, float] = field(default_factory=dict)
    #: the usual time between two receives (a moving average), 0.0 until there were two
    gap: float = 0.0

    def held_for(self, now: float) -> float:
        """How long the first delivery in the buffer (the next a receive takes) has waited
        there: long when this process takes fewer than its consumer is pushed."""
        if not self.held:
            return 0.0
        arrived = self.arrived
        if len(arrived) > 2 * len(self.unsettled) + 64:  # settled ones: forget them
            self.arrived = {t: at for t, at in arrived.items() if t in self.unsettled}
        return now - self.arrived.get(int(self.held[0].delivery.delivery_tag), now)

    def asked(self, now: float) -> None:
        """A receive asks for messages of the queue now."""
        if self.asked_at:
            gap = min(now - self.asked_at, _GAP_MAX)
            self.gap = gap if not self.gap else 0.8 * self.gap + 0.2 * gap
        self.asked_at = now

    def idle_after(self, least: float) -> float:
        """Seconds without a receive after which this process is idle on the queue: at
        least ``least``, three times the usual gap between its receives, at most 5 s."""
        return min(_IDLE_MAX, max(least, 3 * self.gap))

    @property
    def key(self) -> str:
        return f"feed:{self.queue}"

    def live(self) -> bool:
        ch = self.channel
        return ch is not None and not ch.is_closed and self.generation == self.link.generation

    async def start(self) -> Channel:
        """The feed's channel, consuming (started again after a reconnect or channel error,
        and after :meth:`stop` on a channel that stayed open)."""
        if self.live() and (self.consumer_tag is not None or not self.consume):
            assert self.channel is not None
            return self.channel
        async with self._starting:
            if self.live():
                assert self.channel is not None
                if self.consume and self.consumer_tag is None:
                    async with self._qos:  # the consumer made next gets this prefetch
                        with driver_errors(f"consuming queue {self.queue!r}", self.link.url.masked):
                            await self._set_qos(self.channel, self.prefetch)
                    await self._consume(self.channel)
                return self.channel
            self.held.clear()  # whatever the old channel held went back to the queue
            self.arrived.clear()
            self.leases = 0
            self.unsettled.clear()
            self._acks.clear()
            self.link.forget(self.key)
            ch = await self.link.channel(self.key, prefetch=self.prefetch)
            self._qos_channel, self._qos_count = ch, self.prefetch
            # set before consuming: the first deliveries may run before consume-ok returns
            self.channel, self.generation = ch, self.link.generation
            self.consumer_tag = None
            if not self.consume:
                return ch
            await self._consume(ch)
            return ch

    async def _consume(self, ch: Channel) -> None:
        if self._cancelled not in ch.on_consumer_cancel_callbacks:
            ch.on_consumer_cancel_callbacks.add(self._cancelled)
        with driver_errors(f"consuming queue {self.queue!r}", self.link.url.masked):
            ok = await ch.basic_consume(self.queue, self._deliver, no_ack=False)
        self.consumer_tag = ok.consumer_tag

    async def _cancelled(self, frame: Any) -> None:
        """RabbitMQ cancelled this feed's consumer (``basic.cancel`` from the broker: the
        queue was deleted, by another process most often). The feed consumes again at its
        next :meth:`start` — a queue declared again under the same name (a subscription
        made anew) is a new queue, which the old consumer would never hear from."""
        if frame.consumer_tag is not None and frame.consumer_tag == self.consumer_tag:
            self.consumer_tag = None
            for message in self.held:  # deliveries of the deleted queue: gone with it
                self.unsettled.discard(int(message.delivery.delivery_tag))
            self.held.clear()

    async def _deliver(self, message: Delivered) -> None:
        if message.channel is self.channel:
            self.arrived[int(message.delivery.delivery_tag)] = asyncio.get_running_loop().time()
            self.held.append(message)
            self.unsettled.add(message.delivery.delivery_tag)
            mid = message.header.properties.message_id
            if self.returning and self.returning.pop(mid, 0) and not self.returning:
                self.returned.set()
            self.on_delivery(self.queue)

    def returns(self, message_id: str) -> None:
        """A delivery of ``message_id`` was nacked back to the queue: until it comes back
        (or a moment passes) it is in neither the broker's ready count nor the buffer."""
        self.returning[message_id] = time.monotonic() + _RETURN_WAIT
        self.returned.clear()

    async def settled(self) -> None:
        """Wait (briefly) until what this process nacked back is counted somewhere again."""
        now = time.monotonic()
        for mid, until in list(self.returning.items()):
            if until <= now:
                del self.returning[mid]
        if self.returning:
            wait = max(self.returning.values()) - now
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self.returned.wait()
            self.returning.clear()

    async def get(self, queue: str | None = None) -> Delivered | None:
        """One message of ``queue`` (default: the feed's) by ``basic.get`` (None: the queue
        had none ready)."""
        queue = self.queue if queue is None else queue
        ch = await self.start()
        # a cancelled RPC would cost the channel (and every lease on it): let the get finish,
        # and keep what it brings if nobody waits for it any more
        seq = self._sent
        task = asyncio.ensure_future(ch.basic_get(queue, no_ack=False))
        try:
            with driver_errors(f"receiving from queue {queue!r}", self.link.url.masked):
                got = await asyncio.shield(task)
        except asyncio.CancelledError:
            task.add_done_callback(lambda t: self._orphan(t, ch))
            raise
        self._answered(ch, seq)
        if isinstance(got.delivery, spec.Basic.GetEmpty):
            return None
        self.unsettled.add(int(got.delivery.delivery_tag or 0))  # type: ignore[union-attr]
        return got

    async def take(self, queue: str, n: int) -> list[Delivered]:
        """Up to ``n`` ready messages of ``queue`` in two or three round trips, in order
        (fewer: the queue had fewer ready). Each is unacked on this channel, as after a
        ``get``."""
        ch = await self.start()
        task = asyncio.ensure_future(self._take(ch, queue, n))
        try:  # as in get: the channel's RPCs run to their end, cancelled or not
            with driver_errors(f"receiving from queue {queue!r}", self.link.url.masked):
                return await asyncio.shield(task)
        except asyncio.CancelledError:
            task.add_done_callback(lambda t: self._orphans(t, ch))
            raise

    async def _set_qos(self, ch: Channel, n: int) -> None:
        """``basic.qos`` prefetch ``n`` on ``ch`` for the consumers made after it, unless
        its last one set ``n`` already (one round trip less). Under ``_qos``."""
        if self._qos_channel is not ch or self._qos_count != n:
            self._qos_channel = None
            await ch.basic_qos(prefetch_count=n)
            self._qos_channel, self._qos_count = ch, n

    async def _take(self, ch: Channel, queue: str, n: int) -> list[Delivered]:
        got: list[Delivered] = []

        async def delivered(message: Delivered) -> None:
            got.append(message)

        async with self._qos:  # no other basic.qos between this one and the consume
            await self._set_qos(ch, n)  # a slice's receives mostly ask as many
            seq = self._sent
            ok = await ch.basic_consume(queue, delivered, no_ack=False)
            self._answered(ch, seq)
        try:
            seq = self._sent
            await ch.basic_cancel(str(ok.consumer_tag))
            self._answered(ch, seq)
        except BaseException:
            if not ch.is_closed:  # (a closed channel gave them back to the queue)
                for message in got:
                    self.give_back(ch, int(message.delivery.delivery_tag))
            raise
        # aiormq runs a consumer callback as a task made when its frame is read, so those
        # of the deliveries before cancel-ok were scheduled before this call's answer: one
        # pass of the loop and they have all run
        await asyncio.sleep(0)
        for message in got:
            self.unsettled.add(int(message.delivery.delivery_tag))
        return got

    def _orphans(self, task: asyncio.Future[list[Delivered]], ch: Channel) -> None:
        """A ``take`` nobody waits for any more: what it brought goes back to the queue."""
        if task.cancelled() or task.exception() is not None or ch is not self.channel:
            return
        for message in task.result():
            self.give_back(ch, int(message.delivery.delivery_tag))

    def give_back(self, ch: Channel, tag: int) -> None:
        """Nack delivery ``tag`` back to its queue, in the background (nobody leased it)."""
        self.unsettled.discard(tag)
        task = asyncio.ensure_future(ch.basic_nack(tag, requeue=True))
        task.add_done_callback(lambda t: t.cancelled() or t.exception())

    def _orphan(self, task: asyncio.Future[Delivered], ch: Channel) -> None:
        if task.cancelled() or task.exception() is not None:
            return
        got = task.result()
        if not isinstance(got.delivery, spec.Basic.GetEmpty) and ch is self.channel:
            if not self.consume:  # a lane holds nothing for later: back it goes
                self.give_back(ch, got.delivery.delivery_tag)
                return
            self.unsettled.add(got.delivery.delivery_tag)
            self.held.appendleft(got)
            self.on_delivery(self.queue)

    # -- acks ------------------------------------------------------------------------------
    def ack(self, tag: int) -> None:
        """Ack delivery ``tag`` of the current channel. The acks asked for during one pass of
        the event loop go out together: one ``basic.ack(multiple)`` for all of them that lie
        below every delivery still unsettled, one frame each for the others."""
        self.unsettled.discard(tag)
        self._acks.append(tag)
        if self._acking is None:
            self._acking = asyncio.get_running_loop().create_task(self._send_acks())

    def nacked(self, tag: int) -> None:
        self.unsettled.discard(tag)

    async def _send_acks(self) -> None:
        try:
            await asyncio.sleep(0)  # the other acks of this pass join in
            await self.flush_acks()
        finally:
            self._acking = None

    def hold_acks(self) -> None:
        """Send no ack until :meth:`stop` has cancelled the consumer: an ack that reaches
        the broker first opens the prefetch window, the queue hands the consumer more
        messages, and the cancel returns those (on a quorum queue, with one more
        ``x-delivery-count``: an attempt nobody made)."""
        self._holding = True

    async def flush_acks(self) -> None:
        if self._holding:
            return  # sent once the consumer is cancelled (stop)
        tags, self._acks = self._acks, []
        ch = self.channel
        if not tags or ch is None or ch.is_closed:
            return
        if ch is not self._ack_channel:  # a new channel: what the old one confirmed is moot
            self._ack_channel, self._sent, self._confirmed = ch, 0, 0
            self.hurry()
        tags.sort()
        low = min(self.unsettled, default=None)
        cut = len(tags) if low is None else bisect.bisect_left(tags, low)
        self._flushing += 1
        self._written.clear()
        try:
            if cut:
                await ch.basic_ack(tags[cut - 1], multiple=cut > 1, wait=False)
            for tag in tags[cut:]:
                await ch.basic_ack(tag, wait=False)
        except Exception:  # the channel closed: the broker gives those deliveries back
            log.debug("acks on %s were not sent", self.queue, exc_info=True)
        finally:
            self._flushing -= 1
            if not self._flushing:
                self._written.set()
        if ch is self._ack_channel:
            self._sent += 1  # written: an RPC asked from now on is answered after them

    def _answered(self, ch: Channel, seq: int) -> None:
        """An RPC asked on ``ch`` when ``seq`` ack flushes had been written was answered:
        the broker processed those acks before it (a channel's frames keep their order)."""
        if ch is not self._ack_channel or seq <= self._confirmed:
            return
        self._confirmed = seq
        waiting, self._confirms = self._confirms, []
        for target, fut in waiting:
            if target <= seq:
                if not fut.done():
                    fut.set_result(None)
            else:
                self._confirms.append((target, fut))

    def hurry(self) -> None:
        """Wake every ``sync_acks`` waiting for a later answer: it makes its own now."""
        waiting, self._confirms = self._confirms, []
        for _, fut in waiting:
            if not fut.done():
                fut.set_result(None)

    async def sync_acks(
        self, patience: float = 0.0, hurried: Callable[[], bool] = lambda: False
    ) -> bool:
        """Send the acks asked for and learn that the broker processed them: True once it
        has (an answer on the channel to an RPC asked after them came back), False if the
        channel went away (the broker returns their messages to their queues). With
        ``patience`` it waits that long for such an answer to a lane's own ``get`` or
        ``take`` (unless ``hurried()``, or until :meth:`hurry`) before it makes a round
        trip of its own (``basic.qos``)."""
        await self.flush_acks()
        if self._flushing:  # another flush's frames are still being written
            await self._written.wait()
        ch = self.channel
        if ch is None or not self.live():
            return False
        target = self._sent
        if ch is self._ack_channel and self._confirmed >= target:
            return self.live()
        if patience > 0 and ch is self._ack_channel and not hurried():
            fut = asyncio.get_running_loop().create_future()
            self._confirms.append((target, fut))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(patience):
                    await fut
            if ch is self._ack_channel and self._confirmed >= target:
                return self.live()
        try:
            async with self._qos:  # any basic.qos will do: the prefetch it had
                count = self._qos_count if self._qos_channel is ch else self.prefetch
                self._qos_channel = None
                await ch.basic_qos(prefetch_count=count)
                self._qos_channel, self._qos_count = ch, count
        except Exception:
            log.debug("the channel of %s went away before its acks were confirmed", self.queue)
            return False
        self._answered(ch, target)
        return self.live()

    async def stop(self) -> list[Delivered]:
        """Stop consuming; return what was held (still unacked on the channel): every
        delivery of the consumer — the broker sends none after its ``cancel-ok``, so the
        buffer is read once that has come, not before (deliveries on their way would stay
        unacked and go back when the channel closes, an attempt counted that nobody made).
        Acks wait for the cancel (:meth:`hold_acks`)."""
        self.hold_acks()
        ch = self.channel
        if ch is not None and self.live() and self.consumer_tag is not None:
            try:
                await ch.basic_cancel(self.consumer_tag)
            except Exception:  # the channel may be going away anyway
                log.debug("could not cancel the consumer of %s", self.queue, exc_info=True)
        self.consumer_tag = None  # start() consumes again
        self._holding = False
        if self._acks and self._acking is None:  # the acks held meanwhile go out now
            self._acking = asyncio.get_running_loop().create_task(self._send_acks())
        held = list(self.held)
        self.held.clear()
        return held

    async def resize(self, prefetch: int) -> None:
        """Consume with prefetch ``prefetch`` from now on; what the consumer holds stays
        held (cancelling a consumer leaves its deliveries unacked on the channel)."""
        if prefetch == self.prefetch:
            return
        self.prefetch = prefetch
        if self.live() and self.consumer_tag is not None:
            held = await self.stop()
            self.held.extend(held)
            await self.start()

    async def close(self) -> None:
        self._holding = False  # whatever happened to stop(): the acks go out
        await self.flush_acks()
        ch, self.channel = self.channel, None
        self.held.clear()
        self.link.forget(self.key)
        if ch is not None and not ch.is_closed:
            try:
                await ch.close()
            except Exception:
                log.debug("could not close the channel of %s", self.queue, exc_info=True)
