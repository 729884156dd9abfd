"""The Redis backend's queues: each seam method one script of ``scripts/``.

Deduplication is planned here with the shared rule (``rules.plan_dedup``) from the
queue's dedup entries, and the send script checks that the plan still holds (``STALE``:
another process sent meanwhile; plan again). Records come back as the stream's fields:
``b`` body, ``a`` attributes JSON, ``g`` group, ``p`` priority, ``o`` the original id of
a redriven message, ``dr ds di dn dd`` the dead-letter facts (reason, source, first id,
attempts, detail) that ``rules.dead_letter_attributes`` turns into attributes on read.
"""

from __future__ import annotations

import asyncio
import random
import re
from collections.abc import Sequence
from typing import Any

import orjson

from ...errors import ConfigConflict, LeaseLost, QueueFull
from ...message import Received, id_time, parse_receipt
from ...model.queues import QUEUE_COUNTERS, Envelope, QueueConfig, QueueStats
from ..rules import (
    DedupPlan,
    check_priorities,
    dead_letter_attributes,
    plan_dedup,
    redrive_attributes,
)
from .conn import ScriptError, family
from .core import RedisCore, _config_json

__all__ = ["RedisQueues", "attributes_of", "received"]

_REDRIVE_CHUNK = 500
_STALE_RETRIES = 50


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def attributes_of(rec: dict[bytes, bytes]) -> dict[str, str]:
    """A record's attributes, with the redrive and dead-letter rules applied."""
    raw = rec.get(b"a")
    attrs: dict[str, str] = orjson.loads(raw) if raw else {}
    orig = rec.get(b"o")
    if orig is not None:
        attrs = redrive_attributes(attrs)
        attrs.setdefault("fairq.original_id", orig.decode())
    reason = rec.get(b"dr")
    if reason is not None:
        detail = rec.get(b"dd")
        attrs = dead_letter_attributes(
            attrs,
            reason.decode(),
            rec[b"ds"].decode(),
            rec[b"di"].decode(),
            int(rec.get(b"dn") or 0),
            detail.decode() if detail is not None else None,
        )
    return attrs


def received(item: Sequence[Any], queue: str, receipt_tail: str | None) -> Received:
    """A delivery ``{id, attempt, fields}`` from a script as a ``Received``."""
    hid = item[0].decode()
    fields = item[2]
    if len(fields) == 2:  # the common case: a body and nothing else
        return Received(
            hid,
            fields[1],
            {},
            int(item[1]),
            (int(hid[:12], 16)) / 1000.0,
            0,
            None,
            "" if receipt_tail is None else hid + receipt_tail,
            queue,
        )
    rec = dict(zip(fields[::2], fields[1::2], strict=True))
    group = rec.get(b"g")
    return Received(
        hid,
        rec.get(b"b", b""),
        attributes_of(rec),
        int(item[1]),
        id_time(int(hid, 16)),
        int(rec.get(b"p") or 0),
        group.decode() if group is not None else None,
        "" if receipt_tail is None else hid + receipt_tail,
        queue,
    )


#: a receipt as this backend hands them out: 16 hex digits (63 bits), ".", the lease in hex with no
#: leading zero (what the scripts compare); anything else is parsed and normalised
_NORMAL_RECEIPT = re.compile(r"[0-7][0-9a-f]{15}\.(?:[1-9a-f][0-9a-f]{0,15}|0)")


def _normal_receipts(receipts: Sequence[str]) -> list[str]:
    """The receipts in the scripts' form; ``InvalidMessage`` for a malformed one."""
    match = _NORMAL_RECEIPT.fullmatch
    out = []
    for r in receipts:
        if isinstance(r, str) and match(r):
            out.append(r)
        else:
            mid, lease = parse_receipt(r)
            out.append(f"{mid:016x}.{lease:x}")
    return out


def _receipt_args(receipts: Sequence[str], normal: bool = False) -> list[str]:
    """``k`` and the receipts, normalised (unless ``normal``: they are), in one string (one
    argument, split by the script: fewer arguments to encode than two per receipt)."""
    parsed = receipts if normal else _normal_receipts(receipts)
    return [str(len(parsed)), " ".join(parsed)]


class RedisQueues(RedisCore):
    """Queues on Redis; see the module docstring and ``KEYS.md``."""

    _rng = random.SystemRandom()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._acks: dict[str, list[tuple[list[str], list[str], asyncio.Future[list[str]]]]] = {}
        self._flushing: set[asyncio.Future[None]] = set()

    async def _call(self, script: str, name: str, *args: Any) -> Any:
        try:
            return await self.run(script, name, name, *args)
        except ScriptError as err:
            self.raise_common(err)

    # -- queues ----------------------------------------------------------------------------
    async def declare_queue(self, name: str, config: QueueConfig) -> None:
        dlq = config.dead_letter
        await self.add_families(name, *([dlq] if dlq else []))
        new = _config_json(config)
        seen = ""
        while True:
            got = await self.run("declare_queue", name, name, new, seen, dlq or "")
            if _text(got[0]) == "ok":
                break
            if seen == _text(got[1]):
                continue
            current = QueueConfig.from_dict(orjson.loads(got[1]))
            current.check_change(name, config)
            seen = _text(got[1])
        if dlq and family(dlq) != family(name) and self.opts.cluster:
            # its own slot: create it there if missing (the same create-only step)
            got = await self.run(
                "declare_queue", dlq, dlq, _config_json(QueueConfig.for_dead_letters()), "x", ""
            )
        self.wakeups.notify([name])

    async def queue_config(self, name: str) -> QueueConfig:
        raw = await self.command("HGET", self.fkey(name, "queues"), name)
        if raw is None:
            from ...errors import QueueNotFound

            raise QueueNotFound(name)
        return QueueConfig.from_dict(orjson.loads(raw))

    async def delete_queue(self, name: str) -> bool:
        gone = bool(await self.run("delete_queue", name, name))
        self._due.pop(name, None)
        self.wakeups.notify([name])
        return gone

    async def list_queues(self, prefix: str = "") -> list[str]:
        names: list[str] = []
        for fam in await self.families():
            if prefix and not (fam.startswith(prefix) or prefix.startswith(fam)):
                continue
            got = await self.command("HKEYS", f"{self.prefix}{{{fam}}}:queues")
            names.extend(n for n in map(_text, got) if n.startswith(prefix))
        return sorted(names)

    # -- messages --------------------------------------------------------------------------
    async def _dedup_seen(self, name: str, envelopes: list[Envelope]) -> dict[str, int]:
        wanted = sorted({e.dedup_id for e in envelopes if e.dedup_id is not None})
        got = await self.command("HMGET", self.qkey(name, "u"), *wanted)
        now = self.clock.now()
        seen: dict[str, int] = {}
        for dedup_id, raw in zip(wanted, got, strict=True):
            if raw is not None:
                mid, exp = raw.split(b" ")
                if float(exp) > now or self.opts.server_clock:
                    seen[dedup_id] = int(mid, 16)
        return seen

    async def send_args(self, queue: str, envelopes: list[Envelope]) -> tuple[list[Any], DedupPlan]:
        """The send script's arguments for ``envelopes`` (from its ``n`` on), with the
        dedup plan made from the queue's dedup entries (``rules.plan_dedup``)."""
        seen: dict[str, int] = {}
        if any(e.dedup_id is not None for e in envelopes):
            seen = await self._dedup_seen(queue, envelopes)
        plan = plan_dedup(envelopes, seen.get)
        if plan.slots is None and all(
            not (e.attributes or e.delay or e.priority or e.group) for e in plan.fresh
        ):  # the common case: bodies only, one argument each
            return [str(-len(plan.fresh)), *(e.body for e in plan.fresh), "0"], plan
        args: list[Any] = [str(len(plan.fresh))]
        first = {i: d for d, i in plan.first.items()}
        for i, e in enumerate(plan.fresh):
            args += (
                repr(e.delay),
                str(e.priority),
                e.group or "",
                orjson.dumps(e.attributes) if e.attributes else "",
                e.body,
                first.get(i, ""),
            )
        args.append(str(len(seen)))
        for d, mid in seen.items():
            args += (d, f"{mid:016x}")
        return args, plan

    def raise_send_error(self, queue: str, envelopes: list[Envelope], err: ScriptError) -> None:
        """Raise the fairq error for a send script's error."""
        if err.code == "FULL":
            name, max_length, overflow, detail = err.values
            raise QueueFull(name, int(max_length), detail, overflow) from None
        if err.code == "PRIO":
            check_priorities(queue, envelopes, int(err.values[0]))
        self.raise_common(err)

    async def send(self, queue: str, envelopes: list[Envelope]) -> list[str]:
        for _ in range(_STALE_RETRIES):
            args, plan = await self.send_args(queue, envelopes)
            try:
                made = await self.run("send", queue, queue, *args)
            except ScriptError as err:
                if err.code == "STALE":
                    continue
                self.raise_send_error(queue, envelopes, err)
            await self.drain_outbox(queue)
            return plan.answer([int(m, 16) for m in made])
        raise ConfigConflict(f"queue {queue!r}: deduplication kept changing under this send")

    async def receive(
        self, queue: str, max_messages: int, visibility_timeout: float | None
    ) -> list[Received]:
        lease = f"{self._rng.getrandbits(62) | 1:x}"
        vt = "" if visibility_timeout is None else repr(visibility_timeout)
        got = await self._call("receive", queue, str(max_messages), vt, lease)
        if len(got) == 1:
            self.learn_due(queue, got[0])
        tail = "." + lease
        out = [received(item, queue, tail) for item in got[1:]]
        await self.drain_outbox(queue)
        return out

    async def ack(self, queue: str, receipts: list[str]) -> list[str]:
        # acks asked for during one pass of the event loop (a worker's handlers finishing
        # together) go to Redis as one script call, as SQLite group-commits them
        normal = _normal_receipts(receipts)  # a malformed one fails its caller, not the batch
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[list[str]] = loop.create_future()
        batch = self._acks.get(queue)
        if batch is None:
            batch = self._acks[queue] = []
            loop.call_soon(self._start_ack_flush, queue)
        batch.append((receipts, normal, fut))
        return await fut

    def _start_ack_flush(self, queue: str) -> None:
        task = asyncio.ensure_future(self._flush_acks(queue))
        self._flushing.add(task)
        task.add_done_callback(self._flushing.discard)

    async def _flush_acks(self, queue: str) -> None:
        batch = self._acks.pop(queue, [])
        receipts = [r for rs, _, _ in batch for r in rs]
        normal = [r for _, ns, _ in batch for r in ns]
        try:
            lost_at = await self._call("ack", queue, *_receipt_args(normal, normal=True))
        except BaseException as exc:
            for _, _, fut in batch:
                if not fut.done():
                    fut.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        lost = {receipts[int(i) - 1] for i in lost_at}
        taken: set[str] = set()  # the same receipt from two callers: the second lost it
        for rs, _, fut in batch:
            mine = []
            for r in rs:
                if r in lost or (r in taken and rs.count(r) == 1):
                    mine.append(r)
                taken.add(r)
            if not fut.done():
                fut.set_result(mine)

    async def nack(self, queue: str, receipt: str, delay: float, error: str | None = None) -> None:
        try:
            await self.run(
                "nack", queue, queue, *_receipt_args([receipt]), repr(delay), error or ""
            )
        except ScriptError as err:
            if err.code == "LOST":
                raise LeaseLost([receipt]) from None
            self.raise_common(err)
        await self.drain_outbox(queue)

    async def extend(self, queue: str, receipts: list[str], seconds: float) -> list[str]:
        lost = await self._call("extend", queue, repr(seconds), *_receipt_args(receipts))
        return [receipts[int(i) - 1] for i in lost]

    async def release(self, queue: str, receipts: list[str]) -> list[str]:
        lost = await self._call("release", queue, *_receipt_args(receipts))
        return [receipts[int(i) - 1] for i in lost]

    async def dead_letter(self, queue: str, receipt: str, reason: str) -> None:
        try:
            await self.run("dead_letter", queue, queue, *_receipt_args([receipt]), reason)
        except ScriptError as err:
            if err.code == "LOST":
                raise LeaseLost([receipt]) from None
            self.raise_common(err)
        await self.drain_outbox(queue)

    async def stats(self, queue: str) -> QueueStats:
        got = await self._call("stats", queue)
        await self.drain_outbox(queue)
        visible, delayed, in_flight, oldest = got[0], got[1], got[2], _text(got[3])
        counters = dict(zip(QUEUE_COUNTERS, (int(c) for c in got[4:-1]), strict=True))
        age = max(0.0, self.clock.now() - id_time(int(oldest, 16))) if oldest else 0.0
        config = QueueConfig.from_dict(orjson.loads(got[-1]))
        slo = config.freshness_slo
        return QueueStats(
            visible=int(visible),
            delayed=int(delayed),
            in_flight=int(in_flight),
            oldest_age=age,
            freshness_slo=slo,
            breaching=slo is not None and age > slo,
            **counters,
        )

    async def purge(self, queue: str) -> int:
        return int(await self._call("purge", queue))

    async def peek(self, queue: str, limit: int) -> list[Received]:
        got = await self._call("peek", queue, str(limit))
        return [received(item, queue, None) for item in got]

    async def redrive(self, queue: str, to: str | None, limit: int | None) -> int:
        if to is not None:
            await self.queue_config(to)  # QueueNotFound before anything moves
        moved = 0
        after = ""
        known: set[str] = set()  # queues of other families seen to exist (Cluster)
        while limit is None or moved < limit:
            chunk = _REDRIVE_CHUNK if limit is None else min(_REDRIVE_CHUNK, limit - moved)
            n, last, *unknown = await self._call(
                "redrive", queue, to or "", str(chunk), after, *sorted(known)
            )
            moved += int(n)
            await self.drain_outbox(queue)
            found = False
            for target in map(_text, unknown):
                if await self.command("HEXISTS", self.fkey(target, "queues"), target):
                    known.add(target)
                    found = True
            if found:
                continue  # the same chunk again, now that its targets are known
            last = _text(last)
            if not last:
                break
            after = last
        if to is not None:
            self.wakeups.notify([to])
        return moved
