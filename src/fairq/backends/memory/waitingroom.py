"""The memory backend's waiting rooms: a row of numbers per room and three small indexes.

The rules are ``room_policy``'s; this module only stores. Fans are a dict (fan id →
arrival number); admission steps a list in cursor order (found by bisection); used tokens
a dict of arrival number → place. Each method runs without awaiting, so each is one
atomic step, as on the durable engines.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from ...clock import Clock
from ...errors import RoomNotFound
from ...model.rooms import Place, RoomConfig, RoomRecord, RoomStats, TickResult
from .. import room_policy as policy
from ..room_policy import RoomRow
from .queues import MemoryQueues

__all__ = ["MemoryWaitingRoom"]


@dataclass(slots=True, eq=False)
class _Room:
    row: RoomRow
    fans: dict[str, int] = field(default_factory=dict)
    step_upto: list[int] = field(default_factory=list)
    steps: list[tuple[float, float]] = field(default_factory=list)  # (admitted at, expires at)
    used: set[int] = field(default_factory=set)  # arrival numbers of used tokens
    used_places: list[int] = field(default_factory=list)  # their places, sorted

    def step_of(self, place: int) -> tuple[float, float]:
        return self.steps[bisect.bisect_left(self.step_upto, place)]

    def steps_after(self, cursor: int) -> Iterator[tuple[int, float]]:
        i = bisect.bisect_right(self.step_upto, cursor)
        for j in range(i, len(self.step_upto)):
            yield self.step_upto[j], self.steps[j][1]

    def used_between(self, a: int, b: int) -> int:
        places = self.used_places
        return bisect.bisect_right(places, b) - bisect.bisect_right(places, a)

    def mark_used(self, seq: int, place: int) -> bool:
        if seq in self.used:
            return False
        self.used.add(seq)
        bisect.insort(self.used_places, place)
        return True

    def admitted(self, n: int, now: float) -> None:
        row = self.row
        policy.note_admitted(row, n, now)
        if n > 0:
            self.step_upto.append(row.head)
            self.steps.append((now, now + row.config.token_ttl))


def _record(row: RoomRow) -> RoomRecord:
    return RoomRecord(
        row.name, row.config, row.rate, row.kid, row.key_seed, row.created_at, policy.phase(row)
    )


class MemoryWaitingRoom(MemoryQueues):
    """Waiting rooms in this process's memory."""

    def __init__(self, clock: Clock) -> None:
        super().__init__(clock)
        self._rooms: dict[str, _Room] = {}
        self._room_ids = itertools.count(1)

    def _room(self, name: str) -> _Room:
        self._open()
        room = self._rooms.get(name)
        if room is None:
            raise RoomNotFound(name)
        policy.draw_if_due(room.row, self.clock.now())
        return room

    # -- waiting rooms ---------------------------------------------------------------------
    async def declare_room(
        self,
        room: str,
        options: Mapping[str, object],
        secret_kid: str | None,
        seed: bytes,
        seed_kid: str,
    ) -> RoomRecord:
        self._open()
        now = self.clock.now()
        r = self._rooms.get(room)
        if r is None:
            config = RoomConfig(**{**RoomConfig().to_dict(), **options}).validated()
            row = RoomRow(
                next(self._room_ids),
                room,
                config,
                config.admit_rate,
                secret_kid or seed_kid,
                None if secret_kid else seed,
                now,
            )
            r = self._rooms[room] = _Room(row)
        else:
            row = r.row
            policy.draw_if_due(row, now)
            row.config = policy.check_options(row, dict(options), secret_kid)
            if "admit_rate" in options:
                row.rate = row.config.admit_rate
        policy.draw_if_due(row, now)
        return _record(row)

    async def room_record(self, room: str) -> RoomRecord:
        return _record(self._room(room).row)

    async def list_rooms(self, prefix: str = "") -> list[str]:
        self._open()
        return sorted(n for n in self._rooms if n.startswith(prefix))

    async def delete_room(self, room: str) -> bool:
        self._open()
        return self._rooms.pop(room, None) is not None

    async def room_join(self, room: str, fans: list[str]) -> list[Place]:
        r = self._room(room)
        row = r.row
        now = self.clock.now()
        if policy.phase(row) in ("sold_out", "closed"):
            gone = policy.place(row, 0, now, r.step_of, r.used.__contains__)
            return [gone] * len(fans)
        places = []
        for fan in fans:
            seq = r.fans.get(fan)
            if seq is None:
                row.joined += 1
                seq = r.fans[fan] = row.joined
            places.append(policy.place(row, seq, now, r.step_of, r.used.__contains__))
        return places

    async def room_status(self, room: str, seq: int) -> Place:
        r = self._room(room)
        return policy.place(r.row, seq, self.clock.now(), r.step_of, r.used.__contains__)

    async def room_tick(self, room: str, holder: str, lease: float) -> TickResult:
        r = self._room(room)
        row = r.row
        now = self.clock.now()
        if not policy.take_admitter(row, holder, lease, now):
            return policy.tick_result(row, False, 0, now)
        policy.expire(row, now, r.steps_after, r.used_between)
        n = policy.admission_allowance(row, now)
        r.admitted(n, now)
        return policy.tick_result(row, True, n, now)

    async def room_release_admitter(self, room: str, holder: str) -> bool:
        self._open()
        r = self._rooms.get(room)
        return r is not None and policy.release_admitter(r.row, holder)

    async def room_admit(self, room: str, n: int) -> int:
        r = self._room(room)
        row = r.row
        if policy.phase(row) != "open":
            return 0
        n = min(n, policy.waiting(row))
        r.admitted(n, self.clock.now())
        return n

    async def room_set_rate(self, room: str, rate: float) -> None:
        self._room(room).row.rate = rate

    async def room_consume(self, room: str, seq: int) -> str:
        r = self._room(room)
        return policy.consume(r.row, seq, self.clock.now(), r.step_of, r.mark_used)

    async def room_sold_out(self, room: str) -> int:
        return policy.sold_out(self._room(room).row, self.clock.now())

    async def room_close(self, room: str) -> None:
        row = self._room(room).row
        if row.closed_at is None:
            row.closed_at = self.clock.now()

    async def room_stats(self, room: str) -> RoomStats:
        r = self._room(room)
        now = self.clock.now()
        policy.expire(r.row, now, r.steps_after, r.used_between)
        return policy.stats(r.row, now)
