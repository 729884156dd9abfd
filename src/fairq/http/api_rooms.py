"""Waiting rooms under ``/v1`` (SPEC §8): their models and handlers; the rows of the route
table are in :data:`fairq.http.api.ROUTES`.

An operator creates a room, watches it, admits fans by hand, changes the admit rate live,
sells out and closes it (scope ``admin``); a backend that knows who its fans are joins
them and asks where they stand (``send`` / ``receive``), and a gateway in another
language verifies, or burns, admission tokens (``receive``). The fans' own pages stay at
``/rooms/{room}`` (:mod:`fairq.http.rooms`, no API key).

Joining, status and tokens need the room's signing key. A room created here (or by the
library without ``secret=``) keeps a generated key in the backend, so any process can sign;
a room your app created with its own ``secret=`` is served only when the server has that
secret (``FAIRQ_ROOM_SECRETS``); else those three answer ``503 room_secret_missing``.
Everything else — stats, admitting, the rate, sold out, close, delete — needs no key and
goes straight to the backend's atomic steps, so it works on every room. With ``--workers``
the server also runs the rooms' admitters (:func:`run_admitters`), so a room made over
HTTP admits at its rate with no other process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Annotated, Any

from msgspec import UNSET, Meta, Struct, UnsetType

# the server mounts waiting rooms: without PyJWT it fails at start, naming the extra,
# instead of answering 500 at the first join
from .. import tokens as _tokens  # noqa: F401
from ..errors import FairqError, InvalidOption, RoomNotFound
from ..message import check_name
from ..waitingroom import RoomStats, Status, Ticket, WaitingRoom
from .models import MAX_INT, Key, PositiveSeconds, PrefixQuery, Query, Request
from .rooms import ANONYMOUS_PREFIX

if TYPE_CHECKING:
    from ..broker import Broker
    from .api import Call

__all__ = [
    "AdmitRequest",
    "Admitted",
    "Claims",
    "JoinRequest",
    "RateRequest",
    "RoomList",
    "RoomOptions",
    "SoldOut",
    "StatusQuery",
    "VerifyRequest",
    "run_admitters",
]

log = logging.getLogger("fairq.http")

Rate = Annotated[float, Meta(ge=0, le=1e9, description="fans admitted per second")]
#: a ticket as a room hands it out: ``<arrival number>.<MAC>.<fan id>``
TicketText = Annotated[str, Meta(min_length=1, max_length=200)]


# -- models ----------------------------------------------------------------------------------
class RoomOptions(Request, omit_defaults=True):
    """Options of ``broker.waiting_room``; a field left out keeps the room's value (a new
    room: ``admit_rate`` 500, ``token_ttl`` 600, open now, no cap on active fans)."""

    admit_rate: Rate | UnsetType = UNSET
    token_ttl: PositiveSeconds | UnsetType = UNSET
    opens_at: (
        Annotated[float, Meta(gt=0, le=1e11, description="seconds since the epoch")]
        | UnsetType
        | None
    ) = UNSET
    max_active: Annotated[int, Meta(ge=1, le=MAX_INT)] | UnsetType | None = UNSET

    def to_options(self) -> dict[str, Any]:
        return {f: v for f in self.__struct_fields__ if (v := getattr(self, f)) is not UNSET}


class JoinRequest(Request):
    """The fan to put in line, as your app knows it (a user id, say)."""

    fan: Key


class StatusQuery(Query):
    ticket: TicketText


class AdmitRequest(Request):
    """Admit the next ``n`` waiting fans at once, whatever the rate."""

    n: Annotated[int, Meta(ge=0, le=MAX_INT)]


class RateRequest(Request):
    """The admit rate, changed live for the admitter wherever it runs."""

    rate: Rate


class VerifyRequest(Request):
    """An admission token to check; ``consume`` also burns it (it works once)."""

    token: Annotated[str, Meta(min_length=1, max_length=4096)]
    consume: bool = False


class RoomList(Struct):
    rooms: list[RoomStats]


class Admitted(Struct):
    admitted: int


class SoldOut(Struct):
    """How many fans were waiting when the room sold out (each is now told so)."""

    waiting: int


class Claims(Struct):
    """A valid token's claims: room, ticket, fan, iat, exp, jti."""

    claims: dict[str, Any]


# -- handlers --------------------------------------------------------------------------------
def _name(c: Call) -> str:
    return check_name(c.path["room"], "waiting room")


async def _room(c: Call) -> WaitingRoom:
    """The handle (with the room's signing key) for the fans' operations: a room made
    with ``secret=`` needs that secret among the server's (``FAIRQ_ROOM_SECRETS``)."""
    from .errors import ApiError
    from .rooms import RoomSecretMissing, open_room

    try:
        return await open_room(c.broker, _name(c), c.state.room_secrets)
    except RoomSecretMissing as exc:
        raise ApiError(503, "room_secret_missing", str(exc)) from None


async def list_rooms(c: Call) -> RoomList:
    q: PrefixQuery = c.query
    out = []
    for name in await c.broker.list_rooms(q.prefix):
        try:
            out.append(await c.broker.backend.room_stats(name))
        except RoomNotFound:  # deleted meanwhile
            continue
    return RoomList(out)


async def declare_room(c: Call) -> RoomStats:
    options: RoomOptions = c.body
    room = await c.broker.waiting_room(_name(c), **options.to_options())
    return await room.stats()


async def get_room(c: Call) -> RoomStats:
    return await c.broker.backend.room_stats(_name(c))


async def delete_room(c: Call) -> None:
    name = _name(c)
    if not await c.broker.delete_room(name):
        raise RoomNotFound(name)


async def join(c: Call) -> Ticket:
    body: JoinRequest = c.body
    if body.fan.startswith(ANONYMOUS_PREFIX):
        raise InvalidOption(
            f"fan ids beginning with {ANONYMOUS_PREFIX!r} are reserved for the anonymous "
            "visitors of the public waiting-room pages"
        )
    return await (await _room(c)).join(body.fan)


async def status(c: Call) -> Status:
    q: StatusQuery = c.query
    return await (await _room(c)).status(q.ticket)


async def verify(c: Call) -> Claims:
    body: VerifyRequest = c.body
    room = await _room(c)
    claims = await room.consume(body.token) if body.consume else room.verify(body.token)
    return Claims(claims)


async def admit(c: Call) -> Admitted:
    body: AdmitRequest = c.body
    return Admitted(await c.broker.backend.room_admit(_name(c), body.n))


async def set_rate(c: Call) -> RoomStats:
    body: RateRequest = c.body
    name = _name(c)
    await c.broker.backend.room_set_rate(name, float(body.rate))
    return await c.broker.backend.room_stats(name)


async def sold_out(c: Call) -> SoldOut:
    return SoldOut(await c.broker.backend.room_sold_out(_name(c)))


async def close(c: Call) -> RoomStats:
    name = _name(c)
    await c.broker.backend.room_close(name)
    return await c.broker.backend.room_stats(name)


# -- the admitters of `fairq serve --workers` ---------------------------------------------------
async def run_admitters(broker: Broker, rescan: float = 5.0) -> None:
    """Run :meth:`WaitingRoom.run_admitter` for every room that is not sold out or closed,
    looking for new rooms every ``rescan`` seconds, until cancelled. Every process may run
    this: one admitter per room holds its lease and admits, the others stand by. A room
    made with a ``secret=`` the server does not know is left to its own processes."""
    running: dict[str, asyncio.Task[None]] = {}
    try:
        while True:
            try:
                for name in await broker.list_rooms():
                    task = running.get(name)
                    if task is not None and not task.done():
                        continue
                    if (await broker.backend.room_stats(name)).phase in ("sold_out", "closed"):
                        continue
                    try:
                        room = await broker.room(name)
                    except InvalidOption:  # signs with its creator's secret
                        continue
                    running[name] = asyncio.create_task(
                        room.run_admitter(), name=f"fairq-admitter:{name}"
                    )
            except FairqError as exc:  # a room deleted meanwhile, a failing engine
                log.warning("looking for waiting rooms to admit failed: %s", exc)
            await asyncio.sleep(rescan)
    finally:
        for task in running.values():
            task.cancel()
        for task in running.values():
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
