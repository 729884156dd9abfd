"""The PostgreSQL backend's waiting rooms, each operation one transaction.

The rules are ``room_policy``'s; this module only stores. The room's row is read
``FOR UPDATE`` (so every operation on a room — the draw at opening included — is atomic
across all processes), changed by the policy, and written back if it changed. The
policy asks a few questions of the indexes through callbacks; they are answered from
rows read beforehand (one admission step, one used-token probe), so no statement visits
the fans ahead of anyone.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import orjson

from ...errors import RoomNotFound
from ...model.rooms import Place, RoomConfig, RoomRecord, RoomStats, TickResult
from .. import room_policy as policy
from ..room_policy import ROW_FIELDS, RoomRow
from .connection import Cursor

_MUTABLE = tuple(f for f in ROW_FIELDS if f not in ("id", "name", "created_at"))


class Txn:
    """A cursor in a transaction, the schema and the clock reading."""

    __slots__ = ("cur", "now", "s")

    def __init__(self, cur: Cursor, s: str, now: float) -> None:
        self.cur = cur
        self.s = s
        self.now = now


class _Room:
    __slots__ = ("before", "row", "t")

    def __init__(self, t: Txn, row: RoomRow) -> None:
        self.t = t
        self.row = row
        self.before = row.snapshot()

    async def save(self) -> None:
        row = self.row
        if row.snapshot() == self.before:
            return
        values: list[Any] = []
        for col in _MUTABLE:
            value = getattr(row, col)
            values.append(orjson.dumps(value.to_dict()).decode() if col == "config" else value)
        sets = ", ".join(f"{c} = %s" + ("::jsonb" if c == "config" else "") for c in _MUTABLE)
        await self.t.cur.execute(
            f"UPDATE {self.t.s}.rooms SET {sets} WHERE id = %s", (*values, row.id)
        )
        self.before = row.snapshot()

    async def step_of(self, place: int) -> tuple[float, float]:
        await self.t.cur.execute(
            f"SELECT admitted_at, expires_at FROM {self.t.s}.room_steps WHERE room_id = %s "
            "AND upto >= %s ORDER BY upto LIMIT 1",
            (self.row.id, place),
        )
        found = await self.t.cur.fetchone()
        assert found is not None, f"no admission step covers place {place}"
        return float(found[0]), float(found[1])

    async def is_used(self, seq: int) -> bool:
        await self.t.cur.execute(
            f"SELECT 1 FROM {self.t.s}.room_used WHERE room_id = %s AND seq = %s",
            (self.row.id, seq),
        )
        return await self.t.cur.fetchone() is not None

    async def place(self, seq: int) -> Place:
        """``policy.place``, its two questions answered first if it will ask them."""
        row, now = self.row, self.t.now
        step: tuple[float, float] = (0.0, 0.0)
        used = False
        if (
            seq >= 1
            and policy.phase(row) not in ("sold_out", "closed", "scheduled")
            and policy.place_of(row, seq) <= row.head
        ):
            step = await self.step_of(policy.place_of(row, seq))
            used = await self.is_used(seq)
        return policy.place(row, seq, now, lambda _: step, lambda _: used)

    async def expire(self) -> None:
        """``policy.expire``: the last lapsed step after the cursor, and the used tokens up
        to it, read in one statement."""
        row, t = self.row, self.t
        if row.expired_upto >= row.head:
            return
        await t.cur.execute(
            f"WITH live AS (SELECT min(upto) AS first FROM {t.s}.room_steps "
            "WHERE room_id = %s AND upto > %s AND expires_at > %s), "
            f"lapsed AS (SELECT max(upto) AS upto FROM {t.s}.room_steps, live "
            "WHERE room_id = %s AND upto > %s AND (live.first IS NULL OR upto < live.first)) "
            f"SELECT lapsed.upto, (SELECT count(*) FROM {t.s}.room_used WHERE room_id = %s "
            "AND place > %s AND place <= lapsed.upto) FROM lapsed",
            (row.id, row.expired_upto, t.now, row.id, row.expired_upto, row.id, row.expired_upto),
        )
        found = await t.cur.fetchone()
        if found is None or found[0] is None:
            return
        upto, used = int(found[0]), int(found[1])

        def steps_after(cursor: int) -> Iterator[tuple[int, float]]:
            yield upto, float("-inf")

        policy.expire(row, t.now, steps_after, lambda a, b: used)

    async def admitted(self, n: int) -> None:
        row, now = self.row, self.t.now
        policy.note_admitted(row, n, now)
        if n > 0:
            await self.t.cur.execute(
                f"INSERT INTO {self.t.s}.room_steps (room_id, upto, admitted_at, expires_at) "
                "VALUES (%s, %s, %s, %s)",
                (row.id, row.head, now, now + row.config.token_ttl),
            )


_configs: dict[str, RoomConfig] = {}


def _config(data: Any) -> RoomConfig:
    key = orjson.dumps(data, option=orjson.OPT_SORT_KEYS).decode()
    config = _configs.get(key)
    if config is None:
        if len(_configs) > 1000:
            _configs.clear()
        config = _configs[key] = RoomConfig.from_dict(data)
    return config


async def _find(t: Txn, name: str) -> _Room | None:
    await t.cur.execute(
        f"SELECT {', '.join(ROW_FIELDS)} FROM {t.s}.rooms WHERE name = %s FOR UPDATE", (name,)
    )
    found = await t.cur.fetchone()
    if found is None:
        return None
    values = list(found)
    for i, f in enumerate(ROW_FIELDS):
        if f == "config":
            values[i] = _config(values[i])
        elif f in ("key_seed", "draw_seed") and values[i] is not None:
            values[i] = bytes(values[i])
    room = _Room(t, RoomRow(*values))
    policy.draw_if_due(room.row, t.now)  # SPEC §8 rule 3: whoever comes first draws
    return room


async def _room(t: Txn, name: str) -> _Room:
    room = await _find(t, name)
    if room is None:
        raise RoomNotFound(name)
    return room


def _record(row: RoomRow) -> RoomRecord:
    return RoomRecord(
        row.name, row.config, row.rate, row.kid, row.key_seed, row.created_at, policy.phase(row)
    )


async def declare_room(
    t: Txn,
    name: str,
    options: Mapping[str, object],
    secret_kid: str | None,
    seed: bytes,
    seed_kid: str,
) -> RoomRecord:
    room = await _find(t, name)
    if room is None:
        config = RoomConfig(**{**RoomConfig().to_dict(), **options}).validated()
        await t.cur.execute(
            f"INSERT INTO {t.s}.rooms (name, config, rate, kid, key_seed, created_at) "
            "VALUES (%s, %s::jsonb, %s, %s, %s, %s) ON CONFLICT (name) DO NOTHING",
            (
                name,
                orjson.dumps(config.to_dict()).decode(),
                config.admit_rate,
                secret_kid or seed_kid,
                None if secret_kid else seed,
                t.now,
            ),
        )
        if t.cur.rowcount == 1:
            room = await _room(t, name)
            await room.save()
            return _record(room.row)
        room = await _room(t, name)  # created meanwhile by another process
    row = room.row
    row.config = policy.check_options(row, dict(options), secret_kid)
    if "admit_rate" in options:
        row.rate = row.config.admit_rate
    await room.save()
    return _record(row)


async def room_record(t: Txn, name: str) -> RoomRecord:
    room = await _room(t, name)
    await room.save()
    return _record(room.row)


async def delete_room(t: Txn, name: str) -> bool:
    await t.cur.execute(f"SELECT id FROM {t.s}.rooms WHERE name = %s FOR UPDATE", (name,))
    found = await t.cur.fetchone()
    if found is None:
        return False
    for table in ("room_fans", "room_steps", "room_used"):
        await t.cur.execute(f"DELETE FROM {t.s}.{table} WHERE room_id = %s", (found[0],))
    await t.cur.execute(f"DELETE FROM {t.s}.rooms WHERE id = %s", (found[0],))
    return True


async def _seqs(t: Txn, room: _Room, fans: list[str]) -> list[int]:
    """Each fan's arrival number, handing the next ones to new fans (in the order given):
    one statement for the known fans, one insert for the new ones."""
    row = room.row
    distinct = list(dict.fromkeys(fans))
    await t.cur.execute(
        f"SELECT fan, seq FROM {t.s}.room_fans WHERE room_id = %s AND fan = ANY(%s::text[])",
        (row.id, distinct),
    )
    known: dict[str, int] = {r[0]: int(r[1]) for r in await t.cur.fetchall()}
    new_fans: list[str] = []
    new_seqs: list[int] = []
    for fan in distinct:
        if fan not in known:
            row.joined += 1
            known[fan] = row.joined
            new_fans.append(fan)
            new_seqs.append(row.joined)
    if new_fans:
        await t.cur.execute(
            f"INSERT INTO {t.s}.room_fans (room_id, fan, seq) "
            "SELECT %s, f, s FROM unnest(%s::text[], %s::bigint[]) AS u(f, s)",
            (row.id, new_fans, new_seqs),
        )
    return [known[f] for f in fans]


async def join(t: Txn, name: str, fans: list[str]) -> list[Place]:
    room = await _room(t, name)
    row = room.row
    if policy.phase(row) in ("sold_out", "closed"):
        await room.save()
        return [await room.place(0)] * len(fans)
    seqs = await _seqs(t, room, fans)
    places = [await room.place(s) for s in seqs]
    await room.save()
    return places


async def status(t: Txn, name: str, seq: int) -> Place:
    room = await _room(t, name)
    found = await room.place(seq)
    await room.save()
    return found


async def tick(t: Txn, name: str, holder: str, lease: float) -> TickResult:
    room = await _room(t, name)
    row, now = room.row, t.now
    if not policy.take_admitter(row, holder, lease, now):
        await room.save()
        return policy.tick_result(row, False, 0, now)
    await room.expire()
    n = policy.admission_allowance(row, now)
    await room.admitted(n)
    await room.save()
    return policy.tick_result(row, True, n, now)


async def release_admitter(t: Txn, name: str, holder: str) -> bool:
    room = await _find(t, name)
    if room is None:
        return False
    released = policy.release_admitter(room.row, holder)
    await room.save()
    return released


async def admit(t: Txn, name: str, n: int) -> int:
    room = await _room(t, name)
    row = room.row
    if policy.phase(row) == "open":
        n = min(n, policy.waiting(row))
        await room.admitted(n)
    else:
        n = 0
    await room.save()
    return n


async def set_rate(t: Txn, name: str, rate: float) -> None:
    room = await _room(t, name)
    room.row.rate = rate
    await room.save()


async def consume(t: Txn, name: str, seq: int) -> str:
    room = await _room(t, name)
    row, now = room.row, t.now
    step: tuple[float, float] = (0.0, 0.0)
    marked = False
    if row.drawn_at is not None and 1 <= seq <= row.joined:
        where = policy.place_of(row, seq)
        if where <= row.head:
            step = await room.step_of(where)
            if now < step[1]:  # policy.consume will ask to mark it used: do it first
                await t.cur.execute(
                    f"INSERT INTO {t.s}.room_used (room_id, seq, place, used_at) "
                    "VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING",
                    (row.id, seq, where, now),
                )
                marked = t.cur.rowcount == 1
    outcome = policy.consume(row, seq, now, lambda _: step, lambda _s, _p: marked)
    await room.save()
    return outcome


async def sold_out(t: Txn, name: str) -> int:
    room = await _room(t, name)
    told = policy.sold_out(room.row, t.now)
    await room.save()
    return told


async def close(t: Txn, name: str) -> None:
    room = await _room(t, name)
    if room.row.closed_at is None:
        room.row.closed_at = t.now
    await room.save()


async def stats(t: Txn, name: str) -> RoomStats:
    room = await _room(t, name)
    await room.expire()
    await room.save()
    return policy.stats(room.row, t.now)
