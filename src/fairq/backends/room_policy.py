"""The waiting-room rules of SPEC §8 as pure functions on a room's row of numbers, applied
the same way by every backend inside its atomic step; only the storage differs.

A room is one row (:class:`RoomRow`) plus three small indexes a backend keeps:

* fans: fan id → arrival number ``seq`` (1, 2, 3, ...), for "one ticket per fan";
* admission steps: ``upto`` (the cursor after the step) → (time, token expiry);
* used tokens: ``seq`` → the fan's place.

Places. Fans ``1..pre_queue`` joined before opening; their places are the seeded random
permutation of :mod:`fairq.draw`; later fans keep ``place = seq``. Places are therefore
dense, ``1..joined``, and admission is a cursor: fans at places ``1..head`` are admitted,
a waiting fan has ``place - head - 1`` fans ahead. Nothing is ever counted fan by fan.

Capacity. Admission steps expire in order; ``expired_upto`` is the cursor of the last
step whose tokens have all lapsed, ``used_live`` counts used tokens after it, so the
admitted fans holding live tokens are ``head - expired_upto - used_live``.
"""

from __future__ import annotations

import math
import operator
import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields

from ..draw import draw_position
from ..model.rooms import Place, RoomConfig, RoomPhase, RoomState, RoomStats, TickResult

__all__ = [
    "RATE_WINDOW",
    "RoomRow",
    "admission_allowance",
    "check_options",
    "consume",
    "draw_if_due",
    "expire",
    "measured_rate",
    "note_admitted",
    "phase",
    "place",
    "place_of",
    "release_admitter",
    "sold_out",
    "stats",
    "take_admitter",
    "tick_result",
    "waiting",
]

#: seconds over which the measured admit rate is averaged (exponentially)
RATE_WINDOW = 10.0
#: the admission credit never exceeds one second of the rate: an admitter that was
#: stalled catches up on at most a second, it does not burst
_MAX_CREDIT_SECONDS = 1.0


@dataclass(slots=True)
class RoomRow:
    """Everything a backend stores about a room, apart from its three indexes."""

    id: int
    name: str
    config: RoomConfig
    rate: float
    kid: str
    key_seed: bytes | None
    created_at: float
    joined: int = 0
    drawn_at: float | None = None
    pre_queue: int = 0
    draw_seed: bytes | None = None
    head: int = 0
    expired_upto: int = 0
    used: int = 0
    used_live: int = 0
    credit: float = 0.0
    credit_at: float | None = None
    meas_sum: float = 0.0
    meas_at: float | None = None
    meas_since: float | None = None
    admitter: str | None = None
    admitter_until: float = 0.0
    fence: int = 0
    sold_out_at: float | None = None
    told_sold_out: int = 0
    closed_at: float | None = None

    def snapshot(self) -> tuple[object, ...]:
        """The stored values, to tell whether an operation changed anything."""
        values: tuple[object, ...] = _ALL_FIELDS(self)
        return values


#: the columns of a stored row, in :class:`RoomRow` order (``config`` as JSON)
ROW_FIELDS = tuple(f.name for f in fields(RoomRow))
_ALL_FIELDS = operator.attrgetter(*ROW_FIELDS)


def phase(row: RoomRow) -> RoomPhase:
    """``closed``, ``sold_out``, ``scheduled`` (not drawn yet) or ``open``."""
    if row.closed_at is not None:
        return "closed"
    if row.sold_out_at is not None:
        return "sold_out"
    if row.drawn_at is None:
        return "scheduled"
    return "open"


def draw_if_due(row: RoomRow, now: float) -> bool:
    """SPEC §8 rule 3: at the first operation once the room is open, freeze the pre-queue
    and draw its order (one CSPRNG seed). True if it drew now."""
    if row.drawn_at is not None:
        return False
    opens_at = row.config.opens_at
    if opens_at is not None and now < opens_at:
        return False
    row.drawn_at = now
    row.pre_queue = row.joined
    row.draw_seed = secrets.token_bytes(32) if row.joined > 1 else None
    row.credit, row.credit_at = 0.0, now
    return True


def place_of(row: RoomRow, seq: int) -> int:
    """The place (1-based) in line of the fan who arrived ``seq``-th (after the draw)."""
    if seq <= row.pre_queue and row.draw_seed is not None:
        return draw_position(row.draw_seed, row.pre_queue, seq - 1) + 1
    return seq


def waiting(row: RoomRow) -> int:
    """Fans in line not yet admitted (0 before the draw: they are in the pre-queue; 0 once
    the room sold out or closed: those still in line were told so, ``told_sold_out``)."""
    if row.drawn_at is None or row.sold_out_at is not None or row.closed_at is not None:
        return 0
    return row.joined - row.head


def _decayed(row: RoomRow, now: float) -> float:
    if row.meas_at is None:
        return 0.0
    return row.meas_sum * math.exp(-max(0.0, now - row.meas_at) / RATE_WINDOW)


def measured_rate(row: RoomRow, now: float) -> float:
    """Admissions per second, exponentially averaged over ~``RATE_WINDOW`` seconds (and
    corrected while the measurement is younger than that)."""
    if row.meas_since is None:
        return 0.0
    span = max(now - row.meas_since, 1e-3)
    return _decayed(row, now) / (RATE_WINDOW * -math.expm1(-span / RATE_WINDOW))


def eta_rate(row: RoomRow, now: float) -> float:
    """The rate a fan's ETA is estimated with: measured, else the configured one."""
    measured = measured_rate(row, now)
    return measured if measured > 1e-6 else row.rate


def note_admitted(row: RoomRow, n: int, now: float) -> None:
    """Move the cursor past ``n`` more fans and count them in the measured rate."""
    if n <= 0:
        return
    if row.meas_since is None:
        # the first step's fans were earned over the time before it, not in an instant
        row.meas_since = now - (min(1.0, n / row.rate) if row.rate > 0 else 0.0)
    row.meas_sum = _decayed(row, now) + n
    row.meas_at = now
    row.head += n


def active(row: RoomRow) -> int:
    """Admitted fans holding live, unused tokens (as of the last :func:`expire`)."""
    return row.head - row.expired_upto - row.used_live


def expire(
    row: RoomRow,
    now: float,
    steps_after: Callable[[int], Iterable[tuple[int, float]]],
    used_between: Callable[[int, int], int],
) -> None:
    """Advance ``expired_upto`` over admission steps whose tokens have lapsed.

    ``steps_after(cursor)`` yields ``(upto, expires_at)`` of the steps after ``cursor`` in
    order; ``used_between(a, b)`` counts used tokens at places ``a < place <= b``.
    """
    if row.expired_upto >= row.head:
        return
    upto = row.expired_upto
    for step_upto, expires_at in steps_after(upto):
        if expires_at > now:
            break
        upto = step_upto
    if upto > row.expired_upto:
        row.used_live -= used_between(row.expired_upto, upto)
        row.expired_upto = upto


def take_admitter(row: RoomRow, holder: str, lease: float, now: float) -> bool:
    """Take or renew the admitter lease for ``holder``; False if another holds it. A new
    holder gets the next fence and starts without credit (no burst after a take-over)."""
    if row.admitter is not None and row.admitter != holder and row.admitter_until > now:
        return False
    if row.admitter != holder:
        row.admitter = holder
        row.fence += 1
        row.credit, row.credit_at = 0.0, now
    row.admitter_until = now + lease
    return True


def release_admitter(row: RoomRow, holder: str) -> bool:
    """Give the lease up (so a stand-by admitter takes over at once)."""
    if row.admitter != holder:
        return False
    row.admitter = None
    row.admitter_until = 0.0
    return True


def admission_allowance(row: RoomRow, now: float) -> int:
    """How many fans the admitter lets in at this step: the credit earned at ``rate``
    since the last step (at most one second's worth), limited by who is waiting and by
    ``max_active``. The credit not used for lack of fans or capacity is not banked."""
    if phase(row) != "open":
        row.credit, row.credit_at = 0.0, now
        return 0
    last = row.credit_at if row.credit_at is not None else now
    cap = max(1.0, row.rate * _MAX_CREDIT_SECONDS)
    credit = min(cap, row.credit + row.rate * max(0.0, now - last))
    row.credit_at = now
    due = int(credit + 1e-9)  # 24.999999999 of float sums is 25
    allowed = min(due, waiting(row))
    if row.config.max_active is not None:
        allowed = min(allowed, max(0, row.config.max_active - active(row)))
    credit = max(0.0, credit - allowed)
    if allowed < due:
        credit = min(credit, 1.0)
    row.credit = credit
    return allowed


def tick_result(row: RoomRow, held: bool, admitted: int, now: float) -> TickResult:
    """The answer of an admission step."""
    return TickResult(
        row.fence if held else None,
        admitted,
        row.rate,
        phase(row),
        waiting(row),
        None if held else row.admitter_until,
    )


def place(
    row: RoomRow,
    seq: int,
    now: float,
    step_of: Callable[[int], tuple[float, float]],
    is_used: Callable[[int], bool],
) -> Place:
    """Where the fan who arrived ``seq``-th stands. ``step_of(place)`` gives (admitted at,
    expires at) of the admission step that let that place in; ``is_used(seq)`` whether
    its token was consumed. Neither is called unless the fan was admitted, and nothing
    per fan is looked at once the room sold out or closed."""
    ph = phase(row)
    rate = eta_rate(row, now)
    opens_at = row.config.opens_at
    if ph in ("sold_out", "closed"):
        return Place(ph, None, None, rate, opens_at)
    if ph == "scheduled":
        return Place("pre_queue", seq, None, rate, opens_at)
    where = place_of(row, seq)
    if where > row.head:
        return Place("waiting", seq, where - row.head - 1, rate, opens_at)
    admitted_at, expires_at = step_of(where)
    state: RoomState
    if is_used(seq):
        state = "used"
    elif now >= expires_at:
        state = "expired"
    else:
        state = "admitted"
    return Place(state, seq, 0, rate, opens_at, admitted_at, expires_at)


def sold_out(row: RoomRow, now: float) -> int:
    """Raise the room's sold-out flag (once); return how many fans were waiting."""
    if row.sold_out_at is None and row.closed_at is None:
        row.sold_out_at = now
        row.told_sold_out = row.joined - row.head
    return row.told_sold_out


def stats(row: RoomRow, now: float) -> RoomStats:
    """The room's numbers, from its row alone."""
    holder = row.admitter if row.admitter is not None and row.admitter_until > now else None
    drawn = row.drawn_at is not None
    return RoomStats(
        name=row.name,
        phase=phase(row),
        opens_at=row.config.opens_at,
        admit_rate=row.rate,
        measured_rate=measured_rate(row, now),
        token_ttl=row.config.token_ttl,
        max_active=row.config.max_active,
        joined=row.joined,
        pre_queue=0 if drawn else row.joined,
        waiting=waiting(row),
        admitted=row.head,
        active=active(row),
        used=row.used,
        expired=row.expired_upto - (row.used - row.used_live),
        told_sold_out=row.told_sold_out,
        admitter=holder,
        fence=row.fence,
        draw_seed=None if row.draw_seed is None else row.draw_seed.hex(),
        pre_queue_size=row.pre_queue if drawn else None,
        drawn_at=row.drawn_at,
    )


def consume(
    row: RoomRow,
    seq: int,
    now: float,
    step_of: Callable[[int], tuple[float, float]],
    mark_used: Callable[[int, int], bool],
) -> str:
    """Burn the token of the fan who arrived ``seq``-th: ``ok``, or why not (``used``,
    ``expired``, ``not_admitted``). ``mark_used(seq, place)`` records the use and is False
    if it was already recorded."""
    if row.drawn_at is None or not 1 <= seq <= row.joined:
        return "not_admitted"
    where = place_of(row, seq)
    if where > row.head:
        return "not_admitted"
    _, expires_at = step_of(where)
    if now >= expires_at:
        return "expired"
    if not mark_used(seq, where):
        return "used"
    row.used += 1
    if where > row.expired_upto:
        row.used_live += 1
    return "ok"


def other_key(name: str, kid: str) -> str:
    """The ``ConfigConflict`` text for a process whose secret is not the room's."""
    return (
        f"this secret is not the one waiting room {name!r} signs with (its key id is {kid}); "
        "pass the same secret in every process"
    )


def check_options(
    row: RoomRow, options: dict[str, object], secret_kid: str | None = None
) -> RoomConfig:
    """The room's config with ``options`` applied; ``opens_at`` cannot move once the room
    has opened (the pre-queue was drawn), and a process that passes a secret must pass
    the room's (``secret_kid``): a room's key never changes, or its waiting fans' tickets
    and its admitted fans' tokens would all be refused."""
    from ..errors import ConfigConflict

    if secret_kid is not None and secret_kid != row.kid:
        raise ConfigConflict(other_key(row.name, row.kid))

    config = RoomConfig(**{**row.config.to_dict(), **options}).validated()
    if (
        "opens_at" in options
        and row.drawn_at is not None
        and config.opens_at != row.config.opens_at
    ):
        raise ConfigConflict(
            f"waiting room {row.name!r} has opened (its pre-queue was drawn): opens_at "
            "cannot change any more"
        )
    return config
