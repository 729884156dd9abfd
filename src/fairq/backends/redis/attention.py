"""The Redis backend's attention domains (SPEC §5): each seam method one script of
``scripts/attention_*.lua`` on the slot of the domain's *data family* — the family of its
work queues (the first word of the ``work_queue`` template) — so a publish stores the
work message and the key's signal in one step, and every key of the domain's scheduling
state (virtual clock, tenants, slices, usage) lives in that slot too. The decisions are
``attention_policy``'s, ported to ``scripts/lib/attention.lua`` with the same arithmetic;
which tenant goes next is its one function ``next_tenant`` (the first member of a sorted
set scored by virtual time, ties by turn: O(log n) whatever the number of tenants).

The scripts that may write a delayed signal return its due time; the broker remembers
those (:meth:`RedisAttention.attention_scheduled_here`), so its own takers take such a
signal on time and other processes' a moment later: one take attempt per due signal.

A domain's options are kept twice: in its own family (``F attd``, the index that
``list_attention`` reads and the pointer to the data family) and in the data family
(``F att``), where the scripts read them.
"""

from __future__ import annotations

import secrets
from typing import Any

import orjson

from ...errors import AttentionNotFound, InvalidOption, LeaseLost, Unsupported
from ...message import Received, id_time
from ...model.attention import (
    ATTENTION_COUNTERS,
    AttentionConfig,
    AttentionStats,
    KeyStats,
    Plan,
    SignalHint,
    Slice,
    TenantStats,
)
from ...model.queues import Envelope, queue_config_from_options
from ..attention_policy import check_change, tenant_rows
from .conn import ScriptError, family
from .core import _config_json
from .queues import _text, received
from .rooms import RedisRooms

__all__ = ["RedisAttention"]

_RECONCILE_CHUNK = 2000
_SCHEDULED_KEPT = 1000  # due times remembered per domain before the old ones are dropped


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


class RedisAttention(RedisRooms):
    """Attention domains on Redis; see the module docstring."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._domains: dict[str, tuple[AttentionConfig, str]] = {}
        self._scheduled = Scheduled()

    def _data_family(self, domain: str, config: AttentionConfig) -> str:
        first = config.work_queue.split(".", 1)[0]
        if "{key}" in first:
            if self.opts.cluster:
                raise Unsupported(
                    f"attention domain {domain!r}: on Redis Cluster the work queues of a domain "
                    "must share their first word (e.g. '{domain}.{key}.work'), so a publish "
                    "stays in one slot"
                )
            return family(domain)
        return family(config.queue_for(domain, "k"))

    async def _domain(self, domain: str, fresh: bool = False) -> tuple[AttentionConfig, str]:
        got = None if fresh else self._domains.get(domain)
        if got is None:
            raw = await self.command("HGET", self.fkey(domain, "attd"), domain)
            if raw is None:
                self._domains.pop(domain, None)
                raise AttentionNotFound(domain)
            config = AttentionConfig.from_dict(orjson.loads(raw))
            got = self._domains[domain] = (config, self._data_family(domain, config))
        return got

    async def _att(self, script: str, domain: str, *args: Any) -> Any:
        """Run an attention script on the domain's data family (reading the pointer again
        once if the domain moved or went away)."""
        for attempt in (0, 1):
            _, fam = await self._domain(domain, fresh=attempt == 1)
            try:
                return await self.run(script, fam, domain, *args)
            except ScriptError as err:
                if err.code == "NODOMAIN" and attempt == 0:
                    continue
                if err.code == "NODOMAIN":
                    raise AttentionNotFound(domain) from None
                raise
        raise AssertionError("unreachable")

    # -- domains ---------------------------------------------------------------------------
    async def declare_attention(self, domain: str, config: AttentionConfig) -> None:
        fam = self._data_family(domain, config)
        await self.add_families(domain, fam)
        new = orjson.dumps(config.to_dict()).decode()
        old_raw = await self.command("HGET", self.fkey(domain, "attd"), domain)
        if old_raw is not None:
            old = AttentionConfig.from_dict(orjson.loads(old_raw))
            old_fam = self._data_family(domain, old)
            if old_fam != fam:  # the template moved the data: only without keys
                got = await self.run("declare_attention", old_fam, domain, new, "")
                if _text(got[0]) == "conflict":
                    check_change(domain, old, config, bool(int(got[2])))
                await self.run("delete_attention", old_fam, domain)
        seen = ""
        while True:
            got = await self.run("declare_attention", fam, domain, new, seen)
            if _text(got[0]) == "ok":
                break
            current = AttentionConfig.from_dict(orjson.loads(got[1]))
            check_change(domain, current, config, bool(int(got[2])))
            seen = _text(got[1])
        await self.command("HSET", self.fkey(domain, "attd"), domain, new)
        self._domains[domain] = (config, fam)

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
            _, fam = await self._domain(domain, fresh=True)
        except AttentionNotFound:
            return False
        await self.run("delete_attention", fam, domain)
        await self.command("HDEL", self.fkey(domain, "attd"), domain)
        self._domains.pop(domain, None)
        return True

    # -- the slice cycle -------------------------------------------------------------------
    async def attention_publish(
        self, domain: str, key: str, envelopes: list[Envelope]
    ) -> list[str]:
        config, _ = await self._domain(domain)
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
                made = await self._att("attention_publish", domain, *head, *args)
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
            await self.drain_outbox(queue)
            return plan.answer([int(m, 16) for m in made[:-1]])
        raise InvalidOption(f"queue {queue!r}: deduplication kept changing under this publish")

    async def attention_take(self, domain: str) -> Slice | None:
        got = await self._att("attention_take", domain, secrets.token_hex(12))
        self._scheduled.add(domain, got[-1], self.clock.now())
        if len(got) == 1:
            return None
        key, queue, token, _plan_name, plan = (_text(x) for x in got[:-1])
        return Slice(domain, key, queue, token, Plan(**orjson.loads(plan)))

    async def attention_receive(
        self, domain: str, token: str, n: int, visibility_timeout: float | None
    ) -> tuple[list[Received], float | None]:
        lease = f"{self._rng.getrandbits(62) | 1:x}"
        vt = "" if visibility_timeout is None else repr(visibility_timeout)
        try:
            got = await self._att("attention_receive", domain, token, str(n), vt, lease)
        except ScriptError as err:
            if err.code == "LOST":
                raise LeaseLost([token], "the slice's concurrency token expired") from None
            raise
        first, queue = _text(got[0]), _text(got[1])
        if len(got) == 2:
            return [], (float(first) if first else None)
        tail = "." + lease
        return [received(item, queue, tail) for item in got[2:]], None

    async def attention_extend(self, domain: str, token: str) -> bool:
        return bool(await self._att("attention_extend", domain, token))

    async def attention_end(
        self, domain: str, token: str, processed: int, retry_at: float | None
    ) -> None:
        dues = await self._att(
            "attention_end",
            domain,
            token,
            str(processed),
            "" if retry_at is None else repr(retry_at),
        )
        self._scheduled.add(domain, dues, self.clock.now())

    async def attention_set_resource(
        self, domain: str, key: str, plan: str | None, state: str | None, tenant: str | None
    ) -> None:
        config, _ = await self._domain(domain)
        if plan is not None and plan not in config.plans:
            config, _ = await self._domain(domain, fresh=True)
        try:
            dues = await self._att(
                "attention_set_resource",
                domain,
                key,
                config.queue_for(domain, key),
                plan or "",
                state or "",
                tenant or "",
            )
            self._scheduled.add(domain, dues, self.clock.now())
        except ScriptError as err:
            if err.code == "NOPLAN":
                raise InvalidOption(
                    f"no plan {plan!r} in {domain!r} (plans: {', '.join(config.plans)})"
                ) from None
            raise

    async def attention_stats(self, domain: str) -> AttentionStats:
        flat, pending, slices, keys = await self._att("attention_stats", domain)
        raw = {_text(k): _text(v) for k, v in zip(flat[::2], flat[1::2], strict=True)}
        counters = {c: int(raw.get(c, 0)) for c in ATTENTION_COUNTERS}
        discarded = {
            k.split(":", 1)[1]: int(v) for k, v in raw.items() if k.startswith("discarded:")
        }
        clear_count = int(raw.get("clear_count", 0))
        clear_sum = float(raw.get("clear_sum", 0.0))
        return AttentionStats(
            signals_pending=int(pending),
            slices=int(slices),
            **counters,
            discarded=discarded,
            clear_time_avg=clear_sum / clear_count if clear_count else 0.0,
            keys=int(keys),
            queue=f"attention.{domain}.work",
        )

    async def attention_key_stats(self, domain: str, top: int) -> list[KeyStats]:
        rows = await self._att("attention_key_stats", domain, str(top))
        now = self.clock.now()
        out = []
        for r in rows:
            key, tenant, plan, state = (_text(x) for x in r[:4])
            backlog, in_flight = int(r[4]), int(r[5])
            oldest = _text(r[6])
            age = max(0.0, now - id_time(int(oldest, 16))) if oldest else 0.0
            out.append(
                KeyStats(
                    key,
                    tenant,
                    plan,
                    state,
                    backlog,
                    in_flight,
                    age,
                    int(r[7]),
                    int(r[8]),
                    int(r[9]),
                )
            )
        return out

    async def attention_reconcile(self, domain: str) -> int:
        total, cursor = 0, 0
        while cursor >= 0:
            n, cursor, dues = await self._att(
                "attention_reconcile", domain, str(cursor), str(_RECONCILE_CHUNK)
            )
            self._scheduled.add(domain, dues, self.clock.now())
            total += int(n)
            cursor = int(cursor)
        return total

    async def attention_tenant_stats(self, domain: str, top: int) -> list[TenantStats]:
        used_rows, key_rows = await self._att("attention_tenant_stats", domain)
        used: dict[str, list[float]] = {}
        for tenant, busy, slices, messages in used_rows:
            u = used.setdefault(_text(tenant), [0.0, 0, 0])
            u[0] += float(busy)
            u[1] += int(slices)
            u[2] += int(messages)
        keys: dict[str, list[tuple[int, int, int]]] = {}
        for tenant, visible, active, cap in key_rows:
            keys.setdefault(_text(tenant), []).append((int(visible), int(active), int(cap)))
        return tenant_rows({n: (u[0], int(u[1]), int(u[2])) for n, u in used.items()}, keys, top)

    async def attention_next(self, domain: str) -> SignalHint:
        try:
            got = await self._att("attention_next", domain)
        except AttentionNotFound:  # the take that follows raises it
            return SignalHint(True, None)
        if int(got[0]):
            return SignalHint(True, None)
        due = _text(got[1])
        return SignalHint(False, float(due) if due else None)

    def attention_scheduled_here(self, domain: str, due: float) -> bool:
        return (domain, due) in self._scheduled
