"""``fairq demo flash-sale``: the seed's 10:00 sale, scaled to this machine.

At 10:00 two million fans come for 60,000 seats; the inventory reserves about 1,100 seats
a second, so a waiting room lets about 500 fans a second in. Here, by default, 20,000
simulated fans come for 3,000 seats:

* **the crowd** — a share of the fans arrive before ``opens_at`` (the pre-queue, drawn
  into a random order at opening), the rest in a rush just after; each fan polls its
  status at the interval the room suggests, as the room's page would;
* **the admitter** — ``room.run_admitter()`` lets fans in at ``--rate`` per second
  (adaptive by default: it backs off when the inventory's p99 latency climbs);
* **the gateway and the inventory** — an admitted fan asks for a hold on 1–4 seats with
  its admission token (``room.verify``; the token is burnt by ``room.consume`` once the hold
  is made); the inventory reserves at most ``--inventory-rate`` holds per second (a token
  bucket: beyond that, calls queue and their latency shows in the health signal);
* **hold expiry** — every hold sends a message with ``delay=--hold`` seconds to the queue
  ``demo.ev-88.hold-expiry``; a consumer returns the seats of holds not bought by then to stock
  (the seed's hold expiry: a timer is another asynchronous job). Most fans buy within
  the hold; some are too slow, some walk away;
* **sold out** — when the last seat is bought, ``room.sold_out()``: everyone still waiting
  is told at their next refresh, without any per-fan work.

The run ends with a table: fans joined, admitted, holds, seats sold and returned to
stock, fans told "sold out", and the p50/p99 wait from joining to admission.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import math
import random
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ..broker import Broker, connect
from ..errors import FairqError, InvalidToken
from ..waitingroom import AdaptiveRate, HealthMeter, WaitingRoom

__all__ = ["FlashSaleResult", "SaleConfig", "run_flash_sale"]

# its own room and queue: the demo deletes and purges them, so never the user's own (the
# tour's example room is "ev-88")
ROOM = "demo.ev-88"
EXPIRY_QUEUE = "demo.ev-88.hold-expiry"
_REFRESH = (1.0, 5.0)  # the fans' refresh interval bounds (the page's are 2-30 s)
_SERVICE_TIME = 0.002  # seconds one reservation takes inside the inventory


@dataclass(frozen=True, slots=True)
class SaleConfig:
    """The scenario's numbers (the CLI's options)."""

    fans: int = 20_000
    seats: int = 3_000
    rate: float = 100.0
    inventory_rate: float = 400.0
    hold: float = 4.0
    buy_share: float = 0.75
    pre_open: float = 3.0
    rush: float = 3.0
    adaptive: bool = True
    seed: int | None = None

    def check(self) -> None:
        if self.fans < 1 or self.seats < 1:
            raise FairqError("--fans and --seats must be at least 1")
        if self.rate <= 0 or self.inventory_rate <= 0 or self.hold <= 0:
            raise FairqError("--rate, --inventory-rate and --hold must be > 0")
        if not 0 <= self.buy_share <= 1:
            raise FairqError("--buy-share must be between 0 and 1")


@dataclass(slots=True)
class FlashSaleResult:
    """What happened (for the final table, and for tests)."""

    joined: int = 0
    pre_queue: int = 0
    admitted: int = 0
    holds: int = 0
    sold: int = 0
    returned: int = 0
    told_sold_out: int = 0
    abandoned: int = 0
    too_slow: int = 0
    no_seats: int = 0
    waits: list[float] = field(default_factory=list)
    elapsed: float = 0.0
    final_rate: float = 0.0
    sold_out_at: float | None = None
    last_told: float | None = None

    def percentile(self, p: float) -> float:
        """The ``p`` (0..1) percentile of the waits, in seconds."""
        if not self.waits:
            return 0.0
        ordered = sorted(self.waits)
        return ordered[min(len(ordered) - 1, max(0, math.ceil(p * len(ordered)) - 1))]


class Inventory:
    """A toy seat inventory: reserves at most ``rate`` holds a second (calls beyond that
    wait their turn), keeps holds until bought or expired."""

    def __init__(self, seats: int, rate: float, meter: HealthMeter) -> None:
        self.stock = seats
        self.seats = seats
        self.sold = 0
        self.rate = rate
        self.meter = meter
        self.holds: dict[int, int] = {}
        self._next_slot = 0.0
        self._ids = 0

    async def _slot(self) -> None:
        # a token bucket of one: each call takes the next free 1/rate slot
        loop = asyncio.get_running_loop()
        now = loop.time()
        slot = max(now, self._next_slot)
        self._next_slot = slot + 1.0 / self.rate
        await asyncio.sleep(slot - now + _SERVICE_TIME)

    async def hold(self, seats: int) -> int | None:
        """Reserve ``seats``; the hold's id, or None if the stock cannot cover them."""
        started = time.monotonic()
        await self._slot()
        ok = self.stock >= seats
        if ok:
            self.stock -= seats
            self._ids += 1
            self.holds[self._ids] = seats
        # "no seats right now" counts as an error: admitting more fans would not help
        self.meter.observe(time.monotonic() - started, ok)
        return self._ids if ok else None

    def buy(self, hold_id: int) -> bool:
        """Turn a hold into a sale; False if it expired first."""
        seats = self.holds.pop(hold_id, None)
        if seats is None:
            return False
        self.sold += seats
        return True

    def expire(self, hold_id: int) -> int:
        """Return an unbought hold's seats to stock; how many."""
        seats = self.holds.pop(hold_id, 0)
        self.stock += seats
        return seats


class FlashSale:
    """One run of the scenario on a broker."""

    def __init__(self, broker: Broker, config: SaleConfig) -> None:
        self.broker = broker
        self.config = config
        self.rng = random.Random(config.seed)
        self.meter = HealthMeter(window=3.0)
        self.inventory = Inventory(config.seats, config.inventory_rate, self.meter)
        self.result = FlashSaleResult()
        self.sold_out = asyncio.Event()
        self.fans: set[asyncio.Task[None]] = set()
        self.room: WaitingRoom | None = None

    async def setup(self) -> WaitingRoom:
        b = self.broker
        await b.delete_room(ROOM)
        self.room = await b.waiting_room(
            ROOM,
            admit_rate=self.config.rate,
            token_ttl=30.0,
            opens_at=b.clock.now() + self.config.pre_open,
        )
        q = await b.declare_queue(EXPIRY_QUEUE, visibility_timeout=10.0)
        await q.purge()
        return self.room

    # -- the crowd -------------------------------------------------------------------------
    async def crowd(self) -> None:
        """Fans arrive: a share before opening (the pre-queue), the rest in a rush."""
        c = self.config
        loop = asyncio.get_running_loop()
        start = loop.time()
        early = int(c.fans * min(0.9, c.pre_open / (c.pre_open + c.rush))) if c.pre_open else 0
        # arrival times: spread over the pre-opening window, then the rush after 10:00
        times = sorted(
            [self.rng.uniform(0, c.pre_open * 0.9) for _ in range(early)]
            + [
                c.pre_open + self.rng.expovariate(1 / max(0.1, c.rush / 3))
                for _ in range(c.fans - early)
            ]
        )
        i = 0
        while i < len(times):
            now = loop.time() - start
            if self.sold_out.is_set():
                now = times[-1]  # the rest arrive at once: they are told at the door
            upto = min(bisect.bisect_right(times, now, lo=i), i + 500)
            due = [f"fan-{j:06d}" for j in range(i, upto)]
            if not due:
                await asyncio.sleep(min(0.05, max(0.0, times[i] - now)))
                continue
            assert self.room is not None
            tickets = await self.room.join_many(due)
            i += len(due)
            self.result.joined += len(due)
            joined_at = time.monotonic()
            for t in tickets:
                if t.state == "pre_queue":
                    self.result.pre_queue += 1
                if t.ticket is None:  # sold out already
                    self.result.told_sold_out += 1
                    continue
                task = asyncio.create_task(self.fan(t.ticket, joined_at))
                self.fans.add(task)
                task.add_done_callback(self.fans.discard)

    async def fan(self, ticket: str, joined_at: float) -> None:
        """One fan: wait in line (polling), then hold seats and maybe buy them."""
        room = self.room
        assert room is not None
        low, high = _REFRESH
        while True:
            st = await room.status(ticket)
            if st.state == "sold_out":
                self.result.told_sold_out += 1
                self.result.last_told = time.monotonic()
                return
            if st.state == "admitted" and st.token is not None:
                self.result.admitted += 1
                self.result.waits.append(time.monotonic() - joined_at)
                await self.shop(room, st.token)
                return
            if st.state not in ("waiting", "pre_queue"):
                return
            eta = st.eta if st.eta is not None else high
            pause = max(low, min(high, eta / 10 if st.state == "waiting" else eta / 4))
            # jittered downwards only: a fan hears news within one refresh interval
            await asyncio.sleep(pause * self.rng.uniform(0.8, 1.0))

    async def shop(self, room: WaitingRoom, token: str) -> None:
        """The purchase path behind the gateway: hold (token checked), then buy or not."""
        c = self.config
        want = self.rng.choice((1, 2, 2, 2, 3, 4))
        loop = asyncio.get_running_loop()
        give_up = loop.time() + 2 * c.hold
        backoff = 0.5
        while True:
            try:
                room.verify(token)  # the gateway's check: no valid token, no hold
            except InvalidToken:
                return
            hold = await self.inventory.hold(want)
            if hold is not None:
                break
            if self.sold_out.is_set() or loop.time() > give_up:
                self.result.no_seats += 1
                return
            # every seat is held right now: some holds will expire; ask again, less and less
            await asyncio.sleep(backoff * self.rng.uniform(0.5, 1.0))
            backoff = min(4.0, backoff * 2)
        with contextlib.suppress(InvalidToken):
            await room.consume(token)  # one hold per admission
        self.result.holds += 1
        await self.broker.queue(EXPIRY_QUEUE).send({"hold": hold}, delay=c.hold)
        if self.rng.random() >= c.buy_share:
            self.result.abandoned += 1  # walks away; the hold expires
            return
        think = self.rng.uniform(0.2, c.hold * 1.25)  # a few are too slow
        await asyncio.sleep(think)
        if self.inventory.buy(hold):
            await self.check_sold_out()
        else:
            self.result.too_slow += 1

    async def check_sold_out(self) -> None:
        inv = self.inventory
        if inv.sold >= inv.seats and not self.sold_out.is_set():
            self.sold_out.set()
            self.result.sold_out_at = time.monotonic()
            assert self.room is not None
            await self.room.sold_out()

    # -- hold expiry -----------------------------------------------------------------------
    async def expire_holds(self) -> None:
        """Return the seats of holds not bought in time (the delayed messages)."""
        q = self.broker.queue(EXPIRY_QUEUE)
        while True:
            for m in await q.receive(max_messages=50, wait=0.5):
                self.result.returned += self.inventory.expire(int(m.json()["hold"]))
                await m.ack()

    # -- the run ---------------------------------------------------------------------------
    async def run(self, console: Console) -> FlashSaleResult:
        c = self.config
        room = await self.setup()
        adaptive = None
        if c.adaptive:
            adaptive = AdaptiveRate(
                self.meter.read,
                max_p99=1.0,
                max_error_rate=0.25,
                min_rate=max(1.0, c.rate / 10),
                interval=0.5,
            )
        started = time.monotonic()
        background: list[asyncio.Task[None]] = [
            asyncio.create_task(room.run_admitter(adaptive=adaptive), name="admitter"),
            asyncio.create_task(self.expire_holds(), name="hold-expiry"),
        ]
        crowd = asyncio.create_task(self.crowd(), name="crowd")
        try:
            await self.watch(console, crowd, started)
        finally:
            for task in [crowd, *background, *self.fans]:
                task.cancel()
            await asyncio.gather(crowd, *background, *self.fans, return_exceptions=True)
        r = self.result
        r.sold = self.inventory.sold
        r.elapsed = time.monotonic() - started
        r.final_rate = (await room.stats()).admit_rate
        return r

    async def watch(self, console: Console, crowd: Awaitable[None], started: float) -> None:
        c, r, inv = self.config, self.result, self.inventory
        assert self.room is not None
        with Progress(
            TextColumn("[bold]{task.description:<16}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[note]}"),
            TimeElapsedColumn(),
            console=console,
        ) as progress:
            joined = progress.add_task("fans joined", total=c.fans, note="")
            admitted = progress.add_task("fans admitted", total=c.fans, note="")
            sold = progress.add_task("seats sold", total=c.seats, note="")
            told = progress.add_task("told sold out", total=c.fans, note="")
            while True:
                s = await self.room.stats()
                progress.update(
                    joined,
                    completed=r.joined,
                    note=f"pre-queue {s.pre_queue:>6}  waiting {s.waiting:>6}",
                )
                progress.update(
                    admitted,
                    completed=s.admitted,
                    note=f"rate {s.admit_rate:6.0f}/s  measured {s.measured_rate:6.0f}/s",
                )
                progress.update(
                    sold,
                    completed=inv.sold,
                    note=f"stock {inv.stock:>5}  held {sum(inv.holds.values()):>5}",
                )
                p99 = self.meter.read().p99
                progress.update(
                    told,
                    completed=r.told_sold_out,
                    note=f"inventory p99 {1000 * (p99 or 0):5.0f} ms",
                )
                crowd_done = getattr(crowd, "done", lambda: True)()
                if crowd_done and not self.fans:
                    break
                if time.monotonic() - started > 600:
                    raise FairqError("the sale did not finish in 10 minutes")
                await asyncio.sleep(0.25)


def result_table(r: FlashSaleResult, config: SaleConfig) -> Table:
    """The final table."""
    table = Table(title="Flash sale ev-88 — done")
    table.add_column("")
    table.add_column("", justify="right")
    after = "-"
    if r.sold_out_at is not None and r.last_told is not None:
        after = f"{max(0.0, r.last_told - r.sold_out_at):.1f} s (refresh ≤ {_REFRESH[1]:g} s)"
    rows = [
        ("fans joined", f"{r.joined:,}"),
        ("  of whom in the pre-queue (drawn at opening)", f"{r.pre_queue:,}"),
        ("fans admitted", f"{r.admitted:,}"),
        ("holds made (token checked and burnt)", f"{r.holds:,}"),
        ("seats sold", f"{r.sold:,} of {config.seats:,}"),
        ("seats returned by hold expiry (delayed messages)", f"{r.returned:,}"),
        ("fans who walked away / were too slow", f"{r.abandoned:,} / {r.too_slow:,}"),
        ("admitted fans who found no seat", f"{r.no_seats:,}"),
        ("fans told sold out", f"{r.told_sold_out:,}"),
        ("  last one told, after the sell-out", after),
        (
            "wait from joining to admission, p50 / p99",
            f"{r.percentile(0.5):.1f} s / {r.percentile(0.99):.1f} s",
        ),
        ("admit rate at the end", f"{r.final_rate:.0f} /s (set {config.rate:.0f})"),
        ("elapsed", f"{r.elapsed:.1f} s"),
    ]
    for k, v in rows:
        table.add_row(k, v)
    return table


async def run_flash_sale(url: str | None, config: SaleConfig, console: Console) -> FlashSaleResult:
    """Run the scenario on the broker at ``url`` and print its progress and table."""
    config.check()
    async with await connect(url) as broker:
        console.print(
            f"[bold]Flash sale ev-88[/bold] — {config.fans:,} fans for {config.seats:,} seats; "
            f"admitting {config.rate:g}/s{' (adaptive)' if config.adaptive else ''}, inventory "
            f"{config.inventory_rate:g} holds/s, holds expire after {config.hold:g} s; "
            f"opens in {config.pre_open:g} s — on [cyan]{broker.url}[/cyan]"
        )
        result = await FlashSale(broker, config).run(console)
    console.print(result_table(result, config))
    return result
