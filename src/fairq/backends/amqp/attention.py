"""Attention domains on RabbitMQ: the work in RabbitMQ, every decision in the store.

Each key's work queue (``process.{domain}.{key}.work``) is a RabbitMQ queue like any fairq
queue here (durable, quorum unless its options need a classic one, persistent messages,
publisher confirms). What decides who works on what — signals, their coalescing, the
tenants' virtual time, concurrency tokens, token buckets, states, stats — is the store's own
attention machinery (``attention_policy.py`` in every engine), run over **tickets**:

* the store keeps, beside work queue ``Q``, a queue ``fairq:Q`` of tickets — one small
  message (its body: when its message becomes available) per message of ``Q`` — and a domain
  of the same name whose work queues are the ticket queues. Every engine's attention code
  reads its work queue's visible, delayed and leased messages to decide (empty, fan out,
  re-signal, delayed signals, clear times, key and tenant stats); it reads the tickets;
* a ticket follows its message: leased with it (a little longer), acked with it, back with
  it (a nack, a lease that ran out), extended with it. Tickets are interchangeable: a slice
  leases ``k`` tickets and asks RabbitMQ for ``k`` messages (``basic.get``) of the key's
  queue, whichever they are;
* **publish** writes the tickets and the signal in one step of the store, *then* publishes
  to RabbitMQ with confirms. A crash between the two leaves a ticket without its message
  (never a message without a signal): a slice that finds no message for a ticket puts the
  ticket back with a growing delay and drops it after ``MISSES`` tries, so such a ticket
  costs a few empty looks, and a fresh ticket whose publish is still on its way is waited
  for a few milliseconds first;
* the **reconciler** repairs the other direction, messages without tickets — put into a
  work queue past fairq (another AMQP client, a crash after a redrive's publish, a publish
  confirmed after its tickets were dropped): the management API lists the domain's work queues
  with ready messages (one call, no per-key polling), each of those is counted exactly
  (``queue.declare passive``) against its tickets, and the difference becomes tickets;
  then the store's own reconciler signals keys with backlog and no signal.

The user's options of a domain (work queue template, queue options) are kept in the store
as an idempotency record (namespace ``fairq.amqp``); the store's domain has the ticket
queues' template and options. Wake-ups of ``attention:<domain>`` are the store's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
import zlib
from dataclasses import dataclass, replace
from typing import Any

import orjson

from ...errors import (
    BATCH_LARGER,
    AttentionNotFound,
    ConnectionError,
    FairqError,
    LeaseLost,
    QueueFull,
    QueueNotFound,
)
from ...message import Received
from ...model.attention import (
    AttentionConfig,
    AttentionStats,
    KeyStats,
    SignalHint,
    Slice,
    TenantStats,
)
from ...model.queues import Envelope, QueueConfig, queue_config_from_options
from ..attention_policy import check_change
from ..rules import check_priorities
from . import topology
from .feeds import Feed, Lease
from .link import driver_errors
from .tickets import (
    MARGIN,
    MISSES,
    StoreWakeups,
    due_of,
    key_pattern,
    store_config,
    ticket,
    tickets_of,
)
from .topics import AmqpTopics

__all__ = ["AmqpAttention"]

log = logging.getLogger("fairq.amqp")

_RECORDS = "fairq.amqp"  # the idempotency namespace holding the domains' own options
_FOREVER = 1e9  # seconds such a record is kept (it is replaced or deleted, never expires)
_CONFIG_TTL = 2.0  # seconds a domain's options are cached
_TICKETED_TTL = 2.0  # seconds "is this queue an attention work queue" is cached
_MISS_FIRST = 0.02  # seconds a missed ticket waits before its next look, doubling
_MISS_MOST = 2.0
_FRESH = 1.0  # seconds after its due time a ticket's message may still be on its way
_FRESH_WAIT = 0.1  # seconds a slice waits for such a message, looking more and more rarely
_UNTICKET_LEASE = 5.0
_LANES = 8  # channels that ask for attention work (a key always uses the same one)
_TAKE_FROM = 3  # tickets a slice's receive takes with a consumer (take: 3 round trips)


_PATIENCE = 0.005  # seconds a round of ticket acks waits for a lane's own answer (feeds.py)


@dataclass(slots=True)
class _Round:
    """A round of ticket acks on its way: what it carries, and its end."""

    queues: set[str]
    lanes: list[Feed]
    done: asyncio.Future[None]
    task: asyncio.Task[None] | None = None  # (held: the loop keeps only weak references)
    hurried: bool = False  # someone waits for it: no more waiting for the lanes' answers
    number: int = 0  # rounds are numbered from 1, and end in that order


class AmqpAttention(AmqpTopics):
    """Attention domains over RabbitMQ work queues and the store's tickets."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.wakeups = StoreWakeups(self, self.store.wakeups)
        self._domains: dict[str, tuple[AttentionConfig, float]] = {}
        self._ticketed: dict[str, tuple[bool, float]] = {}
        self._slice_queues: dict[str, str] = {}  # slice token -> work queue
        #: slice token -> its lane, when the key's slices may run side by side (else the
        #: key's own lane, ``_lane``)
        self._slice_lanes: dict[str, Feed] = {}
        #: ticket queue -> (receipt, the lane its message was acked on, its generation)
        self._ticket_acks: dict[str, list[tuple[str, Feed, int]]] = {}
        #: the round of ticket acks on its way: its ticket queues, lanes, and its end
        self._round: _Round | None = None
        self._rounds_started = 0
        self._rounds_done = 0
        self._lanes: list[Feed] = []

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self._flush_ticket_acks()
        for lane in self._lanes:
            with contextlib.suppress(Exception):
                await lane.flush_acks()
        await super().close()

    # -- the domains' options --------------------------------------------------------------
    async def _domain(self, domain: str, fresh: bool = False) -> AttentionConfig:
        self._check_open()
        hit = self._domains.get(domain)
        now = time.monotonic()
        if hit is not None and not fresh and now - hit[1] < _CONFIG_TTL:
            return hit[0]
        record = await self.store.idempotency_record(_RECORDS, f"attention:{domain}")
        if record is None or record.raw is None:
            self._domains.pop(domain, None)
            raise AttentionNotFound(domain)
        config = AttentionConfig.from_dict(orjson.loads(record.raw))
        self._domains[domain] = (config, now)
        return config

    async def _save_domain(self, domain: str, config: AttentionConfig) -> None:
        key, raw = f"attention:{domain}", orjson.dumps(config.to_dict())
        for _ in range(50):  # another process may be writing it at the same moment
            await self.store.forget_claim(_RECORDS, key)
            token = secrets.token_hex(8)
            if await self.store.claim(
                _RECORDS, key, token, 30.0, None
            ) is None and await self.store.complete_claim(_RECORDS, key, token, raw, _FOREVER):
                self._domains[domain] = (config, time.monotonic())
                return
            await asyncio.sleep(0.01)
        raise ConnectionError(f"could not record the options of attention domain {domain!r}")

    async def declare_attention(self, domain: str, config: AttentionConfig) -> None:
        stored = store_config(domain, config)
        try:
            old: AttentionConfig | None = await self._domain(domain, fresh=True)
        except AttentionNotFound:
            old = None
        if old is not None:
            try:
                keys = (await self.store.attention_stats(domain)).keys
            except AttentionNotFound:
                keys = 0
            check_change(domain, old, config, keys > 0)
        await self.store.declare_attention(domain, stored)
        await self._save_domain(domain, config)

    async def attention_config(self, domain: str) -> AttentionConfig:
        return await self._domain(domain)

    async def list_attention(self, prefix: str = "") -> list[str]:
        self._check_open()
        return await self.store.list_attention(prefix)

    async def delete_attention(self, domain: str) -> bool:
        self._check_open()
        existed = await self.store.delete_attention(domain)
        existed = await self.store.forget_claim(_RECORDS, f"attention:{domain}") or existed
        self._domains.pop(domain, None)
        return existed

    async def _work_queue(self, domain: str, key: str) -> tuple[str, QueueConfig]:
        """The key's work queue and its options, declared on first use."""
        config = await self._domain(domain)
        name = config.queue_for(domain, key)
        try:
            return name, await self._config(name)
        except QueueNotFound:
            qconfig = queue_config_from_options(name, dict(config.queue_options))
            self._ticketed[name] = (True, time.monotonic())  # before: it is a classic queue
            await self.declare_queue(name, qconfig)
            return name, qconfig

    async def _classic(self, name: str) -> bool:
        """Attention work queues are classic queues unless ``?attention_queues=quorum``: a
        domain has a queue per key, and a quorum queue is a Raft group that every publisher
        channel registers with (and deregisters from, one log write each, when it closes)
        and that answers each ``basic.get`` through its log (docs/rabbitmq.md)."""
        return self.url.attention_queues == "classic" and await self._is_ticketed(name)

    # -- publishing ------------------------------------------------------------------------
    async def attention_publish(
        self, domain: str, key: str, envelopes: list[Envelope]
    ) -> list[str]:
        queue, config = await self._work_queue(domain, key)
        check_priorities(queue, envelopes, config.max_priority)
        ids = [self._new_id() for _ in envelopes]
        scope = f"queue:{queue}"
        fresh, claimed, answer = await self._dedup(scope, config.dedup_window, envelopes, ids)
        if config.max_length is not None and len(fresh) > config.max_length:
            await self._undedup(scope, claimed)
            raise QueueFull(queue, config.max_length, BATCH_LARGER)
        now = self.clock.now()
        tickets = [ticket(now + envelopes[i].delay, envelopes[i].delay) for i in fresh]
        try:  # the tickets and the signal first: a crash after this leaves no work unsignalled
            await self.store.attention_publish(domain, key, tickets)
            took = await self._publish_new(
                queue, [envelopes[i] for i in fresh], [ids[i] for i in fresh]
            )
        except BaseException:
            await self._undedup(scope, claimed)
            raise
        refused = len(took) - sum(took)
        if refused:
            await self._undedup(scope, claimed)
            await self._untickets(queue, refused)
        self._check_took(queue, config, took)
        return answer

    async def _is_ticketed(self, queue: str) -> bool:
        """Whether ``queue`` is an attention work queue (its tickets are in the store)."""
        hit = self._ticketed.get(queue)
        now = time.monotonic()
        if hit is not None and now - hit[1] < _TICKETED_TTL:
            return hit[0]
        try:
            await self.store.queue_config(tickets_of(queue))
            found = True
        except QueueNotFound:
            found = False
        except ConnectionError:
            if hit is None:
                raise
            # the store is away: what was last known (as for a queue's configuration), so
            # plain sends go on meanwhile
            return hit[0]
        self._ticketed[queue] = (found, now)
        return found

    async def _store_copies(
        self, queue: str, config: QueueConfig, envelopes: list[Envelope], ids: list[str]
    ) -> None:
        """A plain send to an attention work queue brings its tickets (no signal: the
        reconciler signals the key, as on every engine)."""
        if not await self._is_ticketed(queue):
            await super()._store_copies(queue, config, envelopes, ids)
            return
        now = self.clock.now()
        tickets = [ticket(now + e.delay, e.delay) for e in envelopes]
        await self.store.send(tickets_of(queue), tickets)
        took = await self._publish_new(queue, envelopes, ids)
        refused = len(took) - sum(took)
        if refused:
            await self._untickets(queue, refused)
        self._check_took(queue, config, took)

    async def _redriven(self, arrived: dict[str, int]) -> None:
        for queue, n in arrived.items():
            if await self._is_ticketed(queue):
                now = self.clock.now()
                await self._more_tickets(queue, [ticket(now) for _ in range(n)])

    async def _more_tickets(self, queue: str, tickets: list[Envelope]) -> None:
        try:
            await self.store.send(tickets_of(queue), tickets)
        except Exception:  # the reconciler finds what is missing
            log.warning("could not write tickets for %s", queue, exc_info=True)

    async def _untickets(self, queue: str, n: int) -> None:
        """Remove ``n`` tickets of ``queue`` (RabbitMQ refused their messages). Tickets are
        interchangeable: any ``n`` visible ones; what cannot be had now is dropped later by
        the slices that find no message for it."""
        tq = tickets_of(queue)
        try:
            got = await self.store.receive(tq, n, _UNTICKET_LEASE)
            if got:
                await self.store.ack(tq, [t.receipt for t in got])
        except Exception:
            log.warning("could not remove %d ticket(s) of %s", n, queue, exc_info=True)

    # -- slices ----------------------------------------------------------------------------
    async def attention_take(self, domain: str) -> Slice | None:
        got = await self.store.attention_take(domain)
        if got is None:
            return None
        queue = got.queue.removeprefix(topology.RESERVED)
        self._slice_queues[got.token] = queue
        if got.plan.max_concurrency > 1:  # no order to keep between its slices
            self._slice_lanes[got.token] = self._lane(f"{queue}\0{got.token}")
        return replace(got, queue=queue)

    def _lane(self, queue: str) -> Feed:
        """The channel that asks for ``queue``'s messages: always the same one for a queue, so
        a nack and the next look at the queue keep their order — for a key whose plan lets
        several slices run at once (no order between them to keep), one per slice instead
        (``attention_take``): an AMQP channel answers one ``basic.get`` at a time, and one
        lane would make that key's slices wait for each other's."""
        if not self._lanes:
            self._lanes = [
                Feed(f"lane:{i}", self.link, 0, self._delivered, consume=False)
                for i in range(_LANES)
            ]
        return self._lanes[zlib.crc32(queue.encode()) % _LANES]

    async def attention_receive(
        self, domain: str, token: str, n: int, visibility_timeout: float | None
    ) -> tuple[list[Received], float | None]:
        await self._expire_leases()
        queue = self._slice_queues.get(token)
        if queue is not None:
            vt = (await self._config(queue)).visibility_timeout
        else:
            options = (await self._domain(domain)).queue_options
            vt = float(options.get("visibility_timeout", 30.0))
        if visibility_timeout is not None:
            vt = visibility_timeout
        tickets, retry_at = await self.store.attention_receive(domain, token, n, vt + MARGIN)
        if not tickets:
            return [], retry_at
        tq = tickets[0].queue
        queue = tq.removeprefix(topology.RESERVED)
        config = await self._config(queue)
        lane = self._slice_lanes.get(token) or self._lane(queue)
        out: list[Received] = []
        spent: list[str] = []  # tickets whose message was dead-lettered instead
        missed: list[Received] = []
        # several tickets: their messages in one go (a consumer of prefetch len(tickets)
        # for three round trips); the tickets left without a message look one by one
        taken = await lane.take(queue, len(tickets)) if len(tickets) >= _TAKE_FROM else []
        try:
            for i, held in enumerate(tickets):
                got = taken[i] if i < len(taken) else await lane.get(queue)
                if got is None and self._fresh(held):
                    got = await self._wait_for(lane, queue)
                if got is None:
                    missed = tickets[i:]
                    break
                received = await self._lease(lane, config, got, vt, queue)
                if received is None:
                    spent.append(held.receipt)
                    continue
                self._leases[received.receipt].ticket = held.receipt
                out.append(received)
        except BaseException:
            self._untaken(lane, taken, len(out) + len(spent))
            raise
        if spent:
            await self.store.ack(tq, spent)
        if missed:
            await self._missed(tq, missed)
        return out, None

    @staticmethod
    def _untaken(lane: Feed, taken: list[Any], used: int) -> None:
        """A slice's receive failed: the messages it took and did not lease go back (the
        one whose lease failed midway only if its delivery is still unsettled)."""
        ch = lane.channel
        if ch is None or not lane.live():
            return  # the broker gave them back with the channel
        for message in taken[used:]:
            tag = int(message.delivery.delivery_tag)
            if tag in lane.unsettled:  # not leased: a lease is made last in _lease
                lane.give_back(ch, tag)

    def _fresh(self, ticket: Received) -> bool:
        """A first look at a ticket that came due a moment ago: its publish may be on its way."""
        return ticket.attempt == 1 and self.clock.now() - due_of(ticket) < _FRESH

    async def _wait_for(self, lane: Feed, queue: str) -> Any:
        pause, waited = 0.001, 0.0
        while waited < _FRESH_WAIT:
            await asyncio.sleep(pause)
            waited += pause
            got = await lane.get(queue)
            if got is not None:
                return got
            pause *= 2
        return None

    async def _missed(self, tq: str, missed: list[Received]) -> None:
        """Tickets RabbitMQ had no message for: back with a growing delay, or dropped."""
        drop = [t.receipt for t in missed if t.attempt >= MISSES]
        for t in missed:
            if t.attempt < MISSES:
                delay = min(_MISS_MOST, _MISS_FIRST * 2 ** (t.attempt - 1))
                with contextlib.suppress(LeaseLost):
                    await self.store.nack(tq, t.receipt, delay)
        if drop:
            log.info("dropping %d ticket(s) of %s that never found their message", len(drop), tq)
            await self.store.ack(tq, drop)

    async def attention_extend(self, domain: str, token: str) -> bool:
        return await self.store.attention_extend(domain, token)

    async def attention_count(self, domain: str, token: str, key: str, n: int) -> None:
        # the acks went to RabbitMQ (Backend.attention_progress): the count to the store
        await self.store.attention_count(domain, token, key, n)

    async def attention_end(
        self, domain: str, token: str, processed: int, retry_at: float | None
    ) -> None:
        queue = self._slice_queues.pop(token, None)
        self._slice_lanes.pop(token, None)
        # the end sees what the slice has acked (its key's tickets: other keys' acks on their
        # way are not waited for)
        await self._flush_ticket_acks(None if queue is None else tickets_of(queue))
        await self.store.attention_end(domain, token, processed, retry_at)

    # -- tickets follow their leases (hooks of leases.py) ----------------------------------
    async def _tickets_done(self, leases: list[Lease]) -> None:
        """Acked (or dead-lettered) messages' tickets go in the background, coalesced — one
        round of store calls on its way at a time, what is acked meanwhile rides in the
        next — and before a slice of their key ends or stats are read. Until then they are
        leased tickets, which the store counts as in flight, as the message was."""
        for lease in leases:
            assert lease.ticket is not None
            entry = (lease.ticket, lease.feed, lease.generation)
            self._ticket_acks.setdefault(tickets_of(lease.queue), []).append(entry)
        if self._round is None:
            self._start_round(_PATIENCE)

    def _start_round(self, patience: float) -> _Round:
        """Send the waiting ticket acks on their way (no round may be on its way)."""
        assert self._round is None
        pending, self._ticket_acks = self._ticket_acks, {}
        lanes = {id(lane): lane for entries in pending.values() for _, lane, _ in entries}
        done = asyncio.get_running_loop().create_future()
        self._rounds_started += 1
        r = self._round = _Round(set(pending), list(lanes.values()), done)
        r.number = self._rounds_started
        r.task = asyncio.create_task(self._ack_round(pending, r, patience), name="fairq-tickets")
        return r

    async def _ack_round(
        self, pending: dict[str, list[tuple[str, Feed, int]]], r: _Round, patience: float
    ) -> None:
        """Ack the tickets of ``pending`` once RabbitMQ has certainly taken their messages'
        acks: the acks are sent, then an answer on the same channel to a request sent after
        them (the lane's next ``get`` or ``take`` within ``patience``, else a ``basic.qos``
        of its own) says the broker processed what came before it. A message whose ack went
        down with its channel comes back to RabbitMQ, and its ticket stays (leased, then
        visible) to be found with it."""
        try:
            synced = await asyncio.gather(
                *(lane.sync_acks(patience, lambda: r.hurried) for lane in r.lanes)
            )
            taken = {id(lane) for lane, ok in zip(r.lanes, synced, strict=True) if ok}
            acks = {
                tq: [t for t, lane, g in entries if id(lane) in taken and g == lane.generation]
                for tq, entries in pending.items()
            }
            await asyncio.gather(*(self._ack_tickets_of(tq, t) for tq, t in acks.items() if t))
        except Exception:  # their leases run out; slices then find no message for them
            log.warning("could not ack tickets", exc_info=True)
        finally:
            self._round = None
            self._rounds_done = r.number
            if not r.done.done():
                r.done.set_result(None)
            if self._ticket_acks:
                self._start_round(_PATIENCE)

    async def _flush_ticket_acks(self, tq: str | None = None) -> None:
        """Wait until the tickets of the messages acked so far (those of ticket queue
        ``tq``; default: all) are acked in the store, hurrying the rounds that carry them —
        at most the round on its way and the next, whatever is acked meanwhile."""
        r = self._round
        if self._ticket_acks if tq is None else tq in self._ticket_acks:
            need = self._rounds_started + 1  # the next round carries them
        elif r is not None and (tq is None or tq in r.queues):
            need = r.number
        else:
            return
        while self._rounds_done < need:
            r = self._round
            if r is None:
                r = self._start_round(0.0)
            r.hurried = True
            for lane in r.lanes:
                lane.hurry()
            await asyncio.shield(r.done)

    async def _ack_tickets_of(self, tq: str, receipts: list[str]) -> None:
        try:
            await self.store.ack(tq, receipts)
        except Exception:  # its lease runs out; a slice then finds no message for it
            log.warning("could not ack %d ticket(s) of %s", len(receipts), tq, exc_info=True)

    async def _flush_counts(self) -> None:
        await self._flush_ticket_acks()
        await super()._flush_counts()

    async def _ticket_back(self, lease: Lease, delay: float | None) -> None:
        assert lease.ticket is not None
        tq = tickets_of(lease.queue)
        try:
            if not delay:
                await self.store.release(tq, [lease.ticket])
            else:  # a new ticket, due with the message (and with its looks counted afresh)
                await self.store.ack(tq, [lease.ticket])
                await self.store.send(tq, [ticket(self.clock.now() + delay, delay)])
        except Exception:
            log.warning("could not put back a ticket of %s", lease.queue, exc_info=True)

    async def _tickets_extended(self, leases: list[Lease], seconds: float) -> None:
        by_queue: dict[str, list[str]] = {}
        for lease in leases:
            assert lease.ticket is not None
            by_queue.setdefault(tickets_of(lease.queue), []).append(lease.ticket)
        for tq, receipts in by_queue.items():
            try:
                await self.store.extend(tq, receipts, seconds + MARGIN)
            except Exception:
                log.warning("could not extend ticket(s) of %s", tq, exc_info=True)

    # -- the work queues' other paths ------------------------------------------------------
    async def purge(self, queue: str) -> int:
        n = await super().purge(queue)
        if await self._is_ticketed(queue):
            with contextlib.suppress(QueueNotFound):
                await self.store.purge(tickets_of(queue))
        return n

    async def delete_queue(self, name: str) -> bool:
        existed = await super().delete_queue(name)
        with contextlib.suppress(QueueNotFound):
            await self.store.delete_queue(tickets_of(name))
        self._ticketed.pop(name, None)
        return existed

    async def list_queues(self, prefix: str = "") -> list[str]:
        names = await super().list_queues(prefix)
        return [n for n in names if not n.startswith(topology.RESERVED)]

    # -- resources, stats, the reconciler --------------------------------------------------
    async def attention_set_resource(
        self, domain: str, key: str, plan: str | None, state: str | None, tenant: str | None
    ) -> None:
        self._check_open()
        await self.store.attention_set_resource(domain, key, plan, state, tenant)

    async def attention_stats(self, domain: str) -> AttentionStats:
        self._check_open()
        await self._flush_ticket_acks()
        stats = await self.store.attention_stats(domain)
        extra = (await self.store.read_counts(f"attention:{domain}")).get("reconciled", 0)
        return replace(stats, reconciled=stats.reconciled + extra) if extra else stats

    async def attention_key_stats(self, domain: str, top: int) -> list[KeyStats]:
        self._check_open()
        await self._flush_ticket_acks()
        return await self.store.attention_key_stats(domain, top)

    async def attention_tenant_stats(self, domain: str, top: int) -> list[TenantStats]:
        self._check_open()
        await self._flush_ticket_acks()
        return await self.store.attention_tenant_stats(domain, top)

    async def attention_next(self, domain: str) -> SignalHint | None:
        return await self.store.attention_next(domain)

    def attention_scheduled_here(self, domain: str, due: float) -> bool:
        return self.store.attention_scheduled_here(domain, due)

    async def attention_reconcile(self, domain: str) -> int:
        config = await self._domain(domain)
        await self._flush_ticket_acks()
        direct = await self._repair_deficits(domain, config)
        n = await self.store.attention_reconcile(domain)
        if direct:
            await self.store.add_counts(f"attention:{domain}", {"reconciled": direct})
        return n + direct

    async def _repair_deficits(self, domain: str, config: AttentionConfig) -> int:
        """Give tickets to messages that have none; return how many keys unknown to the
        store were signalled on the way (the store's reconciler signals the others)."""
        api = self._management
        if api is None:
            return 0
        pattern = key_pattern(domain, config.work_queue)
        try:
            ready = await api.ready_queues(self.url.vhost, pattern.pattern)
        except Exception:
            log.warning("reconciler: the management API is unavailable", exc_info=True)
            return 0
        admin = await self.link.channel("admin")
        signalled = 0
        for queue in ready:
            match = pattern.match(queue)
            if match is None:
                continue
            try:
                with driver_errors(f"counting queue {queue!r}", self.url.masked):
                    ok = await admin.queue_declare(queue, passive=True)
            except QueueNotFound:
                admin = await self.link.channel("admin")  # the error closed the channel
                continue
            messages = int(ok.message_count or 0)
            tq = tickets_of(queue)
            try:
                s = await self.store.stats(tq)
                covered: int | None = s.visible + s.delayed + s.in_flight
            except QueueNotFound:
                covered = None
            missing = messages - (covered or 0)
            if missing <= 0:
                continue
            log.info("reconciler: %d message(s) of %s had no ticket", missing, queue)
            now = self.clock.now()
            tickets = [ticket(now) for _ in range(missing)]
            if covered is not None:
                await self.store.send(tq, tickets)
                continue
            try:  # a key the store has never seen: its first tickets, with a signal
                await self._work_queue(domain, match.group(1))
                await self.store.attention_publish(domain, match.group(1), tickets)
                signalled += 1
            except FairqError as exc:  # a removed key, a queue fairq did not declare
                log.warning("reconciler: cannot give %s its tickets: %s", queue, exc)
        return signalled
