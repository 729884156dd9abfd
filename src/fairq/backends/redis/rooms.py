"""The Redis backend's waiting rooms: every step is one Lua script on the room's slot.

The rules are ``room_policy``'s, written out in ``scripts/lib/room.lua`` (line for line, the
Python module is the reference), so a join, a status, an admission step with its lease and
fence, an admit, a consume, sold out and close each run atomically on Redis in one round
trip, with no version checks or retries. What stays in Python is pure: validating options,
the pre-queue's permutation (``fairq.draw``: BLAKE2b, which needs 64-bit arithmetic the
scripts do not have) and the stats computed from a row. The permutation depends only on the
draw's seed and the pre-queue's size, both frozen once drawn, so the client keeps them per
room and passes the place of a pre-queue fan with them as a *hint*; a script that finds the
hint is not for the room's draw answers ``NEEDPLACE`` with the seed and size, and the client
computes and asks again. The draw's seed is drawn here (``secrets``) and sent with every
step that may draw; the script keeps it only if it draws.

Keys, all with the room's own hash tag ``{r:<room>}``: ``row`` (hash: the row's fields),
``fans`` (hash fan -> seq), ``steps`` (zset upto), ``stepv`` (hash upto ->
"admitted_at expires_at"), ``used`` (zset seq -> place). Status reads the row and, for an
admitted fan only, one step and one used flag: O(log n) at any number of fans.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from dataclasses import fields
from typing import Any

import orjson

from ...draw import draw_position
from ...errors import BackendError, ConfigConflict, RoomNotFound
from ...model.rooms import Place, RoomConfig, RoomRecord, RoomStats, TickResult
from .. import room_policy as policy
from ..room_policy import RoomRow, other_key
from .conn import ScriptError
from .idempotency import RedisIdempotency
from .queues import _text

__all__ = ["RedisRooms"]

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
_NEED = b"NEEDPLACE"


def _decode_row(name: str, flat: Sequence[bytes]) -> RoomRow:
    raw = {_text(k): v for k, v in zip(flat[::2], flat[1::2], strict=True)}
    values: dict[str, Any] = {"id": 0, "name": name}
    for f in _FIELDS:
        if f in ("id", "name"):
            continue
        v = raw.get(f)
        if v is None:
            values[f] = None
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
    for f in _INTS - {"id"}:
        values[f] = values[f] or 0
    for f in ("credit", "meas_sum", "admitter_until"):
        values[f] = values[f] or 0.0
    return RoomRow(**values)


def _opt_float(v: Any) -> float | None:
    return None if v in (b"", "") else float(v)


def _opt_int(v: Any) -> int | None:
    return None if v in (b"", "") else int(v)


def _place(got: Sequence[Any]) -> Place:
    state, seq, position, rate, opens_at, admitted_at, expires_at = got
    return Place(
        _text(state),  # type: ignore[arg-type]
        _opt_int(seq),
        _opt_int(position),
        float(rate),
        _opt_float(opens_at),
        _opt_float(admitted_at),
        _opt_float(expires_at),
    )


class RedisRooms(RedisIdempotency):
    """Waiting rooms on Redis; see the module docstring."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: room -> (draw seed, pre-queue size) once seen drawn; frozen for the room's life
        self._draws: dict[str, tuple[bytes, int]] = {}

    def _rkey(self, room: str) -> str:
        return f"{self.prefix}{{r:{room}}}:row"

    def _hint(self, room: str, seq: int) -> tuple[bytes | str, ...]:
        draw = self._draws.get(room)
        if draw is None or not 1 <= seq <= draw[1]:
            return ("", "", "")
        seed, size = draw
        return (seed, str(size), str(draw_position(seed, size, seq - 1) + 1))

    def _note_draw(self, room: str, seed: bytes, size: int) -> None:
        if seed:
            self._draws[room] = (bytes(seed), int(size))

    async def _room(self, script: str, room: str, *args: Any) -> Any:
        """Run a room step (with a fresh draw seed); RoomNotFound if there is no room."""
        try:
            got = await self.run_key(script, self._rkey(room), secrets.token_bytes(32), *args)
        except ScriptError as err:
            if err.code in ("CONFLICT", "KEY"):
                raise
            raise BackendError(f"redis {script}: {err.code} {' '.join(err.values)}") from None
        if got == []:
            raise RoomNotFound(room)
        return got

    async def _placed(self, script: str, room: str, seq: int) -> Any:
        """A step about arrival ``seq`` that may need its drawn place (see the docstring)."""
        for _ in range(3):
            got = await self._room(script, room, str(seq), *self._hint(room, seq))
            if got[0] != _NEED:
                return got
            self._note_draw(room, got[1], got[2])
        raise BackendError(f"waiting room {room!r}: the draw of its pre-queue keeps changing")

    # -- rooms -----------------------------------------------------------------------------
    async def declare_room(
        self,
        room: str,
        options: Mapping[str, object],
        secret_kid: str | None,
        seed: bytes,
        seed_kid: str,
    ) -> RoomRecord:
        # options are checked field by field: over the defaults as over the stored config
        config = RoomConfig(**{**RoomConfig().to_dict(), **options}).validated()
        given = {k: v for k, v in config.to_dict().items() if k in options}
        await self.command("ZADD", f"{self.prefix}rooms", 0, room)
        try:
            got = await self._room(
                "room_declare",
                room,
                orjson.dumps(given),
                orjson.dumps(config.to_dict()),
                secret_kid or "",
                seed,
                seed_kid,
            )
        except ScriptError as err:
            if err.code == "KEY":
                raise ConfigConflict(other_key(room, err.values[0])) from None
            raise ConfigConflict(
                f"waiting room {room!r} has opened (its pre-queue was drawn): opens_at "
                "cannot change any more"
            ) from None
        return self._record(_decode_row(room, got[1]))

    @staticmethod
    def _record(row: RoomRow) -> RoomRecord:
        return RoomRecord(
            row.name, row.config, row.rate, row.kid, row.key_seed, row.created_at, policy.phase(row)
        )

    async def room_record(self, room: str) -> RoomRecord:
        got = await self._room("room_stats", room, "0")
        return self._record(_decode_row(room, got[1]))

    async def list_rooms(self, prefix: str = "") -> list[str]:
        got = await self.command("ZRANGE", f"{self.prefix}rooms", 0, -1)
        return sorted(n for n in map(_text, got) if n.startswith(prefix))

    async def delete_room(self, room: str) -> bool:
        base = self._rkey(room)[:-3]
        keys = (base + k for k in ("row", "fans", "steps", "stepv", "used"))
        gone = await self.command("UNLINK", *keys)
        await self.command("ZREM", f"{self.prefix}rooms", room)
        self._draws.pop(room, None)
        return bool(gone)

    async def room_join(self, room: str, fans: list[str]) -> list[Place]:
        got = await self._room("room_join", room, *fans)
        seed, size, phase, head, rate_s, opens_s = got[:6]
        self._note_draw(room, seed, size)
        rate, opens_at = float(rate_s), _opt_float(opens_s)
        scheduled = phase == b"scheduled"
        places: list[Place] = []
        for item in got[6:]:
            if isinstance(item, int):  # room_place's answer, from the numbers (see the script)
                if scheduled:
                    places.append(Place("pre_queue", item, None, rate, opens_at))
                else:
                    places.append(Place("waiting", item, item - head - 1, rate, opens_at))
            elif item[0] == _NEED:  # a pre-queue fan joining again after the draw
                places.append(await self.room_status(room, int(item[1])))
            else:
                places.append(_place(item))
        return places

    async def room_status(self, room: str, seq: int) -> Place:
        return _place(await self._placed("room_status", room, seq))

    async def room_tick(self, room: str, holder: str, lease: float) -> TickResult:
        fence, admitted, rate, phase, waiting, until = await self._room(
            "room_tick", room, holder, repr(float(lease))
        )
        return TickResult(
            _opt_int(fence),
            int(admitted),
            float(rate),
            _text(phase),  # type: ignore[arg-type]
            int(waiting),
            _opt_float(until),
        )

    async def room_release_admitter(self, room: str, holder: str) -> bool:
        got = await self.run_key("room_release", self._rkey(room), secrets.token_bytes(32), holder)
        return bool(got)

    async def room_admit(self, room: str, n: int) -> int:
        (k,) = await self._room("room_admit", room, str(int(n)))
        return int(k)

    async def room_set_rate(self, room: str, rate: float) -> None:
        await self._room("room_set_rate", room, repr(float(rate)))

    async def room_consume(self, room: str, seq: int) -> str:
        (outcome,) = await self._placed("room_consume", room, seq)
        return _text(outcome)

    async def room_sold_out(self, room: str) -> int:
        (told,) = await self._room("room_sold_out", room)
        return int(told)

    async def room_close(self, room: str) -> None:
        await self._room("room_close", room)

    async def room_stats(self, room: str) -> RoomStats:
        now, flat = await self._room("room_stats", room, "1")
        return policy.stats(_decode_row(room, flat), float(now))
