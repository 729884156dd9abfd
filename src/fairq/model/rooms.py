"""What a waiting room is, as handles and backends both see it: its options, what the
backend keeps of it, a fan's place and status, an admission step's outcome, the stats."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ..errors import InvalidOption
from ..message import check_number

__all__ = [
    "ROOM_OPTIONS",
    "ROOM_STATES",
    "Place",
    "RoomConfig",
    "RoomPhase",
    "RoomRecord",
    "RoomState",
    "RoomStats",
    "Status",
    "TickResult",
    "Ticket",
    "refresh_interval",
]


RoomState = Literal["pre_queue", "waiting", "admitted", "used", "expired", "sold_out", "closed"]


ROOM_STATES: tuple[RoomState, ...] = (
    "pre_queue",
    "waiting",
    "admitted",
    "used",
    "expired",
    "sold_out",
    "closed",
)


#: ``scheduled`` (before opening: the pre-queue), ``open``, ``sold_out``, ``closed``
RoomPhase = Literal["scheduled", "open", "sold_out", "closed"]


@dataclass(frozen=True, slots=True)
class RoomConfig:
    """The options of a waiting room (see ``Broker.waiting_room``).

    ``admit_rate``: fans admitted per second (the rate the admitter starts at; changed
    live with :meth:`WaitingRoom.set_rate`); ``token_ttl``: seconds an admission token is
    valid; ``opens_at``: when the room opens (seconds since the epoch; None: open now) —
    fans who join earlier are drawn into a random order at opening; ``max_active``: at
    most this many admitted fans with live, unused tokens at once (None: no cap).
    """

    admit_rate: float = 500.0
    token_ttl: float = 600.0
    opens_at: float | None = None
    max_active: int | None = None

    def validated(self) -> RoomConfig:
        """This config with numbers checked and made floats; ``InvalidOption`` if not."""
        if self.max_active is not None and (
            isinstance(self.max_active, bool)
            or not isinstance(self.max_active, int)
            or self.max_active < 1
        ):
            raise InvalidOption(
                f"max_active must be an integer >= 1 or None, got {self.max_active!r}"
            )
        return RoomConfig(
            check_number("admit_rate", self.admit_rate),
            check_number("token_ttl", self.token_ttl, strict=True),
            None if self.opens_at is None else check_number("opens_at", self.opens_at, strict=True),
            self.max_active,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "admit_rate": self.admit_rate,
            "token_ttl": self.token_ttl,
            "opens_at": self.opens_at,
            "max_active": self.max_active,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RoomConfig:
        # floats whatever the store wrote (Lua's cjson writes 2.0 as 2)
        opens_at = data["opens_at"]
        return cls(
            float(data["admit_rate"]),
            float(data["token_ttl"]),
            None if opens_at is None else float(opens_at),
            data["max_active"],
        )


#: the options ``Broker.waiting_room`` may set (those not given keep their stored value)
ROOM_OPTIONS = frozenset(("admit_rate", "token_ttl", "opens_at", "max_active"))


@dataclass(frozen=True, slots=True)
class RoomRecord:
    """What the backend keeps of a room's set-up: options, the live rate, the key id its
    tokens carry, and its generated root secret (None when its processes pass one)."""

    name: str
    config: RoomConfig
    rate: float
    kid: str
    key_seed: bytes | None
    created_at: float
    phase: RoomPhase


@dataclass(frozen=True, slots=True)
class Place:
    """A backend's answer about one fan: ``state``, arrival number ``seq`` (None when not
    looked up), ``position`` (fans ahead; None before the draw or when not waiting), the
    admit ``rate`` to estimate with, the room's ``opens_at``, and for an admitted fan when
    it was admitted and when its token expires."""

    state: RoomState
    seq: int | None
    position: int | None
    rate: float
    opens_at: float | None
    admitted_at: float | None = None
    expires_at: float | None = None


@dataclass(frozen=True, slots=True)
class TickResult:
    """The outcome of one admission step: ``fence`` is the holder's fencing number (None:
    another admitter holds the room until ``holder_until``), ``admitted`` how many fans
    it let in, ``rate`` the room's current rate, ``phase`` and ``waiting`` the room's."""

    fence: int | None
    admitted: int
    rate: float
    phase: RoomPhase
    waiting: int
    holder_until: float | None = None


@dataclass(frozen=True, slots=True)
class Ticket:
    """A fan's place in line: ``ticket`` (an opaque string to ask ``status`` with; None
    when the room turned the fan away as sold out or closed), ``position`` (fans ahead;
    None in the pre-queue, before the draw), ``eta`` (seconds until admission, estimated;
    in the pre-queue, seconds until opening) and ``state``."""

    ticket: str | None
    position: int | None
    eta: float | None
    state: RoomState


@dataclass(frozen=True, slots=True)
class Status:
    """Where a ticket stands: ``state``, ``position``, ``eta`` as for :class:`Ticket`, and
    for an admitted fan its admission ``token`` (a JWT) and when it ``expires_at``."""

    state: RoomState
    position: int | None
    eta: float | None
    token: str | None = None
    expires_at: float | None = None


@dataclass(frozen=True, slots=True)
class RoomStats:
    """A room's numbers, read without any per-fan work.

    ``joined`` fans in all; ``pre_queue`` waiting for the draw (before opening);
    ``waiting`` in line after it; ``admitted`` in all, of whom ``active`` hold live,
    unused tokens, ``used`` consumed theirs and ``expired`` let theirs lapse;
    ``told_sold_out`` were waiting when the room sold out. ``measured_rate`` is admissions
    per second over the last ~10 s. ``admitter`` is the lease holder (None: nobody),
    ``fence`` its fencing number. ``draw_seed`` (hex) and ``pre_queue_size`` let anyone
    recompute the pre-queue's order (:func:`fairq.draw.draw_order`).
    """

    name: str
    phase: RoomPhase
    opens_at: float | None
    admit_rate: float
    measured_rate: float
    token_ttl: float
    max_active: int | None
    joined: int
    pre_queue: int
    waiting: int
    admitted: int
    active: int
    used: int
    expired: int
    told_sold_out: int
    admitter: str | None
    fence: int
    draw_seed: str | None
    pre_queue_size: int | None
    drawn_at: float | None

    @property
    def sold_out(self) -> bool:
        """True once the room sold out."""
        return self.phase == "sold_out"


def refresh_interval(state: RoomState, position: int | None, eta: float | None) -> float:
    """How long a fan's page should wait before asking again, in seconds: 2 s near the
    front, up to 30 s far back (a fan 17 minutes away need not ask every second), and
    none once the answer cannot change (0.0)."""
    if state in ("admitted", "used", "expired", "sold_out", "closed"):
        return 0.0
    if eta is None:
        return 5.0
    if state == "pre_queue":
        return max(1.0, min(30.0, eta / 4))
    return max(2.0, min(30.0, eta / 10))
