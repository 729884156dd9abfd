"""A waiting room on a ``fairq serve`` server: :class:`RemoteRoom`, with the method names
of :class:`fairq.WaitingRoom` over ``/v1/rooms/{room}`` (get one from
:meth:`fairq.http.Client.waiting_room` or :meth:`~fairq.http.Client.room`).

Answers come back as the library's own types (``Ticket``, ``Status``, ``RoomStats``) and
errors as the same exceptions (``RoomNotFound``, ``InvalidTicket``, ``InvalidToken`` ...).
``verify`` is a call to the server here; a gateway that must not depend on it verifies
offline with the room's public key (:meth:`RemoteRoom.jwks`). The admitter itself
(``run_admitter``) runs next to the backend, in the library or ``fairq serve --workers``.
"""

from __future__ import annotations

from typing import Any

from ..message import check_key
from ..waitingroom import RoomPhase, RoomStats, Status, Ticket
from .remote import _RemoteHandle, dataclass_from

__all__ = ["RemoteRoom"]


class RemoteRoom(_RemoteHandle):
    """A waiting room on a server; the methods of :class:`fairq.WaitingRoom`."""

    __slots__ = ()

    @property
    def _path(self) -> str:
        return f"/v1/rooms/{self.name}"

    async def join(self, fan_id: str) -> Ticket:
        """Put a fan in line; joining again with the same fan id keeps the first ticket."""
        check_key(fan_id, "fan id")  # InvalidName, as in-process
        data = await self._client.request("POST", f"{self._path}/join", {"fan": fan_id})
        ticket: Ticket = dataclass_from(Ticket, data)
        return ticket

    async def status(self, ticket: str) -> Status:
        """Where ``ticket`` stands; an admitted fan's status carries its token."""
        data = await self._client.request("GET", f"{self._path}/status", params={"ticket": ticket})
        status: Status = dataclass_from(Status, data)
        return status

    async def verify(self, token: str) -> dict[str, Any]:
        """The claims of a valid admission token of this room (``fairq.InvalidToken`` if
        not), checked by the server."""
        data = await self._client.request("POST", f"{self._path}/verify", {"token": token})
        return dict(data["claims"])

    async def consume(self, token: str) -> dict[str, Any]:
        """Verify ``token`` and burn it: accepted once, then ``fairq.InvalidToken``."""
        data = await self._client.request(
            "POST", f"{self._path}/verify", {"token": token, "consume": True}
        )
        return dict(data["claims"])

    async def jwks(self) -> dict[str, Any]:
        """The JWKS document with the room's public key (for offline verification)."""
        data: dict[str, Any] = await self._client.request("GET", f"/rooms/{self.name}/jwks.json")
        return data

    async def admit(self, n: int) -> int:
        """Admit the next ``n`` fans at once, whatever the rate; how many were admitted."""
        data = await self._client.request("POST", f"{self._path}/admit", {"n": n})
        return int(data["admitted"])

    async def set_rate(self, rate: float) -> None:
        """Change the admit rate live, for the admitter wherever it runs."""
        await self._client.request("PUT", f"{self._path}/rate", {"rate": rate})

    async def sold_out(self) -> int:
        """Mark the room sold out; how many fans were waiting."""
        data = await self._client.request("POST", f"{self._path}/sold-out")
        return int(data["waiting"])

    async def close(self) -> None:
        """End the sale: the room answers ``closed``."""
        await self._client.request("POST", f"{self._path}/close")

    async def stats(self) -> RoomStats:
        """The room's numbers."""
        data = await self._client.request("GET", self._path)
        stats: RoomStats = dataclass_from(RoomStats, data)
        return stats

    async def phase(self) -> RoomPhase:
        """``scheduled``, ``open``, ``sold_out`` or ``closed``."""
        return (await self.stats()).phase
