"""The SQLite backend's waiting rooms, each operation inside one transaction.

The rules are ``room_policy``'s; this module only stores. ``fairq_rooms`` holds a room's
row of numbers (read, changed by the policy, written back if changed), ``fairq_room_fans``
one row per fan keyed by (room, fan id) — the uniqueness behind "one ticket per fan" —
and ``fairq_room_steps`` / ``fairq_room_used`` the admission steps and used tokens. A
status reads the room's row and, for an admitted fan only, one step and one used-token
probe: no statement ever visits the fans ahead. The write lock of ``BEGIN IMMEDIATE``
makes each operation — the draw at opening included — atomic across every process on
the file.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import orjson

from ...errors import RoomNotFound
from ...model.rooms import Place, RoomConfig, RoomRecord, RoomStats, TickResult
from .. import room_policy as policy
from ..room_policy import ROW_FIELDS, RoomRow
from .txn import Txn, chunks, marks

_SELECT = f"SELECT {', '.join(ROW_FIELDS)} FROM fairq_rooms WHERE name = ?"
_MUTABLE = tuple(f for f in ROW_FIELDS if f not in ("id", "name", "created_at"))
_UPDATE = f"UPDATE fairq_rooms SET {', '.join(f'{c} = ?' for c in _MUTABLE)} WHERE id = ?"
_CONFIG_AT = ROW_FIELDS.index("config")
_STEP_OF = (
    "SELECT admitted_at, expires_at FROM fairq_room_steps WHERE room_id = ? AND upto >= ? "
    "ORDER BY upto LIMIT 1"
)


class _Room:
    """A room's row inside one transaction, with the storage the policy calls back into."""

    __slots__ = ("before", "row", "t")

    def __init__(self, t: Txn, row: RoomRow) -> None:
        self.t = t
        self.row = row
        self.before = row.snapshot()

    def save(self) -> None:
        row = self.row
        if row.snapshot() == self.before:
            return
        values: list[Any] = []
        for col in _MUTABLE:
            value = getattr(row, col)
            values.append(orjson.dumps(value.to_dict()).decode() if col == "config" else value)
        values.append(row.id)
        self.t.conn.execute(_UPDATE, values)
        self.before = row.snapshot()

    def step_of(self, place: int) -> tuple[float, float]:
        found = self.t.conn.execute(_STEP_OF, (self.row.id, place)).fetchone()
        assert found is not None, f"no admission step covers place {place}"
        return found[0], found[1]

    def steps_after(self, cursor: int) -> Iterator[tuple[int, float]]:
        yield from self.t.conn.execute(
            "SELECT upto, expires_at FROM fairq_room_steps WHERE room_id = ? AND upto > ? "
            "ORDER BY upto",
            (self.row.id, cursor),
        )

    def used_between(self, a: int, b: int) -> int:
        (n,) = self.t.conn.execute(
            "SELECT count(*) FROM fairq_room_used WHERE room_id = ? AND place > ? AND place <= ?",
            (self.row.id, a, b),
        ).fetchone()
        return int(n)

    def is_used(self, seq: int) -> bool:
        return (
            self.t.conn.execute(
                "SELECT 1 FROM fairq_room_used WHERE room_id = ? AND seq = ?", (self.row.id, seq)
            ).fetchone()
            is not None
        )

    def mark_used(self, seq: int, place: int) -> bool:
        cur = self.t.conn.execute(
            "INSERT INTO fairq_room_used (room_id, seq, place, used_at) VALUES (?, ?, ?, ?) "
            "ON CONFLICT DO NOTHING",
            (self.row.id, seq, place, self.t.now),
        )
        return cur.rowcount == 1

    def admitted(self, n: int) -> None:
        row, now = self.row, self.t.now
        policy.note_admitted(row, n, now)
        if n > 0:
            self.t.conn.execute(
                "INSERT INTO fairq_room_steps (room_id, upto, admitted_at, expires_at) "
                "VALUES (?, ?, ?, ?)",
                (row.id, row.head, now, now + row.config.token_ttl),
            )


_configs: dict[str, RoomConfig] = {}  # parsed configs by their JSON (few, and immutable)


def _config(text: str) -> RoomConfig:
    config = _configs.get(text)
    if config is None:
        if len(_configs) > 1000:
            _configs.clear()
        config = _configs[text] = RoomConfig.from_dict(orjson.loads(text))
    return config


def _find(t: Txn, name: str) -> _Room | None:
    found = t.conn.execute(_SELECT, (name,)).fetchone()
    if found is None:
        return None
    values = list(found)
    values[_CONFIG_AT] = _config(values[_CONFIG_AT])
    room = _Room(t, RoomRow(*values))
    policy.draw_if_due(room.row, t.now)  # SPEC §8 rule 3: whoever comes first draws
    return room


def _room(t: Txn, name: str) -> _Room:
    room = _find(t, name)
    if room is None:
        raise RoomNotFound(name)
    return room


def _record(row: RoomRow) -> RoomRecord:
    return RoomRecord(
        row.name, row.config, row.rate, row.kid, row.key_seed, row.created_at, policy.phase(row)
    )


def declare_room(
    t: Txn,
    name: str,
    options: Mapping[str, object],
    secret_kid: str | None,
    seed: bytes,
    seed_kid: str,
) -> RoomRecord:
    room = _find(t, name)
    if room is None:
        config = RoomConfig(**{**RoomConfig().to_dict(), **options}).validated()
        t.conn.execute(
            "INSERT INTO fairq_rooms (name, config, rate, kid, key_seed, created_at) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (
                name,
                orjson.dumps(config.to_dict()).decode(),
                config.admit_rate,
                secret_kid or seed_kid,
                None if secret_kid else seed,
                t.now,
            ),
        )
        room = _room(t, name)
    else:
        row = room.row
        row.config = policy.check_options(row, dict(options), secret_kid)
        if "admit_rate" in options:
            row.rate = row.config.admit_rate
    room.save()
    return _record(room.row)


def room_record(t: Txn, name: str) -> RoomRecord:
    room = _room(t, name)
    room.save()
    return _record(room.row)


def delete_room(t: Txn, name: str) -> bool:
    found = t.conn.execute("SELECT id FROM fairq_rooms WHERE name = ?", (name,)).fetchone()
    if found is None:
        return False
    for table in ("fairq_room_fans", "fairq_room_steps", "fairq_room_used"):
        t.conn.execute(f"DELETE FROM {table} WHERE room_id = ?", (found[0],))
    t.conn.execute("DELETE FROM fairq_rooms WHERE id = ?", (found[0],))
    return True


def _seqs(t: Txn, room: _Room, fans: list[str]) -> list[int]:
    """Each fan's arrival number, handing the next ones to new fans (in the order given)."""
    row, conn = room.row, t.conn
    if len(fans) == 1:
        cur = conn.execute(
            "INSERT INTO fairq_room_fans (room_id, fan, seq) VALUES (?, ?, ?) "
            "ON CONFLICT DO NOTHING",
            (row.id, fans[0], row.joined + 1),
        )
        if cur.rowcount == 1:
            row.joined += 1
            return [row.joined]
        (seq,) = conn.execute(
            "SELECT seq FROM fairq_room_fans WHERE room_id = ? AND fan = ?", (row.id, fans[0])
        ).fetchone()
        return [int(seq)]
    known: dict[str, int] = {}
    distinct = list(dict.fromkeys(fans))
    for part in chunks(distinct):
        known.update(
            conn.execute(
                "SELECT fan, seq FROM fairq_room_fans WHERE room_id = ? "
                f"AND fan IN ({marks(len(part))})",
                (row.id, *part),
            ).fetchall()
        )
    new = []
    for fan in distinct:
        if fan not in known:
            row.joined += 1
            known[fan] = row.joined
            new.append((row.id, fan, row.joined))
    if new:
        conn.executemany("INSERT INTO fairq_room_fans (room_id, fan, seq) VALUES (?, ?, ?)", new)
    return [known[f] for f in fans]


def join(t: Txn, name: str, fans: list[str]) -> list[Place]:
    room = _room(t, name)
    row, now = room.row, t.now
    if policy.phase(row) in ("sold_out", "closed"):
        room.save()
        return [policy.place(row, 0, now, room.step_of, room.is_used)] * len(fans)
    seqs = _seqs(t, room, fans)
    places = [policy.place(row, s, now, room.step_of, room.is_used) for s in seqs]
    room.save()
    return places


def status(t: Txn, name: str, seq: int) -> Place:
    room = _room(t, name)
    found = policy.place(room.row, seq, t.now, room.step_of, room.is_used)
    room.save()
    return found


def tick(t: Txn, name: str, holder: str, lease: float) -> TickResult:
    room = _room(t, name)
    row, now = room.row, t.now
    if not policy.take_admitter(row, holder, lease, now):
        room.save()
        return policy.tick_result(row, False, 0, now)
    policy.expire(row, now, room.steps_after, room.used_between)
    n = policy.admission_allowance(row, now)
    room.admitted(n)
    room.save()
    return policy.tick_result(row, True, n, now)


def release_admitter(t: Txn, name: str, holder: str) -> bool:
    room = _find(t, name)
    if room is None:
        return False
    released = policy.release_admitter(room.row, holder)
    room.save()
    return released


def admit(t: Txn, name: str, n: int) -> int:
    room = _room(t, name)
    row = room.row
    if policy.phase(row) == "open":
        n = min(n, policy.waiting(row))
        room.admitted(n)
    else:
        n = 0
    room.save()
    return n


def set_rate(t: Txn, name: str, rate: float) -> None:
    room = _room(t, name)
    room.row.rate = rate
    room.save()


def consume(t: Txn, name: str, seq: int) -> str:
    room = _room(t, name)
    outcome = policy.consume(room.row, seq, t.now, room.step_of, room.mark_used)
    room.save()
    return outcome


def sold_out(t: Txn, name: str) -> int:
    room = _room(t, name)
    told = policy.sold_out(room.row, t.now)
    room.save()
    return told


def close(t: Txn, name: str) -> None:
    room = _room(t, name)
    if room.row.closed_at is None:
        room.row.closed_at = t.now
    room.save()


def stats(t: Txn, name: str) -> RoomStats:
    room = _room(t, name)
    policy.expire(room.row, t.now, room.steps_after, room.used_between)
    room.save()
    return policy.stats(room.row, t.now)
