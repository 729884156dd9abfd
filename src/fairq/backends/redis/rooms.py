"""The Redis backend's waiting rooms.

The rules are ``room_policy``'s and run here, on a snapshot of the room's row: a step reads
the row and the index facts the rules ask for (``room_read.lua``, one round trip; a rule
that asks for a fact not read yet is run again with it), then stores the outcome with
``room_write.lua``, which refuses it if the row changed meanwhile (a version number), so
every step is atomic without a second copy of the rules in Lua. Joins are the hot path
and never conflict with the rest: ``room_join.lua`` hands out arrival numbers (a hash of
fans, ``HINCRBY joined``) by itself, and the rules then answer from the row it returns.

Keys, all with the room's own hash tag ``{r:<room>}``: ``row`` (hash: the row's fields,
``ver``), ``fans`` (hash fan -> seq), ``steps`` (zset upto), ``stepv`` (hash upto ->
"admitted_at expires_at"), ``used`` (zset seq -> place). Status reads the row and, for an
admitted fan only, one step and one used flag: O(log n) at any number of fans.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import fields
from typing import Any, TypeVar

import orjson

from ...errors import BackendError, RoomNotFound
from ...model.rooms import Place, RoomConfig, RoomRecord, RoomStats, TickResult
from .. import room_policy as policy
from ..room_policy import RoomRow
from .conn import ScriptError
from .idempotency import RedisIdempotency
from .queues import _text

__all__ = ["RedisRooms"]

T = TypeVar("T")
_RETRIES = 200
_INTS = {
    "id",
    "joined",
    "pre_queue",
    "head",
    "expired_upto",
    "used",
    "used_live",
    "fence",
    "told_sold_out",
}
_FLOATS = {
    "rate",
    "created_at",
    "credit",
    "meas_sum",
    "admitter_until",
    "drawn_at",
    "credit_at",
    "meas_at",
    "meas_since",
    "sold_out_at",
    "closed_at",
}
_BYTES = {"key_seed", "draw_seed"}
_FIELDS = [f.name for f in fields(RoomRow)]
_STORED = [f for f in _FIELDS if f not in ("id", "joined")]
_EXPIRING = ("after", "x", "256")


def _decode_row(name: str, flat: Sequence[bytes]) -> tuple[RoomRow, str]:
    raw = {_text(k): v for k, v in zip(flat[::2], flat[1::2], strict=True)}
    values: dict[str, Any] = {"id": 0, "name": name}
    for f in _FIELDS:
        if f in ("id", "name"):
            continue
        v = raw.get(f)
        if v is None:
            values[f] = 0 if f == "joined" else None
        elif f == "config":
            values[f] = RoomConfig.from_dict(orjson.loads(v))
        elif f in _INTS:
            values[f] = int(v)
        elif f in _FLOATS:
            values[f] = float(v)
        elif f in _BYTES:
            values[f] = bytes(v)
        else:
            values[f] = _text(v)
    for f in ("joined", "pre_queue", "head", "expired_upto", "used", "used_live", "fence"):
        values[f] = values[f] or 0
    for f in ("told_sold_out",):
        values[f] = values[f] or 0
    for f in ("credit", "meas_sum", "admitter_until"):
        values[f] = values[f] or 0.0
    return RoomRow(**values), _text(raw.get("ver", b""))


def _encode(f: str, v: Any) -> bytes | str:
    if f == "config":
        return orjson.dumps(v.to_dict())
    if isinstance(v, bytes):
        return v
    if isinstance(v, float):
        return repr(v)
    return str(v)


class _Need(Exception):
    """The rules asked for an index fact this snapshot does not have."""

    def __init__(self, *request: str) -> None:
        super().__init__(*request)
        self.request = request


class _View:
    """A snapshot of a room for the rules: the row, the facts read with it, and what the
    rules decided to add (admission steps, used tokens)."""

    def __init__(self, row: RoomRow, now: float, facts: dict[tuple[str, ...], Any]) -> None:
        self.row = row
        self.expired_upto = row.expired_upto  # as read: what the "x" cursor stood for
        self.now = now
        self.facts = facts
        self.steps: list[tuple[int, float, float]] = []
        self.uses: list[tuple[int, int]] = []

    def _fact(self, *request: str) -> Any:
        try:
            return self.facts[request]
        except KeyError:
            raise _Need(*request) from None

    def step_of(self, place: int) -> tuple[float, float]:
        for upto, at, exp in self.steps:
            if upto >= place:
                return at, exp
        got = self._fact("step", str(place))
        if not got:
            raise BackendError(f"no admission step covers place {place}")
        at, exp = got[1].split(b" ")
        return float(at), float(exp)

    def steps_after(self, cursor: int) -> Iterator[tuple[int, float]]:
        limit = 256
        first = ("after", "x", str(limit))  # read with the row (see _EXPIRING)
        while True:
            if cursor == self.expired_upto and first in self.facts:
                got = self.facts[first]
            else:
                got = self._fact("after", str(cursor), str(limit))
            n = len(got) // 2
            for upto, value in zip(got[::2], got[1::2], strict=True):
                yield int(upto), float(value.split(b" ")[1])
            if n < limit:
                return
            cursor = int(got[-2])

    def used_between(self, a: int, b: int) -> int:
        return int(self._fact("between", str(a), str(b)))

    def is_used(self, seq: int) -> bool:
        if any(s == seq for s, _ in self.uses):
            return True
        return bool(int(self._fact("used", str(seq))))

    def mark_used(self, seq: int, place: int) -> bool:
        if self.is_used(seq):
            return False
        self.uses.append((seq, place))
        return True

    def admitted(self, n: int) -> None:
        row, now = self.row, self.now
        policy.note_admitted(row, n, now)
        if n > 0:
            self.steps.append((row.head, now, now + row.config.token_ttl))


class RedisRooms(RedisIdempotency):
    """Waiting rooms on Redis; see the module docstring."""

    def _rkey(self, room: str) -> str:
        return f"{self.prefix}{{r:{room}}}:row"

    async def _read(
        self, room: str, requests: Sequence[tuple[str, ...]]
    ) -> tuple[float, RoomRow, str, dict[tuple[str, ...], Any]] | None:
        flat = [part for r in requests for part in r]
        got = await self.run_key("room_read", self._rkey(room), *flat)
        now = float(got[0])
        if len(got) == 1:
            return None
        row, ver = _decode_row(room, got[1])
        return now, row, ver, dict(zip(requests, got[2:], strict=True))

    async def _write(
        self, room: str, ver: str, before: Mapping[str, Any], view: _View, check_joined: bool
    ) -> bool:
        row = view.row
        if row.joined != before["joined"] and ver:
            raise BackendError("a waiting-room rule changed the arrival counter")
        sets: list[Any] = []
        clears: list[str] = []
        for f in _STORED:
            v = getattr(row, f)
            if ver and before.get(f) == v and type(before.get(f)) is type(v):
                continue
            if v is None:
                if ver:
                    clears.append(f)
            else:
                sets += (f, _encode(f, v))
        if ver and not sets and not clears and not view.steps and not view.uses:
            return True
        args: list[Any] = [ver, str(before["joined"]) if check_joined else ""]
        args += [str(len(sets) // 2), *sets, str(len(clears)), *clears]
        args.append(str(len(view.steps)))
        for upto, at, exp in view.steps:
            args += (str(upto), repr(at), repr(exp))
        args.append(str(len(view.uses)))
        for seq, place in view.uses:
            args += (str(seq), str(place))
        try:
            await self.run_key("room_write", self._rkey(room), *args)
        except ScriptError as err:
            if err.code == "STALE":
                return False
            raise BackendError(f"redis room write: {err.code}") from None
        return True

    async def _step(
        self,
        room: str,
        rule: Callable[[_View], T],
        check_joined: bool = False,
        expiring: bool = False,
    ) -> T:
        """Run ``rule`` on a snapshot of the room (drawing the pre-queue first if due) and
        store its outcome atomically, again on a fresh snapshot if the room changed.
        ``expiring``: the rule expires tokens, so read the steps after the row's cursor
        with it (one round trip instead of two)."""
        requests: list[tuple[str, ...]] = [_EXPIRING] if expiring else []
        for _ in range(_RETRIES):
            read = await self._read(room, requests)
            if read is None:
                raise RoomNotFound(room)
            now, row, ver, facts = read
            before = {f: getattr(row, f) for f in _FIELDS}
            view = _View(row, now, facts)
            drew = policy.draw_if_due(row, now)
            try:
                result = rule(view)
            except _Need as need:
                requests.append(need.request)
                continue
            if await self._write(room, ver, before, view, check_joined or drew):
                return result
        raise BackendError(f"waiting room {room!r}: too much contention on its row")

    # -- rooms -----------------------------------------------------------------------------
    async def declare_room(
        self,
        room: str,
        options: Mapping[str, object],
        secret_kid: str | None,
        seed: bytes,
        seed_kid: str,
    ) -> RoomRecord:
        await self.command("ZADD", f"{self.prefix}rooms", 0, room)
        got = await self.run_key("room_read", self._rkey(room))
        if len(got) == 1:  # a new room, created unless another process just did
            now = float(got[0])
            config = RoomConfig(**{**RoomConfig().to_dict(), **options}).validated()
            kid, key_seed = secret_kid or seed_kid, None if secret_kid else seed
            row = RoomRow(0, room, config, config.admit_rate, kid, key_seed, now)
            empty: dict[str, Any] = dict.fromkeys(_FIELDS) | {"joined": 0}
            if await self._write(room, "", empty, _View(row, now, {}), False):
                return await self.room_record(room)

        def update(v: _View) -> RoomRecord:
            row = v.row
            row.config = policy.check_options(row, dict(options))
            if "admit_rate" in options:
                row.rate = row.config.admit_rate
            if secret_kid is not None:
                row.kid, row.key_seed = secret_kid, None
            return self._record(row)

        return await self._step(room, update)

    @staticmethod
    def _record(row: RoomRow) -> RoomRecord:
        return RoomRecord(
            row.name, row.config, row.rate, row.kid, row.key_seed, row.created_at, policy.phase(row)
        )

    async def room_record(self, room: str) -> RoomRecord:
        return await self._step(room, lambda v: self._record(v.row))

    async def list_rooms(self, prefix: str = "") -> list[str]:
        got = await self.command("ZRANGE", f"{self.prefix}rooms", 0, -1)
        return sorted(n for n in map(_text, got) if n.startswith(prefix))

    async def delete_room(self, room: str) -> bool:
        base = self._rkey(room)[:-3]
        gone = await self.command("UNLINK", *(base + k for k in ("row", "fans", "steps", "stepv")))
        await self.command("UNLINK", base + "used")
        await self.command("ZREM", f"{self.prefix}rooms", room)
        return bool(gone)

    async def room_join(self, room: str, fans: list[str]) -> list[Place]:
        for _ in range(_RETRIES):
            try:
                got = await self.run_key("room_join", self._rkey(room), *fans)
            except ScriptError as err:
                if err.code != "NEEDDRAW":
                    raise BackendError(f"redis room join: {err.code}") from None
                await self._step(room, lambda v: None, check_joined=True)
                continue
            if len(got) == 1:
                raise RoomNotFound(room)
            now = float(got[0])
            row, _ = _decode_row(room, got[1])
            seqs = [int(s) for s in got[2:]] or [0] * len(fans)
            view = _View(row, now, {})
            try:
                return [policy.place(row, s, now, view.step_of, view.is_used) for s in seqs]
            except _Need:  # a fan who was admitted before joins again: read its facts
                return [await self.room_status(room, s) for s in seqs]
        raise BackendError(f"waiting room {room!r}: could not draw its pre-queue")

    async def room_status(self, room: str, seq: int) -> Place:
        return await self._step(
            room, lambda v: policy.place(v.row, seq, v.now, v.step_of, v.is_used)
        )

    async def room_tick(self, room: str, holder: str, lease: float) -> TickResult:
        def tick(v: _View) -> TickResult:
            row, now = v.row, v.now
            if not policy.take_admitter(row, holder, lease, now):
                return policy.tick_result(row, False, 0, now)
            policy.expire(row, now, v.steps_after, v.used_between)
            n = policy.admission_allowance(row, now)
            v.admitted(n)
            return policy.tick_result(row, True, n, now)

        return await self._step(room, tick, expiring=True)

    async def room_release_admitter(self, room: str, holder: str) -> bool:
        try:
            return await self._step(room, lambda v: policy.release_admitter(v.row, holder))
        except RoomNotFound:
            return False

    async def room_admit(self, room: str, n: int) -> int:
        def admit(v: _View) -> int:
            if policy.phase(v.row) != "open":
                return 0
            k = min(n, policy.waiting(v.row))
            v.admitted(k)
            return k

        return await self._step(room, admit)

    async def room_set_rate(self, room: str, rate: float) -> None:
        def set_rate(v: _View) -> None:
            v.row.rate = rate

        await self._step(room, set_rate)

    async def room_consume(self, room: str, seq: int) -> str:
        return await self._step(
            room, lambda v: policy.consume(v.row, seq, v.now, v.step_of, v.mark_used)
        )

    async def room_sold_out(self, room: str) -> int:
        return await self._step(room, lambda v: policy.sold_out(v.row, v.now), check_joined=True)

    async def room_close(self, room: str) -> None:
        def close(v: _View) -> None:
            if v.row.closed_at is None:
                v.row.closed_at = v.now

        await self._step(room, close)

    async def room_stats(self, room: str) -> RoomStats:
        def stats(v: _View) -> RoomStats:
            policy.expire(v.row, v.now, v.steps_after, v.used_between)
            return policy.stats(v.row, v.now)

        return await self._step(room, stats, expiring=True)
