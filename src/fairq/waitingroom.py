"""The virtual waiting room of a flash sale (SPEC §8): a fair line in front of a purchase.

At 10:00 two million fans arrive for 60,000 seats, and the inventory can reserve about
1,100 seats a second. A waiting room gives each arriving fan a place in line instead of
the purchase page, lets fans in at a controlled rate, hands each admitted fan a signed,
short-lived admission token that the gateway demands on purchase calls, and tells
everyone still waiting "sold out" the moment the seats are gone — cheaply, without
touching anything per fan::

    room = await broker.waiting_room("ev-88", admit_rate=500, token_ttl=600,
                                     opens_at=ten_oclock, secret=app_secret)
    t = await room.join("fan-123")          # Ticket(ticket, position, eta, state)
    st = await room.status(t.ticket)        # Status(state, position, eta, token)
    asyncio.create_task(room.run_admitter())  # one admitter per room, across processes
    claims = room.verify(token)             # at the gateway; fairq.InvalidToken if not
    claims = await room.consume(token)      # the purchase call: the token works once
    await room.sold_out()

How it is kept cheap and fair:

* **Places are numbers.** A fan's arrival number is a server-assigned sequence. Fans who
  join before ``opens_at`` wait in a *pre-queue*; at the first operation after opening
  (in whichever process) one random seed is drawn and their places become a seeded
  random permutation of their arrival numbers (:mod:`fairq.draw`; auditable from
  :attr:`RoomStats.draw_seed`); everyone after opening is FIFO behind them. Admission
  moves one cursor, so a fan's position is its place minus the cursor: status costs no
  count of the fans ahead and no lookup of the fan (the ticket carries the arrival number
  under a MAC, :mod:`fairq.tokens`) — O(1) with two million waiting.
* **One admitter.** :meth:`WaitingRoom.run_admitter` holds the room's admitter lease
  (fencing: each new holder gets a higher ``fence``, and an admission step is refused to
  anyone but the current holder). It admits smoothly: the backend keeps the admission
  credit (``rate`` × elapsed time), so every ~50 ms step lets in what is due, whichever
  process runs it. :meth:`set_rate` changes the rate live; :class:`AdaptiveRate` changes it
  from the inventory's health (p99 latency, error rate).
* **Capacity that frees itself.** With ``max_active`` set, at most that many admitted
  fans hold live tokens at once; a token that is used (:meth:`consume`) or lapses after
  ``token_ttl`` frees its slot for the next fan in line.
* **Sold out is one flag.** Every status call and join after :meth:`sold_out` answers
  ``sold_out`` before anything per fan is read.

States of a fan: ``pre_queue`` (joined before opening; no position until the draw),
``waiting``, ``admitted`` (with a token), ``used`` (its token was consumed), ``expired``
(admitted, token never used within ``token_ttl``), ``sold_out``, ``closed``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from .adaptive import AdaptiveRate, Health, HealthMeter
from .errors import BackendError, ConfigConflict, ConnectionError, InvalidOption, InvalidToken
from .message import check_key, check_name, check_number
from .model.rooms import (
    ROOM_STATES,
    Place,
    RoomConfig,
    RoomPhase,
    RoomRecord,
    RoomState,
    RoomStats,
    Status,
    Ticket,
    TickResult,
    refresh_interval,
)

if TYPE_CHECKING:
    from .backends.base import Backend
    from .tokens import RoomKeys

__all__ = [
    "ROOM_STATES",
    "AdaptiveRate",
    "Health",
    "HealthMeter",
    "Place",
    "RoomConfig",
    "RoomPhase",
    "RoomRecord",
    "RoomState",
    "RoomStats",
    "Status",
    "TickResult",
    "Ticket",
    "WaitingRoom",
    "refresh_interval",
]

log = logging.getLogger("fairq.waitingroom")


DEFAULT_TICK = 0.05  # seconds between admission steps of the admitter
DEFAULT_LEASE = 3.0  # seconds the admitter lease lasts unless renewed


# -- the handle ------------------------------------------------------------------------------
class WaitingRoom:
    """A handle to one waiting room; get it from ``await broker.waiting_room(...)`` (create
    or update) or ``await broker.room(name)`` (an existing one). See the module docstring."""

    def __init__(self, backend: Backend, record: RoomRecord, keys: RoomKeys) -> None:
        self.backend = backend
        self.name = record.name
        self.record = record
        self.keys = keys

    def __repr__(self) -> str:
        return f"WaitingRoom({self.name!r})"

    @property
    def kid(self) -> str:
        """The key id (JWT header ``kid``) of this room's tokens."""
        return self.keys.kid

    def jwks(self) -> dict[str, Any]:
        """The JWKS document publishing the room's public key (for offline verification)."""
        return self.keys.jwks()

    def _eta(self, place: Place, now: float) -> float | None:
        if place.state == "pre_queue":
            return None if place.opens_at is None else max(0.0, place.opens_at - now)
        if place.state != "waiting" or place.position is None:
            return 0.0 if place.state == "admitted" else None
        if place.rate <= 0:
            return None
        return place.position / place.rate

    def _ticket(self, fan: str, place: Place, now: float) -> Ticket:
        ticket = None if place.seq is None else self.keys.ticket(place.seq, fan)
        return Ticket(ticket, place.position, self._eta(place, now), place.state)

    # -- fans ------------------------------------------------------------------------------
    async def join(self, fan_id: str) -> Ticket:
        """Put a fan in line and return its :class:`Ticket`; joining again with the same
        fan id gives back the first ticket and place. After ``sold_out`` (or ``close``)
        the answer is that state, and nothing is stored."""
        fan = check_key(fan_id, "fan id")
        (place,) = await self.backend.room_join(self.name, [fan])
        return self._ticket(fan, place, self.backend.clock.now())

    async def join_many(self, fan_ids: Iterable[str]) -> list[Ticket]:
        """Join many fans in one atomic step (in the order given); one ticket each."""
        fans = [check_key(f, "fan id") for f in fan_ids]
        if not fans:
            return []
        places = await self.backend.room_join(self.name, fans)
        now = self.backend.clock.now()
        return [self._ticket(f, p, now) for f, p in zip(fans, places, strict=True)]

    async def status(self, ticket: str) -> Status:
        """Where ``ticket`` stands (``fairq.InvalidTicket`` if this room never issued it);
        an admitted fan's status carries its admission token."""
        seq, fan = self.keys.parse_ticket(ticket)
        place = await self.backend.room_status(self.name, seq)
        token = None
        if place.state == "admitted":
            assert place.admitted_at is not None and place.expires_at is not None
            token = self.keys.sign(seq, fan, place.admitted_at, place.expires_at)
        now = self.backend.clock.now()
        return Status(place.state, place.position, self._eta(place, now), token, place.expires_at)

    # -- tokens ----------------------------------------------------------------------------
    def verify(self, token: str | bytes) -> dict[str, Any]:
        """The claims of a valid admission token of this room (room, ticket, fan, iat,
        exp, jti); ``fairq.InvalidToken`` if it is forged, altered, signed with another
        key, another room's, or expired. Needs no backend call."""
        claims, _ = self.keys.verify(token, self.backend.clock.now())
        return claims

    async def consume(self, token: str | bytes) -> dict[str, Any]:
        """Verify ``token`` and burn it: it is accepted once (for the purchase call), then
        ``fairq.InvalidToken``. Consuming ends the fan's admission and frees its slot of
        ``max_active``."""
        claims, seq = self.keys.verify(token, self.backend.clock.now())
        outcome = await self.backend.room_consume(self.name, seq)
        if outcome == "used":
            raise InvalidToken("the admission token was already used")
        if outcome == "expired":
            raise InvalidToken("the admission token has expired")
        if outcome != "ok":
            raise InvalidToken(f"the admission token cannot be used ({outcome})")
        return claims

    # -- admission -------------------------------------------------------------------------
    async def admit(self, n: int) -> int:
        """Admit the next ``n`` fans at once, whatever the rate and ``max_active`` (an
        operator's lever: the active count may stand above the cap until tokens are used or
        expire); return how many were admitted. Nothing before the room opens."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise InvalidOption(f"n must be an integer >= 0, got {n!r}")
        return await self.backend.room_admit(self.name, n)

    async def set_rate(self, rate: float) -> None:
        """Change the admit rate (fans per second) live, for every process: the running
        admitter, wherever it is, admits at the new rate from its next step."""
        await self.backend.room_set_rate(self.name, check_number("rate", rate))

    async def run_admitter(
        self,
        *,
        adaptive: AdaptiveRate | None = None,
        tick: float = DEFAULT_TICK,
        lease: float = DEFAULT_LEASE,
        holder: str | None = None,
        until_done: bool = True,
    ) -> None:
        """Admit fans at the room's rate until cancelled (or, with ``until_done``, until the
        room sells out or closes).

        Run it in every process that may admit: exactly one holds the room's admitter
        lease at a time and admits, the others stand by and take over within ``lease``
        seconds if it dies. Each step (every ``tick`` seconds) renews the lease and lets in
        what the rate allows since the last step, so admission is smooth, and exact over
        time. With ``adaptive``, the holder also adjusts the rate from a health signal. A
        step that fails (an engine error, or the engine out of reach: a restart, a dropped
        connection) is logged and retried every second at most, so admission goes on once
        the engine is back; a deleted room ends the admitter (``RoomNotFound``).
        """
        tick = check_number("tick", tick, strict=True)
        lease = check_number("lease", lease, strict=True)
        if lease <= tick * 2:
            raise InvalidOption("lease must be more than twice tick")
        holder = holder or f"admitter-{secrets.token_hex(8)}"
        loop = asyncio.get_running_loop()
        ceiling: float | None = None
        next_adapt = 0.0
        fence: int | None = None
        try:
            while True:
                try:
                    result = await self.backend.room_tick(self.name, holder, lease)
                except (BackendError, ConnectionError) as exc:
                    task = asyncio.current_task()
                    if task is not None and task.cancelling():
                        raise asyncio.CancelledError() from exc  # a step cut short by a cancel
                    # a busy, failing or unreachable engine: the lease may lapse, and another
                    # admitter take over; this one tries again
                    log.warning("room %s: admission step failed: %s", self.name, exc)
                    await asyncio.sleep(min(lease / 3, 1.0))
                    continue
                if result.fence != fence:
                    if result.fence is not None:
                        log.info(
                            "%s now admits for room %s (fence %d)", holder, self.name, result.fence
                        )
                    fence = result.fence
                if until_done and result.phase in ("sold_out", "closed"):
                    return
                if result.fence is None:
                    # another admitter holds the room: stand by until its lease may end
                    now = self.backend.clock.now()
                    wait = lease / 3
                    if result.holder_until is not None:
                        wait = min(wait, max(tick, result.holder_until - now + tick))
                    await asyncio.sleep(wait)
                    continue
                if adaptive is not None and loop.time() >= next_adapt:
                    next_adapt = loop.time() + adaptive.interval
                    if ceiling is None:
                        ceiling = result.rate
                    try:
                        health = await adaptive.read()
                    except Exception:
                        log.warning("room %s: the health signal failed", self.name, exc_info=True)
                    else:
                        rate = adaptive.next_rate(result.rate, health, ceiling)
                        if rate != result.rate:
                            log.info(
                                "room %s: admit rate %.1f -> %.1f (%s)",
                                self.name,
                                result.rate,
                                rate,
                                health,
                            )
                            try:
                                await self.set_rate(rate)
                            except (BackendError, ConnectionError) as exc:
                                log.warning("room %s: could not set the rate: %s", self.name, exc)
                await asyncio.sleep(tick)
        finally:
            with contextlib.suppress(Exception):
                # hand the room over at once instead of when the lease runs out
                await asyncio.shield(self.backend.room_release_admitter(self.name, holder))

    # -- the sale --------------------------------------------------------------------------
    async def sold_out(self) -> int:
        """Mark the room sold out: every status call and every later join answers
        ``sold_out``, without per-fan work. Returns how many fans were waiting."""
        return await self.backend.room_sold_out(self.name)

    async def close(self) -> None:
        """End the sale: the room answers ``closed`` and ``RequireAdmission`` stops
        guarding its paths."""
        await self.backend.room_close(self.name)

    async def stats(self) -> RoomStats:
        """The room's numbers (:class:`RoomStats`)."""
        return await self.backend.room_stats(self.name)

    async def phase(self) -> RoomPhase:
        """``scheduled`` (before opening), ``open``, ``sold_out`` or ``closed``."""
        return (await self.backend.room_record(self.name)).phase


# -- opening a room --------------------------------------------------------------------------
def _keys(name: str, record: RoomRecord, secret: bytes | None) -> RoomKeys:
    from .tokens import RoomKeys

    if secret is not None:
        keys = RoomKeys(name, secret, record.created_at)
        if keys.kid != record.kid:
            raise ConfigConflict(
                f"this secret is not the one waiting room {name!r} signs with (its key id is "
                f"{record.kid}); pass the same secret in every process"
            )
        return keys
    if record.key_seed is None:
        raise InvalidOption(
            f"waiting room {name!r} signs with a secret its creator passed: pass the same "
            "secret= here"
        )
    return RoomKeys(name, record.key_seed, record.created_at)


def _check_secret(secret: object) -> bytes | None:
    from .tokens import SECRET_BYTES

    if secret is None:
        return None
    if isinstance(secret, str):
        secret = secret.encode()
    if not isinstance(secret, bytes | bytearray) or len(secret) != SECRET_BYTES:
        raise InvalidOption(f"secret must be {SECRET_BYTES} bytes (secrets.token_bytes(32))")
    return bytes(secret)


async def declare_room(
    backend: Backend, name: str, options: Mapping[str, Any], secret: object
) -> WaitingRoom:
    """Create the room or update the options given (see ``Broker.waiting_room``)."""
    from .tokens import RoomKeys, new_root_secret

    check_name(name, "waiting room")
    key = _check_secret(secret)
    config = RoomConfig(**{**RoomConfig().to_dict(), **options}).validated()
    given = {k: getattr(config, k) for k in options}
    seed = new_root_secret()
    record = await backend.declare_room(
        name,
        given,
        RoomKeys.kid_of(name, key) if key is not None else None,
        seed,
        RoomKeys.kid_of(name, seed),
    )
    return WaitingRoom(backend, record, _keys(name, record, key))


async def open_room(backend: Backend, name: str, secret: object) -> WaitingRoom:
    """A handle to an existing room (``RoomNotFound`` otherwise)."""
    check_name(name, "waiting room")
    key = _check_secret(secret)
    record = await backend.room_record(name)
    return WaitingRoom(backend, record, _keys(name, record, key))
