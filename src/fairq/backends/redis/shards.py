"""What a broker knows of an attention domain's shards on Redis, between script calls.

A domain of ``shards`` shards keeps, per shard, its own keys, signals, slices and
scheduler (``A`` = ``F a:<domain>#<shard>:``, ``F`` the family of the shard's work
queues), so each step is one script on one slot. What crosses shards goes through the
client, and is only ever about fairness, never about a message or a signal:

- **which shard a take visits**: the one whose next tenant has the smallest virtual time
  (each script's reply says the shard's head; :meth:`Shards.order`), so the shards'
  schedulers act as one;
- **a tenant's virtual time**: the charges a take or an end made to a tenant in one
  shard are passed to the others with the broker's next script there
  (:meth:`Shards.charged`, :meth:`Shards.sync_args`), so a tenant's virtual time counts
  its service in every shard (a tenant of many keys is spread over the shards);
- **the virtual clock**: the largest one seen, passed along too, so a tenant that
  becomes ready in a shard nobody took from for a while starts at the domain's clock.

A charge lost on the way (a broker that dies holding it) costs a little fairness, no
message; the same table also spares a look before a take that the last take's reply
already answered (its shard still had a ready signal), and a look at shards nothing
happened in (wake-ups name the shard).

A reply may be older than a wake-up that came while its call was on its way: a look
read the shard before another script's signal, and its reply is learnt after that
script's reply and wake-up (calls go on several connections, and a look's reply passes
through ``asyncio.gather``: replies are not learnt in the order their scripts ran).
Learnt as it is, it would undo the wake-up (nothing ready, the next due time a slice's
lease end long after the new signal's), and the signal would wait for ``stale_after``.
So each call is given the shard's wake-up count when it starts (:meth:`Shards.mark`),
and a wake-up since then is replayed after its reply is learnt.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["SHARD_SEP", "ShardView", "Shards", "shard_id", "shard_of_token"]

#: between a domain's name and its shard in a shard id and a wake-up name
SHARD_SEP = "#"
_DELTAS_KEPT = 4096  # tenants' charges held for one shard before they are given up


def shard_id(domain: str, shard: int, shards: int) -> str:
    """What the scripts are given for shard ``shard``: the domain's name for a domain of
    one shard (its keys are where they always were), else ``<domain>#<shard>``."""
    return domain if shards == 1 else f"{domain}{SHARD_SEP}{shard}"


def shard_of_token(token: str) -> int:
    """The shard of a slice token (``<hex>`` or ``<hex>-<shard>``)."""
    _, sep, shard = token.rpartition("-")
    return int(shard) if sep and shard.isdigit() else 0


def _str(x: bytes | str) -> str:
    return x.decode() if isinstance(x, bytes) else x


@dataclass(slots=True)
class ShardView:
    """What this broker last learnt of one shard: ``ready`` (None: unknown, look first),
    its first tenants with a ready signal and their virtual times (``heads``, of
    ``count`` in all), and when something comes due."""

    ready: bool | None = None
    heads: list[tuple[str, float]] = field(default_factory=list)
    count: int = 0
    due: float | None = None
    learnt: float = 0.0  # time.monotonic() when learnt
    wakes: int = 0  # wake-ups for the shard so far (Shards.mark)

    def set_heads(self, count: int, flat: Sequence[Any]) -> None:
        self.ready = count > 0
        self.count = count
        self.heads = [(_str(t), float(v)) for t, v in zip(flat[::2], flat[1::2], strict=True)]
        self.learnt = time.monotonic()


@dataclass(slots=True)
class Shards:
    """The shards of one domain as this broker sees them."""

    domain: str
    ids: list[str]
    families: list[str]
    stale_after: float = 5.0  # seconds before a view with nothing ready is looked at again
    views: list[ShardView] = field(default_factory=list)
    deltas: list[dict[str, float]] = field(default_factory=list)
    clock: float | None = None
    visited: list[int] = field(default_factory=list)  # when each was last taken from
    _turn: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def __post_init__(self) -> None:
        self.views = [ShardView() for _ in self.ids]
        self.deltas = [{} for _ in self.ids]
        self.visited = [0] * len(self.ids)

    @property
    def sharded(self) -> bool:
        return len(self.ids) > 1

    # -- learning ---------------------------------------------------------------------------
    def mark(self, shard: int) -> int:
        """Before a call whose reply is learnt (``since`` of :meth:`learn` and
        :meth:`learn_look`): the shard's wake-ups so far."""
        return self.views[shard].wakes

    def learn(self, shard: int, view: bytes | str, since: int | None = None) -> None:
        """A script's ``shard_view()``: "clock due count tenant vt ..." ("-": no due);
        ``since``: :meth:`mark` before the call."""
        clock, due, count, *heads = _str(view).split(" ")
        c = float(clock)
        if self.clock is None or c > self.clock:
            self.clock = c
        v = self.views[shard]
        v.due = None if due == "-" else float(due)
        v.set_heads(int(count), heads)
        self._replay(v, since)

    def learn_look(self, shard: int, got: list[Any], since: int | None = None) -> None:
        """``attention_next.lua``'s reply for one shard; ``since``: :meth:`mark` before
        the look."""
        v = self.views[shard]
        if int(got[0]):
            if len(got) == 1:  # no such domain: the take says so
                v.ready, v.heads, v.count, v.learnt = True, [], 0, time.monotonic()
            else:
                v.set_heads(int(got[1]), got[2:])
            return
        v.set_heads(0, [])
        due = _str(got[1])
        v.due = float(due) if due else None
        self._replay(v, since)

    @staticmethod
    def _replay(v: ShardView, since: int | None) -> None:
        """A wake-up that came while the call was on its way may be newer than its reply:
        it holds (look again) rather than the reply's "nothing ready"."""
        if since is not None and v.wakes != since and v.ready is False:
            v.ready = None

    def changed(self, shard: int | None) -> None:
        """A wake-up for the shard (None: for all, after the subscriber reconnected): what
        had nothing ready may have now."""
        for i, v in enumerate(self.views):
            if shard is None or i == shard:
                v.wakes += 1
                if v.ready is False:
                    v.ready = None

    def unknown(self, now: float) -> list[int]:
        """The shards a look must read: never seen, changed, came due or seen too long ago."""
        mono = time.monotonic()
        out = []
        for i, v in enumerate(self.views):
            if v.ready is None or (
                not v.ready
                and ((v.due is not None and v.due <= now) or mono - v.learnt > self.stale_after)
            ):
                out.append(i)
        return out

    def any_ready(self) -> bool:
        return any(v.ready for v in self.views)

    def next_due(self) -> float | None:
        dues = [v.due for v in self.views if not v.ready and v.due is not None]
        return min(dues) if dues else None

    # -- choosing ---------------------------------------------------------------------------
    def order(self) -> list[int]:
        """The shards in the order a take tries them: those with a ready signal by the
        smallest virtual time a tenant there has now (with the charges not yet passed
        there; ties go to the shard taken from least recently), then the unknown ones,
        then the rest — a take must not miss a signal another process just gave a shard."""
        if not self.sharded:
            return [0]
        return sorted(range(len(self.ids)), key=lambda i: self._rank(i, self.visited[i]))

    def took(self, shard: int) -> None:
        """A take was tried on ``shard`` (ties between shards go round)."""
        if self.sharded:
            self.visited[shard] = next(self._turn)

    def _rank(self, i: int, turn: int) -> tuple[int, float, int]:
        v = self.views[i]
        if not v.ready:
            return (1 if v.ready is None else 2, 0.0, turn)
        if not v.heads:  # a tenant there starts at the clock
            return (0, self.clock if self.clock is not None else float("-inf"), turn)
        pending = self.deltas[i]
        best = min(vt + pending.get(t, 0.0) for t, vt in v.heads)
        if v.count > len(v.heads):  # those not listed are at least the last one listed
            best = min(best, v.heads[-1][1])
        return (0, best, turn)

    # -- passing charges between shards ------------------------------------------------------
    def charged(self, shard: int, tenant: bytes | str, delta: bytes | str) -> None:
        """A script on ``shard`` charged ``tenant`` by ``delta``: the other shards hear of it
        with this broker's next script there."""
        if not self.sharded:
            return
        t, d = _str(tenant), _str(delta)
        if not t or not d:
            return
        amount = float(d)
        for i, pending in enumerate(self.deltas):
            if i == shard:
                continue
            if len(pending) >= _DELTAS_KEPT and t not in pending:
                pending.clear()  # a shard this broker has not visited for long: start over
            pending[t] = pending.get(t, 0.0) + amount

    def sync_args(self, shard: int) -> tuple[str, str]:
        """The clock and the charges to give shard ``shard`` with the next script there
        (handed over now: a failed call loses them, which costs fairness, not messages)."""
        if not self.sharded:
            return "", ""
        pending = self.deltas[shard]
        self.deltas[shard] = {}
        deltas = " ".join(f"{t} {d!r}" for t, d in pending.items() if d)
        return ("" if self.clock is None else repr(self.clock)), deltas
