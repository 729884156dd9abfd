"""The Redis backend's attention domains (SPEC §5): each seam method one script of
``scripts/attention_*.lua`` on the slot of a *data family* — the family of the domain's
work queues (the first word of the ``work_queue`` template) — so a publish stores the
work message and the key's signal in one step, and every key of the domain's scheduling
state (virtual clock, tenants, slices, usage) lives in that slot too. The decisions are
``attention_policy``'s, ported to ``scripts/lib/attention.lua`` with the same arithmetic;
which tenant goes next is its one function ``next_tenant`` (the first member of a sorted
set scored by virtual time, ties by turn: O(log n) whatever the number of tenants).

A domain of several **shards** (``declare_attention(shards=n)``) is n such sets of keys,
each in the family of its shard's work queues (``{shard}`` in the template's first
word: on Redis Cluster, a slot of its own); a key's shard is ``shard_of(key, n)``. Each
step is still one script on one shard; what the shards share — which one a take visits,
tenants' virtual times, the clock — goes through the client (``shards.py``).

A slice's cycle is two calls when the work is small: the take also leases the slice's
first messages (as many as the domain's last first receive asked for), which the
slice's first ``attention_receive`` hands out; and ``attention_finish`` acks the slice's
last messages, releases what it leased but never handed out, and ends it, in one script.

The scripts that may write a delayed signal return its due time; the broker remembers
those (:meth:`RedisAttention.attention_scheduled_here`), so its own takers take such a
signal on time and other processes' a moment later: one take attempt per due signal.

A domain's options are kept in its own family (``F attd``, the index that
``list_attention`` reads and the pointer to the data families) and in each data family
(``F att``), where the scripts read them.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from ...errors import AttentionNotFound, InvalidOption, LeaseLost, Unsupported
from ...message import Received
from ...model.attention import (
    AttentionConfig,
    AttentionStats,
    KeyStats,
    Plan,
    SignalHint,
    Slice,
    TenantStats,
    shard_of,
)
from ...model.queues import Envelope, queue_config_from_options
from ..attention_policy import check_change
from .attention_stats import AttentionReads
from .conn import ScriptError, family
from .core import _config_json
from .queues import _receipt_args, _text, received
from .shards import SHARD_SEP, Shards, shard_id, shard_of_token

__all__ = ["RedisAttention"]

_SCHEDULED_KEPT = 1000  # due times remembered per domain before the old ones are dropped
_PREFETCH_KEPT = 10_000  # slices whose first messages are held before the oldest go


class Scheduled:
    """The due times of the delayed signals this broker's scripts wrote, per domain."""

    def __init__(self) -> None:
        self.by_domain: dict[str, dict[float, None]] = {}

    def add(self, domain: str, dues: bytes | str, now: float) -> None:
        text = _text(dues)
        if not text:
            return
        kept = self.by_domain.setdefault(domain, {})
        for due in text.split(" "):
            kept[float(due)] = None
        if len(kept) > _SCHEDULED_KEPT:  # forget what came due long ago
            for old in [x for x in kept if x < now - 60.0]:
                del kept[old]

    def __contains__(self, item: tuple[str, float]) -> bool:
        domain, due = item
        return due in self.by_domain.get(domain, {})


@dataclass(slots=True)
class _Prefetch:
    """A slice's first messages, leased by its take, until its receives hand them out."""

    msgs: list[Received]
    queue: str
    vt: str  # the visibility timeout they were leased with ("" the queue's)
    left: int  # messages still visible in the queue after the take (-1: unknown)
    first: bool = True  # no receive yet


class RedisAttention(AttentionReads):
    """Attention domains on Redis; see the module docstring."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._domains: dict[str, tuple[AttentionConfig, Shards]] = {}
        self._scheduled = Scheduled()
        self._prefetched: dict[str, _Prefetch] = {}
        self._first_receive: dict[str, tuple[int, str]] = {}  # domain -> (n, vt)

    # -- where a domain's shards live ------------------------------------------------------
    def _families(self, domain: str, config: AttentionConfig) -> list[str]:
        """The data family of each shard."""
        first = config.work_queue.split(".", 1)[0]
        if "{key}" in first:
            if self.opts.cluster:
                raise Unsupported(
                    f"attention domain {domain!r}: on Redis Cluster the work queues of a domain "
                    "(of a shard) must share their first word (e.g. '{domain}.{key}.work', or "
                    "'{domain}-{shard}.{key}.work' with shards), so a publish stays in one slot"
                )
            return [family(domain)] * config.shards
        fams = [family(config.shard_queue(domain, s)) for s in range(config.shards)]
        if self.opts.cluster and config.shards > 1 and len(set(fams)) == 1:
            raise InvalidOption(
                f"attention domain {domain!r}: on Redis Cluster the shards need {{shard}} in "
                f"the first word of work_queue ({config.work_queue!r} puts them all in one "
                "slot), e.g. '{domain}-{shard}.{key}.work'"
            )
        return fams

    def _shards(self, domain: str, config: AttentionConfig) -> Shards:
        return Shards(
            domain,
            [shard_id(domain, s, config.shards) for s in range(config.shards)],
            self._families(domain, config),
            stale_after=self.opts.safety_poll,
        )

    async def _domain(self, domain: str, fresh: bool = False) -> tuple[AttentionConfig, Shards]:
        got = None if fresh else self._domains.get(domain)
        if got is None:
            raw = await self.command("HGET", self.fkey(domain, "attd"), domain)
            if raw is None:
                self._domains.pop(domain, None)
                raise AttentionNotFound(domain)
            config = AttentionConfig.from_dict(orjson.loads(raw))
            old = self._domains.get(domain)
            if old is not None and old[0] == config:
                got = old
            else:
                got = self._domains[domain] = (config, self._shards(domain, config))
        return got

    async def _att(self, script: str, domain: str, shard: int, *args: Any) -> Any:
        """Run an attention script on shard ``shard`` of the domain (reading the pointer
        again once if the domain moved or went away)."""
        for attempt in (0, 1):
            _, sh = await self._domain(domain, fresh=attempt == 1)
            if shard >= len(sh.ids):
                raise AttentionNotFound(domain)
            try:
                return await self.run(script, sh.families[shard], sh.ids[shard], *args)
            except ScriptError as err:
                if err.code == "NODOMAIN" and attempt == 0:
                    continue
                if err.code == "NODOMAIN":
                    raise AttentionNotFound(domain) from None
                raise
        raise AssertionError("unreachable")

    async def _each_shard(self, script: str, domain: str, *args: Any) -> list[Any]:
        """Run a script on every shard of the domain at once; the replies in shard order."""
        _, sh = await self._domain(domain)
        calls = [self._att(script, domain, s, *args) for s in range(len(sh.ids))]
        return list(await asyncio.gather(*calls))

    # -- wake-ups name the shard -----------------------------------------------------------
    def _on_wake(self, names: Sequence[str]) -> None:
        out = []
        for n in names:
            if n.startswith("attention:"):
                domain, sep, shard = n[len("attention:") :].partition(SHARD_SEP)
                known = self._domains.get(domain)
                if known is not None:
                    known[1].changed(int(shard) if sep and shard.isdigit() else 0)
                if sep:
                    n = "attention:" + domain
            out.append(n)
        super()._on_wake(out)

    def _on_reset(self) -> None:
        for _, sh in self._domains.values():
            sh.changed(None)
        super()._on_reset()

    # -- domains ---------------------------------------------------------------------------
    async def declare_attention(self, domain: str, config: AttentionConfig) -> None:
        fams = self._families(domain, config)
        await self.add_families(domain, *fams)
        new = orjson.dumps(config.to_dict()).decode()
        old_raw = await self.command("HGET", self.fkey(domain, "attd"), domain)
        if old_raw is not None:
            old = AttentionConfig.from_dict(orjson.loads(old_raw))
            old_sh = self._shards(domain, old)
            if (old_sh.families, old.shards) != (fams, config.shards):
                # the template or the shards moved the data: only without keys
                for fam, sid in zip(old_sh.families, old_sh.ids, strict=True):
                    got = await self.run("declare_attention", fam, sid, new, "")
                    if _text(got[0]) == "conflict":
                        check_change(domain, old, config, bool(int(got[2])))
                await self._delete_shards(old_sh)
        for s, fam in enumerate(fams):
            sid = shard_id(domain, s, config.shards)
            seen = ""
            while True:
                got = await self.run("declare_attention", fam, sid, new, seen)
                if _text(got[0]) == "ok":
                    break
                current = AttentionConfig.from_dict(orjson.loads(got[1]))
                check_change(domain, current, config, bool(int(got[2])))
                seen = _text(got[1])
        # the pointer last: a declare cut short leaves the domain as it was (or absent),
        # and declaring it again finishes the job
        await self.command("HSET", self.fkey(domain, "attd"), domain, new)
        self._domains[domain] = (config, self._shards(domain, config))

    async def _delete_shards(self, sh: Shards) -> None:
        last = {fam: i for i, fam in enumerate(sh.families)}
        for i, (fam, sid) in enumerate(zip(sh.families, sh.ids, strict=True)):
            await self.run("delete_attention", fam, sid, "1" if last[fam] == i else "0")

    async def attention_config(self, domain: str) -> AttentionConfig:
        return (await self._domain(domain, fresh=True))[0]

    async def list_attention(self, prefix: str = "") -> list[str]:
        names: list[str] = []
        for fam in await self.families():
            if prefix and not (fam.startswith(prefix) or prefix.startswith(fam)):
                continue
            got = await self.command("HKEYS", f"{self.prefix}{{{fam}}}:attd")
            names.extend(n for n in map(_text, got) if n.startswith(prefix))
        return sorted(names)

    async def delete_attention(self, domain: str) -> bool:
        try:
            _, sh = await self._domain(domain, fresh=True)
        except AttentionNotFound:
            return False
        await self._delete_shards(sh)  # the pointer stays until every shard is gone
        await self.command("HDEL", self.fkey(domain, "attd"), domain)
        self._domains.pop(domain, None)
        return True

    # -- the slice cycle -------------------------------------------------------------------
    async def attention_publish(
        self, domain: str, key: str, envelopes: list[Envelope]
    ) -> list[str]:
        config, sh = await self._domain(domain)
        shard = shard_of(key, config.shards)
        queue = config.queue_for(domain, key)
        qconfig = queue_config_from_options(queue, dict(config.queue_options))
        dlq = qconfig.dead_letter or ""
        if dlq:
            await self.add_families(dlq)
        await self.add_families(queue)
        head = (key, queue, _config_json(qconfig), dlq)
        for _ in range(50):
            args, plan = await self.send_args(queue, envelopes)
            try:
                made = await self._att("attention_publish", domain, shard, *head, *args)
            except ScriptError as err:
                if err.code == "STALE":
                    continue
                if err.code == "REMOVED":
                    raise InvalidOption(
                        f"key {key!r} of {domain!r} was removed; "
                        "set_resource(key, state='active') first"
                    ) from None
                self.raise_send_error(queue, envelopes, err)
            self._scheduled.add(domain, made[-1], self.clock.now())
            sh.changed(shard)
            await self.drain_outbox(queue)
            return plan.answer([int(m, 16) for m in made[:-1]])
        raise InvalidOption(f"queue {queue!r}: deduplication kept changing under this publish")

    async def _look(self, domain: str, sh: Shards) -> None:
        """Read the shards this broker knows nothing fresh of (read-only, all at once)."""
        todo = sh.unknown(self.clock.now())
        if todo:
            marks = [sh.mark(s) for s in todo]
            looks = await asyncio.gather(*(self._att("attention_next", domain, s) for s in todo))
            for s, got, since in zip(todo, looks, marks, strict=True):
                sh.learn_look(s, got, since)

    async def attention_take(self, domain: str) -> Slice | None:
        _, sh = await self._domain(domain)
        if sh.sharded:  # which shard goes first depends on what each has
            await self._look(domain, sh)
        n, vt = self._first_receive.get(domain, (0, ""))
        for shard in sh.order():
            token = secrets.token_hex(12) + (f"-{shard}" if sh.sharded else "")
            lease = f"{self._rng.getrandbits(62) | 1:x}"
            clock, deltas = sh.sync_args(shard)
            sh.took(shard)
            since = sh.mark(shard)
            got = await self._att(
                "attention_take", domain, shard, token, clock, deltas, str(n), vt, lease
            )
            now = self.clock.now()
            if len(got) == 2:  # no signal there yielded a slice
                self._scheduled.add(domain, got[0], now)
                sh.learn(shard, got[1], since)
                continue
            key, queue, token, _plan_name, plan = (_text(x) for x in got[:5])
            self._scheduled.add(domain, got[5], now)
            sh.learn(shard, got[6], since)
            sh.charged(shard, got[7], got[8])
            tail = "." + lease
            msgs = [received(item, queue, tail) for item in got[10:]]
            if len(self._prefetched) >= _PREFETCH_KEPT:  # slices taken and never ended
                del self._prefetched[next(iter(self._prefetched))]
            self._prefetched[token] = _Prefetch(msgs, queue, vt, int(got[9]))
            return Slice(domain, key, queue, token, Plan(**orjson.loads(plan)))
        return None

    async def attention_receive(
        self, domain: str, token: str, n: int, visibility_timeout: float | None
    ) -> tuple[list[Received], float | None]:
        vt = "" if visibility_timeout is None else repr(visibility_timeout)
        p = self._prefetched.get(token)
        if p is not None:
            if p.first:  # what the next takes lease for their slices' first receive
                self._first_receive[domain] = (n, vt)
                p.first = False
            if p.msgs:
                out, p.msgs = p.msgs[:n], p.msgs[n:]
                if vt != p.vt:  # leased for another visibility timeout: make it this one
                    await self._relet(domain, p.queue, out, visibility_timeout)
                if len(out) < n and p.left != 0:  # the take leased fewer than asked now
                    try:
                        more, _ = await self._receive(domain, token, n - len(out), vt)
                    except LeaseLost:
                        more = []
                    out += more
                return out, None
            if p.left == 0:  # the take left nothing visible: this receive would find none
                p.left = -1
                return [], None
        return await self._receive(domain, token, n, vt)

    async def _receive(
        self, domain: str, token: str, n: int, vt: str
    ) -> tuple[list[Received], float | None]:
        lease = f"{self._rng.getrandbits(62) | 1:x}"
        try:
            got = await self._att(
                "attention_receive", domain, shard_of_token(token), token, str(n), vt, lease
            )
        except ScriptError as err:
            if err.code == "LOST":
                raise LeaseLost([token], "the slice's concurrency token expired") from None
            raise
        first, queue = _text(got[0]), _text(got[1])
        if len(got) == 2:
            return [], (float(first) if first else None)
        tail = "." + lease
        return [received(item, queue, tail) for item in got[2:]], None

    async def _relet(
        self, domain: str, queue: str, msgs: list[Received], visibility_timeout: float | None
    ) -> None:
        seconds = visibility_timeout
        if seconds is None:
            config, _ = await self._domain(domain)
            seconds = queue_config_from_options(
                queue, dict(config.queue_options)
            ).visibility_timeout
        await self.extend(queue, [m.receipt for m in msgs], seconds)

    async def attention_extend(self, domain: str, token: str) -> bool:
        return bool(await self._att("attention_extend", domain, shard_of_token(token), token))

    async def attention_end(
        self, domain: str, token: str, processed: int, retry_at: float | None
    ) -> None:
        await self.attention_finish(domain, token, processed, retry_at, "", [])

    async def attention_progress(
        self, domain: str, token: str, key: str, queue: str, receipts: list[str]
    ) -> list[str]:
        if not receipts:
            return []
        got = await self._att(
            "attention_progress",
            domain,
            shard_of_token(token),
            token,
            key,
            queue,
            *_receipt_args(receipts),
        )
        return [receipts[int(i) - 1] for i in got]

    async def attention_count(self, domain: str, token: str, key: str, n: int) -> None:
        if n > 0:
            with contextlib.suppress(AttentionNotFound):  # deleted meanwhile: nothing to count
                await self._att(
                    "attention_progress", domain, shard_of_token(token), token, key, "", str(n)
                )

    async def attention_finish(
        self,
        domain: str,
        token: str,
        processed: int,
        retry_at: float | None,
        queue: str,
        receipts: list[str],
        key: str = "",
    ) -> list[str]:
        _, sh = await self._domain(domain)
        shard = shard_of_token(token)
        p = self._prefetched.pop(token, None)
        back = [m.receipt for m in p.msgs] if p is not None else []
        if not queue and p is not None:
            queue = p.queue
        if not receipts and not back:
            queue = ""
        clock, deltas = sh.sync_args(shard)
        since = sh.mark(shard)
        got = await self._att(
            "attention_end",
            domain,
            shard,
            token,
            str(processed),
            "" if retry_at is None else repr(retry_at),
            clock,
            deltas,
            queue,
            *_receipt_args(receipts),
            *_receipt_args(back),
        )
        self._scheduled.add(domain, got[0], self.clock.now())
        sh.learn(shard, got[1], since)
        sh.charged(shard, got[2], got[3])
        return [receipts[int(i) - 1] for i in got[4:]]

    async def attention_set_resource(
        self, domain: str, key: str, plan: str | None, state: str | None, tenant: str | None
    ) -> None:
        config, sh = await self._domain(domain)
        if plan is not None and plan not in config.plans:
            config, sh = await self._domain(domain, fresh=True)
        shard = shard_of(key, config.shards)
        try:
            dues = await self._att(
                "attention_set_resource",
                domain,
                shard,
                key,
                config.queue_for(domain, key),
                plan or "",
                state or "",
                tenant or "",
            )
            self._scheduled.add(domain, dues, self.clock.now())
            sh.changed(shard)
        except ScriptError as err:
            if err.code == "NOPLAN":
                raise InvalidOption(
                    f"no plan {plan!r} in {domain!r} (plans: {', '.join(config.plans)})"
                ) from None
            raise

    async def attention_next(self, domain: str) -> SignalHint:
        try:
            _, sh = await self._domain(domain)
        except AttentionNotFound:  # the take that follows raises it
            return SignalHint(True, None)
        if sh.any_ready():  # a take's reply said so (a wasted take if another took it)
            return SignalHint(True, None)
        try:
            await self._look(domain, sh)
        except AttentionNotFound:
            return SignalHint(True, None)
        if sh.any_ready():
            return SignalHint(True, None)
        return SignalHint(False, sh.next_due())

    def attention_scheduled_here(self, domain: str, due: float) -> bool:
        return (domain, due) in self._scheduled

    # -- reads over every shard (attention_stats.py) --------------------------------------
    async def attention_stats(self, domain: str) -> AttentionStats:
        return self.sum_stats(domain, await self._each_shard("attention_stats", domain))

    async def attention_key_stats(self, domain: str, top: int) -> list[KeyStats]:
        _, sh = await self._domain(domain)
        shards = [self._key_rows(domain, s, top) for s in range(len(sh.ids))]
        return self.top_keys(list(await asyncio.gather(*shards)), top)

    async def _key_rows(self, domain: str, shard: int, top: int) -> list[Any]:
        """One shard's rows for the busiest keys: the keys with backlog a chunk per script
        (at most ``STATS_SCAN`` of them: a bigger domain is ranked on that sample), then,
        if fewer than ``top`` have backlog, keys without it by name."""
        rows: dict[str, Any] = {}
        cursor, read = "0", 0
        while True:
            cursor, chunk = await self._att(
                "attention_key_stats",
                domain,
                shard,
                str(top),
                "scan",
                cursor,
                str(self.STATS_CHUNK),
            )
            cursor = _text(cursor)
            for r in chunk:  # SSCAN may return a key twice
                rows[_text(r[0])] = r
            read += self.STATS_CHUNK
            if cursor == "0" or read >= self.STATS_SCAN:
                break
        if len(rows) < top:
            _, fill = await self._att(
                "attention_key_stats", domain, shard, str(top), "fill", "0", "0"
            )
            for r in fill:
                rows.setdefault(_text(r[0]), r)
        return list(rows.values())

    async def attention_tenant_stats(self, domain: str, top: int) -> list[TenantStats]:
        _, sh = await self._domain(domain)
        shards = [self._tenant_rows(domain, s) for s in range(len(sh.ids))]
        return self.top_tenants(list(await asyncio.gather(*shards)), top)

    async def _tenant_rows(self, domain: str, shard: int) -> list[Any]:
        """One shard's usage of the last minute and its backlogged keys' rows, the keys a
        chunk per script (at most ``STATS_SCAN``), each key once."""
        used: list[Any] = []
        keys: dict[str, Any] = {}
        cursor, read = "0", 0
        while True:
            got_used, chunk, cursor = await self._att(
                "attention_tenant_stats", domain, shard, cursor, str(self.STATS_CHUNK)
            )
            used.extend(got_used)
            for r in chunk:
                keys[_text(r[4])] = r[:4]
            cursor = _text(cursor)
            read += self.STATS_CHUNK
            if cursor == "0" or read >= self.STATS_SCAN:
                break
        return [used, list(keys.values())]

    async def attention_reconcile(self, domain: str) -> int:
        _, sh = await self._domain(domain)
        total = 0
        for shard in range(len(sh.ids)):
            first = "1"
            while True:
                n, more, dues = await self._att(
                    "attention_reconcile", domain, shard, first, str(self.RECONCILE_CHUNK)
                )
                self._scheduled.add(domain, dues, self.clock.now())
                total += int(n)
                first = "0"
                if not int(more):
                    break
            sh.changed(shard)
        return total
