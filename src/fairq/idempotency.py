"""Idempotent consumers and version gates (SPEC §7): the handles and their records.

At-least-once delivery makes every consumer see duplicates (a lease that ran out, a
crash before the ack, a producer that sent twice). The seed's answer is a key written
with a uniqueness guarantee — a ``UNIQUE`` insert, Redis ``SET NX`` — so that the first
writer wins and does the work while every later one stops without side effects.

    store = broker.idempotency("pdf-worker", ttl=86_400)
    claim = await store.claim(order_id, lease=60.0)   # None: someone holds or finished it
    if claim is not None:
        try:
            pdf = await make_pdf(order_id)
        except BaseException:
            await claim.release()                      # the retry may run again
            raise
        await claim.complete(result={"pdf": pdf})      # kept, and never re-run, for ttl

    async with store.once(order_id) as first:          # the same, as a context manager
        if first:
            await make_pdf(order_id)

    gate = broker.versions("user-birthdate")
    if await gate.advance(user_id, version):           # True only for a newer version
        await save_birthdate(user_id, birthdate)

A claim is a *lease*: its holder has ``lease`` seconds to complete or release it (and may
extend it); after that it expires and another claimer can take the key, so a crashed
holder never blocks a key for ever. A completed key keeps its result for the store's
``ttl`` and every claim of it returns None until then. Each operation is one atomic step
at the backend (see :mod:`fairq.backends.base`), so of N concurrent claimers — tasks,
threads, processes, machines — exactly one gets the claim.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import secrets
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Self

from .errors import InvalidOption, LeaseLost
from .message import Received, check_key, check_name
from .model.idempotency import (
    DEFAULT_LEASE,
    IdempotencyRecord,
    Version,
    check_version,
    decode_result,
    encode_result,
    holder_token,
)

if TYPE_CHECKING:
    from .backends.base import Backend

__all__ = [
    "DEFAULT_LEASE",
    "Claim",
    "ClaimLost",
    "IdempotencyRecord",
    "IdempotencyStore",
    "IdempotentBy",
    "InboxClaim",
    "KeptAlive",
    "KeyFunction",
    "Version",
    "VersionGate",
    "check_version",
    "decode_result",
    "encode_result",
]

log = logging.getLogger("fairq.idempotency")


def _seconds(name: str, value: object) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise InvalidOption(f"{name} must be a finite number of seconds > 0, got {value!r}")
    return float(value)


class ClaimLost(LeaseLost):
    """The claim is no longer its holder's: its lease ran out and another claimer took
    the key (or the claim was already completed or released). Nothing was changed."""

    def __init__(self, key: str, detail: str = "") -> None:
        # not LeaseLost's message, which speaks of message receipts
        Exception.__init__(
            self,
            detail
            or (
                f"the claim of idempotency key {key!r} is lost: its lease ran out and "
                "another claimer took the key"
            ),
        )
        self.lost = [key]
        self.key = key


class KeptAlive:
    """Keeping a claim alive while its work runs, for :class:`Claim` and the HTTP client's
    ``RemoteClaim``: a class with ``key``, ``lease``, ``settled``, ``extend()`` and a
    ``_keeper`` slot."""

    __slots__ = ("_keeper",)
    key: str
    lease: float
    _keeper: _KeepAlive | None

    @property
    def settled(self) -> bool:  # pragma: no cover - each claim class has its own
        raise NotImplementedError

    async def extend(self, lease: float | None = None) -> None:  # pragma: no cover
        raise NotImplementedError

    async def complete(self, result: object = None) -> None:  # pragma: no cover
        raise NotImplementedError

    async def release(self) -> bool:  # pragma: no cover
        raise NotImplementedError

    @contextlib.asynccontextmanager
    async def working(self) -> AsyncIterator[None]:
        """The block of ``store.once``: the claim is kept alive while it runs; its normal
        end completes the claim, an exception releases it (even when the block is
        cancelled) and propagates, so a retry can run."""
        async with self.kept_alive():
            try:
                yield
            except BaseException:
                await asyncio.shield(self.release())
                raise
            await self.complete()

    def keep_alive(self) -> None:
        """Extend the claim every third of its lease from now until it is completed or
        released (or :meth:`stop_keeping`), so a live holder keeps it however long the work
        takes while a crashed one stops extending and loses it. A failed extension is
        logged. Needs a running event loop."""
        if self._keeper is None and not self.settled:
            self._keeper = _KeepAlive(self)

    def stop_keeping(self) -> None:
        """Stop the extensions started by :meth:`keep_alive`."""
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            keeper.stop()

    @contextlib.asynccontextmanager
    async def kept_alive(self) -> AsyncIterator[Self]:
        """:meth:`keep_alive` for the duration of an ``async with`` block."""
        self.keep_alive()
        try:
            yield self
        finally:
            self.stop_keeping()


class Claim(KeptAlive):
    """The right to do the work of one key, for ``lease`` seconds.

    End it with :meth:`complete` (the work is done: duplicates are turned away for the
    store's ttl) or :meth:`release` (it failed: the next claimer may try at once). A claim
    that is neither is taken back when its lease runs out. Long work keeps its claim with
    :meth:`extend`, or inside ``async with claim.kept_alive():``.
    """

    __slots__ = ("_settled", "key", "lease", "store", "token")

    def __init__(self, store: IdempotencyStore, key: str, token: str, lease: float) -> None:
        self.store = store
        self.key = key
        self.token = token
        self.lease = lease
        self._settled: str | None = None
        self._keeper: _KeepAlive | None = None

    def __repr__(self) -> str:
        return f"Claim({self.store.namespace!r}, {self.key!r}, lease={self.lease:g})"

    @property
    def settled(self) -> bool:
        """True once completed or released."""
        return self._settled is not None

    async def complete(self, result: object = None) -> None:
        """Record the work as done, with ``result`` (None, bytes, or a JSON-serialisable
        value), kept for the store's ttl; every claim of the key returns None until then.

        Raises :class:`ClaimLost` if another claimer took the key after this claim's lease
        ran out, or if this claim was already completed or released.
        """
        if self._settled is not None:
            raise ClaimLost(self.key, f"this claim of {self.key!r} was already {self._settled}")
        raw = encode_result(result)
        self.stop_keeping()
        store = self.store
        if not await store.backend.complete_claim(
            store.namespace, self.key, self.token, raw, store.ttl
        ):
            self._settled = "lost"
            raise ClaimLost(self.key)
        self._settled = "completed"

    async def release(self) -> bool:
        """Give the key up without completing it: the next claim takes it at once. False if
        it was no longer this claim's (lost, or already completed or released)."""
        if self._settled is not None:
            return False
        self._settled = "released"
        self.stop_keeping()
        store = self.store
        return await store.backend.release_claim(store.namespace, self.key, self.token)

    async def extend(self, lease: float | None = None) -> None:
        """Make the claim last ``lease`` seconds (default: its own lease) from now.
        Raises :class:`ClaimLost` if another claimer took the key meanwhile."""
        if self._settled is not None:
            raise ClaimLost(self.key, f"this claim of {self.key!r} was already {self._settled}")
        seconds = self.lease if lease is None else _seconds("lease", lease)
        store = self.store
        if not await store.backend.extend_claim(store.namespace, self.key, self.token, seconds):
            raise ClaimLost(self.key)


class InboxClaim(Claim):
    """The claim ``claim(key, connection=conn)`` returns (PostgreSQL): the key is recorded
    as done in the caller's transaction already, so there is no lease to keep. Its
    :meth:`complete` stores a result, and :meth:`release` frees the key, in that same
    transaction (on ``conn``): both commit with the caller's writes or vanish with a
    rollback."""

    __slots__ = ("connection",)

    def __init__(self, store: IdempotencyStore, key: str, token: str, connection: object) -> None:
        super().__init__(store, key, token, store.ttl)
        self.connection = connection

    async def complete(self, result: object = None) -> None:
        """Store ``result`` with the key's record, in the caller's transaction."""
        if self._settled is not None:
            raise ClaimLost(self.key, f"this claim of {self.key!r} was already {self._settled}")
        raw = encode_result(result)
        store = self.store
        if not await store.backend.complete_claim_in(
            self.connection, store.namespace, self.key, self.token, raw, store.ttl
        ):
            self._settled = "lost"
            raise ClaimLost(self.key)
        self._settled = "completed"

    async def release(self) -> bool:
        """Free the key in the caller's transaction (the work will not be done); False if
        it was already completed or released."""
        if self._settled is not None:
            return False
        self._settled = "released"
        store = self.store
        return await store.backend.release_claim_in(
            self.connection, store.namespace, self.key, self.token
        )

    async def extend(self, lease: float | None = None) -> None:
        """Nothing to do: the record is kept ``ttl`` seconds after the commit."""
        if self._settled is not None:
            raise ClaimLost(self.key, f"this claim of {self.key!r} was already {self._settled}")

    def keep_alive(self) -> None:
        """Nothing to keep (see :meth:`extend`)."""


class _KeepAlive:
    """Timer-driven extensions of one claim: no task exists until an extension is due,
    so short work (the common case) costs one timer. An extension that fails for want of
    the engine (a restart, a dropped connection) is tried again soon, until one works or
    the claim is found lost: one failure must not leave the claim to run out while the
    work goes on, for another claimer would then run it a second time."""

    __slots__ = ("_claim", "_failing", "_handle", "_loop", "_task")

    def __init__(self, claim: KeptAlive) -> None:
        self._claim = claim
        self._loop = asyncio.get_running_loop()
        self._task: asyncio.Task[None] | None = None
        self._failing = False
        self._handle: asyncio.TimerHandle | None = self._loop.call_later(claim.lease / 3, self._due)

    def _due(self) -> None:
        self._handle = None
        self._task = self._loop.create_task(self._extend(), name=f"fairq-claim:{self._claim.key}")

    async def _extend(self) -> None:
        claim = self._claim
        pause = claim.lease / 3
        try:
            await claim.extend()
        except ClaimLost as exc:
            log.warning("the claim of %r is lost: %s", claim.key, exc)
            return
        except Exception as exc:
            if not self._failing:
                log.warning(
                    "could not keep the claim of %r (%s); trying again until it works",
                    claim.key,
                    exc,
                )
                self._failing = True
            pause = min(0.5, claim.lease / 6)
        else:
            if self._failing:
                log.info("the claim of %r is kept again", claim.key)
                self._failing = False
        finally:
            self._task = None
        if not claim.settled:
            self._handle = self._loop.call_later(pause, self._due)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if self._task is not None:
            self._task.cancel()
            self._task = None


class IdempotencyStore:
    """Idempotency keys of one ``namespace``; completed keys are kept ``ttl`` seconds.

    Get one with ``broker.idempotency(namespace, ttl)``. Keys are 1-100 characters from
    ``A-Z a-z 0-9 _ . : -`` — a message id, an event id, an order id, or a hash of the
    fields that make a message unique.
    """

    def __init__(self, backend: Backend, namespace: str, ttl: float) -> None:
        self.backend = backend
        self.namespace = check_name(namespace, "idempotency namespace")
        self.ttl = _seconds("ttl", ttl)

    def __repr__(self) -> str:
        return f"IdempotencyStore({self.namespace!r}, ttl={self.ttl:g})"

    @property
    def name(self) -> str:
        """The namespace (every handle exposes its ``name``)."""
        return self.namespace

    async def claim(
        self,
        key: str,
        lease: float = DEFAULT_LEASE,
        *,
        holder: str | None = None,
        connection: object | None = None,
    ) -> Claim | None:
        """Take ``key`` for ``lease`` seconds; None if another claim holds it or it was
        completed within the ttl. Of any number of concurrent claims exactly one wins.

        ``holder`` names the unit of work that claims (the worker passes the message's
        queue and id): a claim by the holder of a *running* claim takes it back, because
        the holder's earlier attempt is over — a message redelivered after its worker died
        mid-work gets its key back at once instead of being taken for its own duplicate.
        Without a holder every claim is a stranger's.

        ``connection`` (PostgreSQL, the inbox): the caller's psycopg ``AsyncConnection``
        inside its transaction. The key is then recorded as *completed* (for ``ttl``) in
        that transaction: it commits with the caller's own writes and the message's
        ``ack(connection=...)``, or vanishes with a rollback, so the effect is applied once.
        Other backends raise ``Unsupported``.
        """
        if connection is not None:
            check_key(key, "idempotency key")
            _seconds("lease", lease)
            token = secrets.token_hex(12) if holder is None else holder_token(holder)
            record = await self.backend.claim_in(
                connection, self.namespace, key, token, self.ttl, None
            )
            return None if record is not None else InboxClaim(self, key, token, connection)
        got = await self.try_claim(key, lease, holder=holder)
        return got if isinstance(got, Claim) else None

    async def try_claim(
        self,
        key: str,
        lease: float = DEFAULT_LEASE,
        *,
        fingerprint: str | None = None,
        holder: str | None = None,
    ) -> Claim | IdempotencyRecord:
        """Like :meth:`claim`, but a lost race answers with the record in the way (running
        or completed, with its ``fingerprint`` and result), read in the same atomic step.
        ``fingerprint`` is stored with a won claim: what the work is, so a later use of the
        key for other work can be told apart (the HTTP middleware's 422)."""
        check_key(key, "idempotency key")
        seconds = _seconds("lease", lease)
        if fingerprint is not None and not isinstance(fingerprint, str):
            raise InvalidOption(f"fingerprint must be a string or None, got {fingerprint!r}")
        if holder is None:
            token = secrets.token_hex(12)
        elif isinstance(holder, str) and 0 < len(holder) <= 300 and "\x00" not in holder:
            token = holder_token(holder)  # never equal to a random token
        else:
            raise InvalidOption(
                f"holder must be a string of 1-300 characters (no NUL), got {holder!r}"
            )
        record = await self.backend.claim(self.namespace, key, token, seconds, fingerprint)
        if record is None:
            return Claim(self, key, token, seconds)
        return record

    async def get(self, key: str) -> IdempotencyRecord | None:
        """The key's record (running or completed), or None if there is none or it expired."""
        return await self.backend.idempotency_record(
            self.namespace, check_key(key, "idempotency key")
        )

    async def forget(self, key: str) -> bool:
        """Drop the key's record, running or completed, so the next claim takes it (to
        re-run work on purpose); False if there was none."""
        return await self.backend.forget_claim(self.namespace, check_key(key, "idempotency key"))

    @contextlib.asynccontextmanager
    async def once(self, key: str, lease: float = DEFAULT_LEASE) -> AsyncIterator[bool]:
        """``async with store.once(key) as first:`` — ``first`` is True for the one caller
        that claimed the key; the block's normal end completes the claim, an exception
        releases it (and propagates) so a retry can run. False for a duplicate: the key is
        held or completed. The claim is kept alive while the block runs."""
        claim = await self.claim(key, lease)
        if claim is None:
            yield False
            return
        async with claim.working():
            yield True


class VersionGate:
    """The newest version seen per entity of one ``namespace`` (the seed's two birthdate
    updates: the higher version wins whatever the delivery order).

    Get one with ``broker.versions(namespace)``. Versions are integers (version, revision,
    sequence number), floats, or timezone-aware datetimes (event times).
    """

    def __init__(self, backend: Backend, namespace: str) -> None:
        self.backend = backend
        self.namespace = check_name(namespace, "version namespace")

    def __repr__(self) -> str:
        return f"VersionGate({self.namespace!r})"

    @property
    def name(self) -> str:
        """The namespace (every handle exposes its ``name``)."""
        return self.namespace

    async def advance(self, entity: str, version: int | float | datetime) -> bool:
        """Record ``version`` for ``entity`` and return True only if it is greater than the
        stored one (or there is none); otherwise change nothing and return False. Atomic:
        of concurrent advances, exactly the ones that raise the stored version get True."""
        check_key(entity, "entity id")
        return await self.backend.advance_version(self.namespace, entity, check_version(version))

    async def current(self, entity: str) -> Version | None:
        """The stored version of ``entity`` (datetimes come back as epoch seconds), or None."""
        return await self.backend.current_version(self.namespace, check_key(entity, "entity id"))


#: a worker's idempotency key of a message (None: the message has no key, always run it)
KeyFunction = Callable[[Received], "str | None"]


@dataclass(frozen=True, slots=True)
class IdempotentBy:
    """How a worker tells duplicates apart (``@worker.queue(..., idempotency=...)``):
    ``key(msg)`` gives the idempotency key (None: no key, always run); claims go to the
    store ``namespace`` (default: the queue's name) and completed keys are kept ``ttl``
    seconds. A plain function given as ``idempotency=`` means ``IdempotentBy(function)``."""

    key: KeyFunction
    namespace: str | None = None
    ttl: float = 86_400.0

    def __post_init__(self) -> None:
        if not callable(self.key):
            raise InvalidOption(
                f"the idempotency key must be a function of the message, got {self.key!r}"
            )
        if self.namespace is not None:
            check_name(self.namespace, "idempotency namespace")
        _seconds("ttl", self.ttl)
