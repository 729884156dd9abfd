"""The base of the Redis backend's capabilities: the client, the scripts, the clock
handed to them, wake-ups, and the outbox that carries Cluster moves between families.

Each seam method is one script (``scripts/<operation>.lua``) on the slot of one family;
``KEYS.md`` lists every key. A script's ``now`` is the broker's clock (so tests drive time
with ``ManualClock``), or Redis's own ``TIME`` with ``?clock=server``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import orjson

from ...clock import Clock
from ...errors import BackendError, ConnectionError, QueueNotFound, Unsupported
from ...model.queues import QueueConfig
from ..base import Backend
from .conn import (
    Client,
    DriverErrors,
    RedisOptions,
    ScriptError,
    Scripts,
    driver_error,
    family,
    make_client,
    raise_if_cancelled,
    rex,
    run_script,
    script_error,
    torn_error,
)
from .wake import Subscriber

log = logging.getLogger("fairq.redis")

_OUTBOX_BATCH = 100


def _config_json(config: QueueConfig) -> str:
    return orjson.dumps(config.to_dict()).decode()


# what opening may raise: the driver's errors, and its recursion on a non-Redis server
_OPEN_ERRORS: tuple[type[BaseException], ...] = (*DriverErrors, RecursionError)


class RedisCore(Backend):
    """Connection, scripts, wake-ups; the capabilities are mixins on top."""

    poll_interval = 1.0

    def __init__(self, opts: RedisOptions, clock: Clock) -> None:
        super().__init__(clock)
        self.opts = opts
        self.url = opts.url
        self.prefix = opts.prefix
        self._cluster_flag = "1" if opts.cluster else "0"
        self._scripts = Scripts({"DLQ_CONFIG": _config_json(QueueConfig.for_dead_letters())})
        self._client: Client = None
        self._subscriber: Subscriber | None = None
        self._due: dict[str, float] = {}  # queue -> next due time, learnt from replies
        self._known_families: set[str] = set()
        self._resets_seen = 0
        self._last_safety = time.monotonic()
        self._closed = False

    # -- lifecycle -------------------------------------------------------------------------
    async def open(self) -> None:
        self._client = make_client(self.opts)
        try:
            if self.opts.cluster:
                await self._client.initialize()
                node = self._client.get_default_node()
                where = (node.host, node.port)
            else:
                await self._client.ping()
                where = (self.opts.host, self.opts.port)
        except _OPEN_ERRORS as exc:
            await self._close_client()
            if isinstance(exc, RecursionError) or "recursion depth" in str(exc):
                # redis-py's reconnects recursing on a server that answers in another
                # protocol and hangs up (a Redis URL given PostgreSQL's port)
                raise ConnectionError(
                    f"cannot open {self.url!r}: the server there does not answer as Redis "
                    "(is it another service's port?)"
                ) from None
            try:
                driver_error(exc, self.url)
            except BackendError as err:  # at open, any failure means "cannot connect"
                raise ConnectionError(f"cannot open {self.url!r}: {err}") from exc
        await self._check_eviction()
        self._subscriber = Subscriber(
            self.opts, where, self._on_wake, self._on_reset, self._on_listen
        )
        await self._subscriber.start(self.opts.connect_timeout)

    async def _check_eviction(self) -> None:
        """Warn when Redis may evict keys to stay under ``maxmemory``: a policy other than
        ``noeviction`` deletes queued messages (and idempotency records) that a send had
        already confirmed — silently, the queue itself may vanish. With ``noeviction`` a full
        Redis refuses writes instead (``BackendError``) and loses nothing."""
        try:
            client: Any = self._client
            if self.opts.cluster:  # every primary's (a cluster's INFO asks one node)
                info = await client.info("memory", target_nodes=client.PRIMARIES)
            else:
                info = await client.info("memory")
        except Exception:  # INFO may be renamed or refused (managed Redis): no check then
            log.debug("INFO memory failed; eviction policy not checked", exc_info=True)
            return
        nodes = [info] if "maxmemory_policy" in info else list(info.values())
        policies = {str(n.get("maxmemory_policy")) for n in nodes if isinstance(n, dict)}
        evicting = sorted(p for p in policies if p not in ("noeviction", "None"))
        if evicting:
            log.warning(
                "redis at %s evicts keys under memory pressure (maxmemory-policy %s): "
                "queued messages that sends confirmed can be deleted without a trace; "
                "set maxmemory-policy noeviction (a full Redis then refuses sends instead)",
                self.url,
                ", ".join(evicting),
            )

    async def _close_client(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            try:
                await client.aclose()
            except Exception:  # closing must not fail
                log.debug("closing the redis client failed", exc_info=True)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.wakeups.close()
        if self._subscriber is not None:
            await self._subscriber.close()
        await self._close_client()

    # -- keys and scripts ------------------------------------------------------------------
    def _tag(self, name: str) -> str:
        """The hash tag of ``name``'s keys: its family (on Cluster, never empty)."""
        fam = family(name)
        if not fam and self.opts.cluster:
            raise _no_family(name)
        return fam

    def fkey(self, name: str, suffix: str) -> str:
        """A family-level key of the family of ``name``."""
        return f"{self.prefix}{{{self._tag(name)}}}:{suffix}"

    def qkey(self, name: str, suffix: str) -> str:
        """A key of queue ``name``."""
        return f"{self.prefix}{{{self._tag(name)}}}:q:{name}:{suffix}"

    def _now_arg(self) -> str:
        return "" if self.opts.server_clock else repr(self.clock.now())

    async def run(self, script: str, name: str, *args: Any) -> Any:
        """Run ``script`` on the slot of ``name``'s family; script errors come back as
        :class:`ScriptError`, driver errors as fairq errors."""
        if self._client is None:
            raise BackendError("the redis backend is closed")
        header = (self.prefix, self._now_arg(), self._cluster_flag)
        try:
            return await run_script(
                self._client, self._scripts[script], (self.fkey(name, "due"),), (*header, *args)
            )
        except rex.ResponseError as exc:
            err = script_error(exc)
            if err is not None:
                raise err from None
            driver_error(exc, self.url)
        except DriverErrors as exc:
            driver_error(exc, self.url)
        except AttributeError as exc:
            torn_error(exc, self.url)

    async def run_key(self, script: str, key: str, *args: Any) -> Any:
        """Run ``script`` on the slot of ``key`` (``KEYS[1]``)."""
        if self._client is None:
            raise BackendError("the redis backend is closed")
        header = (self.prefix, self._now_arg(), self._cluster_flag)
        try:
            return await run_script(self._client, self._scripts[script], (key,), (*header, *args))
        except rex.ResponseError as exc:
            err = script_error(exc)
            if err is not None:
                raise err from None
            driver_error(exc, self.url)
        except DriverErrors as exc:
            driver_error(exc, self.url)
        except AttributeError as exc:
            torn_error(exc, self.url)

    async def command(self, *args: Any) -> Any:
        """One plain Redis command (keys of one slot), driver errors as fairq errors."""
        if self._client is None:
            raise BackendError("the redis backend is closed")
        try:
            got = await self._client.execute_command(*args)
            raise_if_cancelled()
            return got
        except DriverErrors as exc:
            driver_error(exc, self.url)
        except AttributeError as exc:
            torn_error(exc, self.url)

    def raise_common(self, err: ScriptError) -> None:
        """Raise the fairq error for a script error every operation can give."""
        if err.code == "NOQUEUE":
            raise QueueNotFound(err.values[0]) from None
        raise BackendError(f"redis script error {err.code}: {' '.join(err.values)}")

    # -- the family index --------------------------------------------------------------------
    async def add_families(self, *names: str) -> None:
        """Remember the families of ``names`` (for listing); before anything is created.
        The index only grows, so a family this broker added once needs no second call."""
        new = {self._tag(n) for n in names} - self._known_families
        if new:
            await self.command("SADD", f"{self.prefix}families", *new)
            self._known_families |= new

    async def families(self) -> list[str]:
        got = await self.command("SMEMBERS", f"{self.prefix}families")
        return sorted(g.decode() if isinstance(g, bytes) else g for g in got)

    # -- the outbox (Cluster moves into another family) --------------------------------------
    async def drain_outbox(self, name: str) -> None:
        """Deliver what the family of ``name`` holds for queues in other families: store in
        the target (once, by token), then drop from the outbox. Safe to repeat after a
        crash and from several processes at once."""
        if not self.opts.cluster:
            return
        key = self.fkey(name, "out")
        while True:
            entries = await self.command("LRANGE", key, 0, _OUTBOX_BATCH - 1)
            if not entries:
                return
            tokens: list[str] = []
            by_target: dict[str, list[bytes]] = {}
            for raw in entries:
                target, token, packed = raw.split(b"\t", 2)
                tokens.append(token.decode())
                by_target.setdefault(target.decode(), []).extend((token, packed))
            for target, pairs in by_target.items():
                await self.run("deliver", target, target, "1", *pairs)
                self.wakeups.notify([target])
            try:
                await run_script(
                    self._client,
                    self._scripts["outbox"],
                    (key,),
                    (self.prefix, self._now_arg(), self._cluster_flag, *tokens),
                )
            except DriverErrors as exc:
                driver_error(exc, self.url)
            if len(entries) < _OUTBOX_BATCH:
                return

    # -- wake-ups --------------------------------------------------------------------------
    def _on_wake(self, names: Sequence[str]) -> None:
        for n in names:
            self._due.pop(n, None)
        self.wakeups.notify(names)

    def _on_reset(self) -> None:
        self._due.clear()
        self.wakeups.notify_all()

    def _on_listen(self, topic: str, data: bytes) -> None:
        """An ephemeral publication arrived (see topics.py)."""

    def learn_due(self, queue: str, due: bytes | str | None) -> None:
        if due:
            self._due[queue] = float(due)
        else:
            self._due.pop(queue, None)

    async def next_due(self) -> float | None:
        watched = self.wakeups.watched()
        dues = [self._due[q] for q in watched if q in self._due]
        return min(dues) if dues else None

    async def changed_elsewhere(self) -> bool:
        sub = self._subscriber
        if sub is not None and sub.resets != self._resets_seen:
            self._resets_seen = sub.resets
            return True
        now = time.monotonic()
        if now - self._last_safety >= self.opts.safety_poll:
            self._last_safety = now  # the slow safety poll: a lost notification costs this
            return True
        return False


def _no_family(name: str) -> Unsupported:
    """A name whose first word is empty (it starts with a dot) on Redis Cluster: its keys'
    hash tag would be ``{}``, which Cluster ignores, and they would fall into different
    slots (a script would then fail half-way)."""
    return Unsupported(
        f"{name!r}: on Redis Cluster a name cannot start with '.' — its first word is the "
        "hash tag that keeps its keys in one slot (see docs/redis.md)"
    )
