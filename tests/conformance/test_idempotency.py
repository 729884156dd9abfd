"""SPEC §7 (idempotent consumers, version gates) on every backend: exclusive claims among
tasks, threads and processes; leases that expire; completed keys kept for the ttl;
``once``; version gates under concurrent out-of-order advances; the worker's
``idempotency=`` option."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import fairq
from services import pg_connections

N = 50


async def run_until(
    worker: fairq.Worker, done: Callable[[], Awaitable[bool]], limit: float = 10
) -> None:
    """Run ``worker`` until ``done()`` is true, then stop it and wait for its shutdown."""
    task = asyncio.create_task(worker.run())
    try:
        deadline = time.monotonic() + limit
        while not await done():
            assert time.monotonic() < deadline, "the worker did not finish in time"
            assert not task.done(), f"the worker stopped early: {task}"
            await asyncio.sleep(0.02)
    finally:
        worker.stop()
        await asyncio.wait_for(task, 10)


# -- exactly one of N concurrent claimers wins ------------------------------------------------
async def test_one_of_50_concurrent_tasks_gets_the_claim(broker: fairq.Broker) -> None:
    store = broker.idempotency("pdf-worker", ttl=3600)
    for key in ("order-1", "order-2"):
        got = await asyncio.gather(*(store.claim(key, lease=30) for _ in range(N)))
        winners = [c for c in got if c is not None]
        assert len(winners) == 1, f"{len(winners)} claimers won {key}"
        assert winners[0].key == key
    record = await store.get("order-1")
    assert record is not None and record.running


def one_connection_each(url: str, backend_name: str) -> str:
    """``url`` for one of many brokers a test opens at once: on PostgreSQL a broker's pool
    may grow to 10 connections (two after a single operation: the wake-up NOTIFY goes out on
    its connection after the caller has its answer, and the next operation takes another),
    so 51 brokers held 99 of the server's 100 (max_connections), which the whole suite
    shares; the other test process was refused ("too many clients already"). One each."""
    return f"{url}&pool_max=1" if backend_name == "postgres" else url


def test_one_of_50_threads_gets_the_claim(url: str, backend_name: str) -> None:
    """Threads through the sync facade. On SQLite each thread has its own connection to
    the file (as separate processes would); memory:// lives in one broker, so they share it."""
    separate = backend_name != "memory"
    url = one_connection_each(url, backend_name)
    shared = fairq.connect_sync(url)
    brokers = [fairq.connect_sync(url) for _ in range(N)] if separate else [shared] * N
    barrier = threading.Barrier(N)
    results: list[bool] = []
    errors: list[BaseException] = []

    def claimer(broker: fairq.sync.SyncBroker) -> None:
        try:
            store = broker.idempotency("threads", ttl=60)
            barrier.wait(10)
            results.append(store.claim("the-key", lease=30) is not None)
        except BaseException as exc:  # reported below, not lost in the thread
            errors.append(exc)

    threads = [threading.Thread(target=claimer, args=(b,)) for b in brokers]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        if backend_name == "postgres":  # 51 brokers on a server shared by the whole suite
            assert pg_connections() <= len(brokers) + 1, "more than a connection per broker"
    finally:
        for b in {id(b): b for b in [*brokers, shared]}.values():
            b.close()
    assert not errors, errors
    assert len(results) == N
    assert results.count(True) == 1, f"{results.count(True)} threads won the key"


_PROCESS = """
import asyncio, os, sys, time
import fairq

async def main(url, go, n):
    brokers = [await fairq.connect(url) for _ in range(n)]  # a connection per claimer
    stores = [b.idempotency("processes", ttl=60) for b in brokers]
    for store in stores:
        await store.get("warm-up")  # connected, schema read: only the race is left
    print("ready", flush=True)
    while not os.path.exists(go):
        time.sleep(0.001)
    claims = await asyncio.gather(*(s.claim("the-key", lease=30) for s in stores))
    print(" ".join("won" if c is not None else "lost" for c in claims), flush=True)
    for b in brokers:
        await b.close()

asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
"""


def test_one_of_50_claimers_in_10_processes_gets_the_claim(tmp_path: Path) -> None:
    """Separate processes on one SQLite file, each claimer with a connection of its own,
    all released together once every one is connected."""
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    go = tmp_path / "go"
    with fairq.connect_sync(url):
        pass  # create the file and schema once, so the processes only race for the key
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _PROCESS, url, str(go), str(N // 10)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(10)
    ]
    try:
        for p in procs:
            assert p.stdout is not None and p.stderr is not None
            line = p.stdout.readline().strip()
            assert line == "ready", f"a claimer process did not start: {p.stderr.read()}"
        go.touch()
        outcomes: list[str] = []
        for p in procs:
            out, err = p.communicate(timeout=60)
            assert p.returncode == 0, err
            outcomes += out.split()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert len(outcomes) == N
    assert outcomes.count("won") == 1, f"{outcomes.count('won')} claimers won the key"


# -- leases, completion, release ------------------------------------------------------------
async def test_an_expired_claim_can_be_taken_again(
    broker: fairq.Broker, clock: fairq.ManualClock
) -> None:
    store = broker.idempotency("leases", ttl=3600)
    crashed = await store.claim("job-7", lease=10)
    assert crashed is not None
    clock.advance(9.9)
    assert await store.claim("job-7", lease=10) is None, "the lease has not run out yet"
    clock.advance(0.2)
    again = await store.claim("job-7", lease=10)
    assert again is not None, "a claim whose lease ran out must be claimable"
    # the crashed holder's late completion must not overwrite the new holder's claim
    with pytest.raises(fairq.ClaimLost):
        await crashed.complete("late")
    assert not await crashed.release()
    record = await store.get("job-7")
    assert record is not None and record.running
    await again.complete("on time")
    record = await store.get("job-7")
    assert record is not None and record.completed and record.result == "on time"


async def test_a_completed_key_is_not_claimed_again_until_its_ttl(
    broker: fairq.Broker, clock: fairq.ManualClock
) -> None:
    store = broker.idempotency("done", ttl=100)
    claim = await store.claim("order-1", lease=5)
    assert claim is not None
    clock.advance(4)
    await claim.complete({"pdf": "tickets/order-1.pdf"})
    for step in (1, 10, 50, 38):  # the lease is long over; the ttl (from completion) is not
        clock.advance(step)
        assert await store.claim("order-1", lease=5) is None
        record = await store.get("order-1")
        assert record is not None and record.completed
        assert record.result == {"pdf": "tickets/order-1.pdf"}
    clock.advance(1.1)  # 100.1 s after completion
    assert await store.get("order-1") is None
    assert await store.claim("order-1", lease=5) is not None


async def test_release_makes_the_key_claimable_at_once(broker: fairq.Broker) -> None:
    store = broker.idempotency("released", ttl=100)
    claim = await store.claim("k", lease=600)
    assert claim is not None and await store.claim("k") is None
    assert await claim.release()
    assert await store.get("k") is None
    again = await store.claim("k")
    assert again is not None
    assert not await claim.release(), "releasing twice must not free the new holder's claim"
    assert await store.claim("k") is None


async def test_a_settled_claim_cannot_be_completed_again(broker: fairq.Broker) -> None:
    store = broker.idempotency("settled", ttl=100)
    claim = await store.claim("k")
    assert claim is not None
    await claim.complete(b"first")
    with pytest.raises(fairq.ClaimLost, match="already completed"):
        await claim.complete(b"second")
    assert not await claim.release(), "a completed key is not released"
    record = await store.get("k")
    assert record is not None and record.result == b"first"
    other = await store.claim("other")
    assert other is not None
    await other.release()
    with pytest.raises(fairq.ClaimLost):
        await other.complete()
    assert await store.get("other") is None


async def test_extend_keeps_the_claim(broker: fairq.Broker, clock: fairq.ManualClock) -> None:
    store = broker.idempotency("extend", ttl=100)
    claim = await store.claim("k", lease=10)
    assert claim is not None
    for _ in range(5):
        clock.advance(8)
        await claim.extend()
        assert await store.claim("k", lease=10) is None
    await claim.extend(30)
    clock.advance(25)
    assert await store.claim("k") is None
    clock.advance(6)
    thief = await store.claim("k")
    assert thief is not None
    with pytest.raises(fairq.ClaimLost):
        await claim.extend()


async def test_kept_alive_holds_the_claim_while_work_runs(live_broker: fairq.Broker) -> None:
    store = live_broker.idempotency("alive", ttl=100)
    claim = await store.claim("slow", lease=0.3)
    assert claim is not None
    async with claim.kept_alive():
        for _ in range(5):  # 1 s: more than three leases
            await asyncio.sleep(0.2)
            assert await store.claim("slow", lease=0.3) is None, "a live holder lost its claim"
    await asyncio.sleep(0.45)  # no longer kept: the lease runs out
    assert await store.claim("slow", lease=0.3) is not None


async def test_a_holder_takes_its_own_running_claim_back(broker: fairq.Broker) -> None:
    store = broker.idempotency("holders", ttl=100)
    first = await store.claim("k", holder="jobs/101")
    assert first is not None
    assert await store.claim("k") is None
    assert await store.claim("k", holder="jobs/102") is None
    again = await store.claim("k", holder="jobs/101")  # the same unit of work, retried
    assert again is not None
    await again.complete()
    assert await store.claim("k", holder="jobs/101") is None, "completed is completed"


async def test_a_holders_earlier_claim_is_over_once_it_takes_the_key_back(
    broker: fairq.Broker,
) -> None:
    """The earlier attempt of a holder that took its key back cannot release, extend or
    complete the new attempt's claim: a late release of the first would free the key for a
    stranger while the second still runs."""
    store = broker.idempotency("holders-late", ttl=100)
    first = await store.claim("k", holder="jobs/7")
    assert first is not None
    second = await store.claim("k", holder="jobs/7")
    assert second is not None and second.token != first.token
    assert not await first.release(), "the earlier attempt released the new one's claim"
    record = await store.get("k")
    assert record is not None and record.state == "running"
    assert await store.claim("k") is None, "a stranger took a key whose holder still runs"
    late = await store.claim("k", holder="jobs/7")  # a third attempt of the same holder
    assert late is not None
    with pytest.raises(fairq.ClaimLost):
        await second.extend()
    with pytest.raises(fairq.ClaimLost):
        await second.complete("late")
    await late.complete("done")
    record = await store.get("k")
    assert record is not None and record.completed and record.result is not None


async def test_holders_that_differ_only_in_length_are_strangers(broker: fairq.Broker) -> None:
    store = broker.idempotency("holders-len", ttl=100)
    assert await store.claim("k", holder="a/1") is not None
    for other in ("a/10", "a/", "xa/1", "a/1 "):
        assert await store.claim("k", holder=other) is None, other


async def test_get_and_forget(broker: fairq.Broker) -> None:
    store = broker.idempotency("forget", ttl=100)
    assert await store.get("k") is None
    assert not await store.forget("k")
    claim = await store.claim("k")
    assert claim is not None
    await claim.complete([1, 2, 3])
    assert await store.forget("k")
    assert await store.get("k") is None
    assert await store.claim("k") is not None


async def test_results_round_trip(broker: fairq.Broker) -> None:
    store = broker.idempotency("results", ttl=100)
    for i, result in enumerate([None, b"\x00raw bytes\xff", "text", 42, {"a": [1, 2.5]}]):
        claim = await store.claim(f"k{i}")
        assert claim is not None
        await claim.complete(result)
        record = await store.get(f"k{i}")
        assert record is not None and record.result == result
    claim = await store.claim("bad")
    assert claim is not None
    with pytest.raises(fairq.InvalidMessage):
        await claim.complete(object())


async def test_namespaces_are_separate(broker: fairq.Broker) -> None:
    a = broker.idempotency("service-a", ttl=100)
    b = broker.idempotency("service-b", ttl=100)
    assert await a.claim("k") is not None
    assert await b.claim("k") is not None
    assert a.name == "service-a"


async def test_bad_arguments(broker: fairq.Broker) -> None:
    with pytest.raises(fairq.InvalidName):
        broker.idempotency("no spaces", ttl=10)
    for ttl in (0, -1, float("inf"), "10", True):
        with pytest.raises(fairq.InvalidOption):
            broker.idempotency("ns", ttl=ttl)  # type: ignore[arg-type]
    store = broker.idempotency("ns", ttl=10)
    for key in ("", "a b", "x" * 101, 7):
        with pytest.raises(fairq.InvalidName):
            await store.claim(key)  # type: ignore[arg-type]
    for lease in (0, -5, float("nan"), None):
        with pytest.raises(fairq.InvalidOption):
            await store.claim("k", lease=lease)  # type: ignore[arg-type]
    with pytest.raises(fairq.InvalidOption):
        await store.claim("k", holder="")
    assert issubclass(fairq.ClaimLost, fairq.FairqError)


# -- once --------------------------------------------------------------------------------------
async def test_once_runs_the_block_once(broker: fairq.Broker) -> None:
    store = broker.idempotency("once", ttl=100)
    runs = 0
    for _ in range(3):
        async with store.once("order-1") as first:
            if first:
                runs += 1
    assert runs == 1
    record = await store.get("order-1")
    assert record is not None and record.completed


async def test_once_releases_on_an_exception(broker: fairq.Broker) -> None:
    store = broker.idempotency("once", ttl=100)
    with pytest.raises(RuntimeError, match="printer jammed"):
        async with store.once("order-2") as first:
            assert first
            raise RuntimeError("printer jammed")
    assert await store.get("order-2") is None, "a failed block must release its key"
    async with store.once("order-2") as first:
        assert first, "the retry after a failure must run"
    async with store.once("order-2") as first:
        assert not first


async def test_once_is_false_while_another_holds_the_key(broker: fairq.Broker) -> None:
    store = broker.idempotency("once", ttl=100)
    holder = await store.claim("order-3")
    assert holder is not None
    async with store.once("order-3") as first:
        assert not first
    assert (await store.get("order-3")).running  # type: ignore[union-attr]
    await holder.release()
    async with store.once("order-3") as first:
        assert first


async def test_once_among_concurrent_tasks(broker: fairq.Broker) -> None:
    store = broker.idempotency("once", ttl=100)
    ran: list[int] = []

    async def worker(i: int) -> None:
        async with store.once("shared") as first:
            if first:
                ran.append(i)
                await asyncio.sleep(0)

    await asyncio.gather(*(worker(i) for i in range(N)))
    assert len(ran) == 1


# -- version gates ---------------------------------------------------------------------------
async def test_the_higher_version_wins_whatever_the_order(broker: fairq.Broker) -> None:
    """The seed's two birthdate updates, delivered newest first."""
    gate = broker.versions("user-birthdate")
    birthdate: dict[str, str] = {}
    for msg in (
        {"user_id": "1", "birthdate": "1991-01-01", "version": 4},
        {"user_id": "1", "birthdate": "1990-01-01", "version": 3},
    ):
        if await gate.advance(msg["user_id"], msg["version"]):  # type: ignore[arg-type]
            birthdate[msg["user_id"]] = msg["birthdate"]  # type: ignore[index]
    assert birthdate == {"1": "1991-01-01"}
    assert await gate.current("1") == 4
    assert await gate.current("2") is None


async def test_advance_is_true_only_for_a_greater_version(broker: fairq.Broker) -> None:
    gate = broker.versions("seq")
    rng = random.Random(7)
    versions = [rng.randrange(1000) for _ in range(300)]
    expected, high = [], -1
    for v in versions:
        expected.append(v > high)
        high = max(high, v)
    got = [await gate.advance("e", v) for v in versions]
    assert got == expected
    assert await gate.current("e") == max(versions)


async def test_integers_and_floats_compare_exactly_beyond_53_bits(broker: fairq.Broker) -> None:
    """2**53 + 1 is greater than the float 2**53 although they are the same double."""
    gate = broker.versions("precise")
    assert await gate.advance("e", float(2**53))
    assert not await gate.advance("e", 2**53), "equal to the stored float"
    assert await gate.advance("e", 2**53 + 1)
    assert not await gate.advance("e", float(2**53)), "below the stored integer"
    assert await gate.advance("e", float(2**53 + 2))
    assert await gate.current("e") == float(2**53 + 2)
    assert await gate.advance("n", -0.0)
    assert not await gate.advance("n", 0), "0 is not greater than -0.0"
    assert await gate.advance("n", 1)


async def test_event_times_as_versions(broker: fairq.Broker) -> None:
    gate = broker.versions("event-time")
    t0 = datetime(2024, 1, 1, 12, 0, 0, tzinfo=UTC)
    assert await gate.advance("user-1", t0 + timedelta(seconds=5))
    assert not await gate.advance("user-1", t0), "the older event loses"
    assert await gate.current("user-1") == (t0 + timedelta(seconds=5)).timestamp()
    assert await gate.advance("user-1", (t0 + timedelta(seconds=6)).timestamp())
    assert await gate.advance("user-1", 2_000_000_000), "ints and floats compare as numbers"
    with pytest.raises(fairq.InvalidOption):
        await gate.advance("user-1", datetime(2024, 1, 1))  # naive: ambiguous
    for bad in (float("nan"), True, "4", 2**63, None):
        with pytest.raises(fairq.InvalidOption):
            await gate.advance("user-1", bad)  # type: ignore[arg-type]
    with pytest.raises(fairq.InvalidName):
        await gate.advance("user 1", 1)


async def test_concurrent_out_of_order_advances(broker: fairq.Broker, backend_name: str) -> None:
    """Every version twice, shuffled, all at once: the gate ends at the maximum, and of the
    two advances of any version at most one is told it was new."""
    gate = broker.versions("concurrent")
    versions = [v for v in range(1, 101) for _ in range(2)]
    random.Random(3).shuffle(versions)
    got = await asyncio.gather(*(gate.advance("entity", v) for v in versions))
    assert await gate.current("entity") == 100
    won = [v for v, ok in zip(versions, got, strict=True) if ok]
    assert len(won) == len(set(won)), f"a version was accepted twice: {sorted(won)}"
    assert 100 in won
    if backend_name not in ("memory", "sqlite"):
        return  # over a pool of connections the engine may run them in another order
    # on an embedded backend the steps run in the order the tasks start (list order), so
    # the accepted ones are exactly the running maxima
    expected, high = [], 0
    for v in versions:
        if v > high:
            expected.append(v)
            high = v
    assert won == expected


def test_concurrent_advances_from_threads(url: str, backend_name: str) -> None:
    separate = backend_name != "memory"
    url = one_connection_each(url, backend_name)
    shared = fairq.connect_sync(url)
    brokers = [fairq.connect_sync(url) for _ in range(8)] if separate else [shared] * 8
    versions = [v for v in range(1, 201) for _ in range(2)]
    random.Random(5).shuffle(versions)
    won: list[int] = []
    lock = threading.Lock()
    barrier = threading.Barrier(len(brokers))

    def advancer(i: int, broker: fairq.sync.SyncBroker) -> None:
        gate = broker.versions("threads")
        barrier.wait(10)
        for v in versions[i :: len(brokers)]:
            if gate.advance("entity", v):
                with lock:
                    won.append(v)

    threads = [threading.Thread(target=advancer, args=(i, b)) for i, b in enumerate(brokers)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert shared.versions("threads").current("entity") == 200
        if backend_name == "postgres":
            assert pg_connections() <= len(brokers) + 1, "more than a connection per broker"
    finally:
        for b in {id(b): b for b in [*brokers, shared]}.values():
            b.close()
    assert len(won) == len(set(won)), "a version was accepted twice"
    assert 200 in won


async def test_gates_of_different_namespaces_and_entities_are_separate(
    broker: fairq.Broker,
) -> None:
    a, b = broker.versions("a"), broker.versions("b")
    assert await a.advance("x", 5)
    assert await b.advance("x", 1)
    assert await a.advance("y", 1)
    assert (await a.current("x"), await b.current("x")) == (5, 1)


# -- the worker ------------------------------------------------------------------------------
async def test_worker_acks_duplicates_without_running_the_handler(
    live_broker: fairq.Broker,
) -> None:
    q = await live_broker.declare_queue("tickets", visibility_timeout=5)
    orders = ["o-1", "o-2", "o-1", "o-3", "o-2", "o-1"]
    await q.send_batch([fairq.Outgoing({"order": o}) for o in orders])
    await q.send({"no": "key"})
    handled: list[str | None] = []
    worker = fairq.Worker(live_broker, concurrency=4, handle_signals=False, poll_wait=0.1)

    @worker.queue("tickets", concurrency=4, idempotency=lambda m: m.json().get("order"))
    async def make_pdf(msg: fairq.Received) -> None:
        handled.append(msg.json().get("order"))
        await asyncio.sleep(0.05)

    async def all_acked() -> bool:
        s = await q.stats()
        return s.acked == len(orders) + 1 and s.in_flight == 0

    await run_until(worker, all_acked)
    assert sorted(handled, key=str) == [None, "o-1", "o-2", "o-3"]
    assert worker.stats.duplicates == 3
    store = live_broker.idempotency("tickets", ttl=60)  # the default namespace: the queue
    record = await store.get("o-1")
    assert record is not None and record.completed


async def test_worker_releases_the_claim_of_a_failed_handler(live_broker: fairq.Broker) -> None:
    """A fails and releases its key; B (same key, next in line) must then run. Without the
    release B would be taken for a duplicate of the still-claimed A."""
    q = await live_broker.declare_queue("charges", visibility_timeout=5, max_attempts=3)
    a = await q.send({"charge": "c-9", "copy": "A"})
    await q.send({"charge": "c-9", "copy": "B"})
    calls: list[str] = []
    worker = fairq.Worker(live_broker, concurrency=1, handle_signals=False, poll_wait=0.1)

    @worker.queue(
        "charges",
        concurrency=1,
        retry=fairq.Backoff(base=0.3, jitter=0),
        idempotency=fairq.IdempotentBy(lambda m: m.json()["charge"], namespace="payments"),
    )
    async def charge(msg: fairq.Received) -> None:
        calls.append(msg.json()["copy"])
        if msg.id == a and msg.attempt == 1:
            raise RuntimeError("gateway timeout")

    async def settled() -> bool:
        s = await q.stats()
        return s.acked == 2 and s.in_flight == 0 and s.visible == 0 and s.delayed == 0

    await run_until(worker, settled)
    assert calls == ["A", "B"], "the failed A released its key, so B ran; A's retry is a duplicate"
    assert worker.stats.failed == 1 and worker.stats.duplicates == 1
    record = await live_broker.idempotency("payments", ttl=60).get("c-9")
    assert record is not None and record.completed


async def test_worker_retakes_the_claim_of_a_redelivered_message(
    live_broker: fairq.Broker,
) -> None:
    """A message whose earlier delivery died holding the claim (kill -9: message lease and
    claim lease end about together) gets its key back; another message with the key does not."""
    q = await live_broker.declare_queue("mail", visibility_timeout=5)
    first = await q.send({"to": "fan-1"})
    store = live_broker.idempotency("mail", ttl=60)
    assert await store.claim("fan-1", lease=60, holder=f"mail/{first}") is not None  # the dead run
    await q.send({"to": "fan-1"})
    sent: list[str] = []
    worker = fairq.Worker(live_broker, concurrency=1, handle_signals=False, poll_wait=0.1)

    @worker.queue("mail", concurrency=1, idempotency=lambda m: m.json()["to"])
    async def send_mail(msg: fairq.Received) -> None:
        sent.append(msg.id)

    async def done() -> bool:
        return (await q.stats()).acked == 2

    await run_until(worker, done)
    assert sent == [first]
    assert worker.stats.duplicates == 1


async def test_worker_retries_a_failed_message_with_its_key(live_broker: fairq.Broker) -> None:
    q = await live_broker.declare_queue("flaky", visibility_timeout=5)
    await q.send({"order": "o-1"})
    attempts: list[int] = []
    worker = fairq.Worker(live_broker, handle_signals=False, poll_wait=0.1)

    @worker.queue(
        "flaky", retry=fairq.Backoff(base=0.05, jitter=0), idempotency=lambda m: m.json()["order"]
    )
    async def handle(msg: fairq.Received) -> None:
        attempts.append(msg.attempt)
        if msg.attempt == 1:
            raise RuntimeError("try again")

    async def done() -> bool:
        return (await q.stats()).acked == 1

    await run_until(worker, done)
    assert attempts == [1, 2]
    assert worker.stats.duplicates == 0
    record = await live_broker.idempotency("flaky", ttl=60).get("o-1")
    assert record is not None and record.completed


_DOOMED_WORKER = """
import asyncio, sys
import fairq

async def main(url, started):
    async with await fairq.connect(url) as broker:
        worker = fairq.Worker(broker, handle_signals=False, poll_wait=0.1)

        @worker.queue("mail", idempotency=lambda m: m.json()["to"])
        async def send_mail(msg):
            open(started, "w").close()
            await asyncio.sleep(3600)  # killed here, holding the claim

        await worker.run()

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


async def test_a_message_whose_worker_was_killed_mid_handler_runs_again(tmp_path: Path) -> None:
    """kill -9 while the handler runs: the message lease and the claim lease run out about
    together, in either order; the redelivered message must run, never count as its own
    duplicate."""
    url = f"sqlite:///{tmp_path / 'kill.db'}"
    started = tmp_path / "started"
    async with await fairq.connect(url) as broker:
        q = await broker.declare_queue("mail", visibility_timeout=1.0)
        mid = await q.send({"to": "fan-1"})
        doomed = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _DOOMED_WORKER, url, str(started)
        )
        try:
            for _ in range(500):
                if started.exists():
                    break
                await asyncio.sleep(0.02)
            assert started.exists(), "the first worker never ran the handler"
            await asyncio.sleep(0.3)  # let it extend both leases at least once
        finally:
            doomed.kill()
            await doomed.wait()
        ran: list[str] = []
        worker = fairq.Worker(broker, handle_signals=False, poll_wait=0.1)

        @worker.queue("mail", idempotency=lambda m: m.json()["to"])
        async def send_mail(msg: fairq.Received) -> None:
            ran.append(msg.id)

        async def done() -> bool:
            return (await q.stats()).acked == 1

        await run_until(worker, done)
    assert ran == [mid]
    assert worker.stats.duplicates == 0


def test_idempotent_by_checks_its_arguments() -> None:
    with pytest.raises(fairq.InvalidOption):
        fairq.IdempotentBy("order")  # type: ignore[arg-type]
    with pytest.raises(fairq.InvalidName):
        fairq.IdempotentBy(lambda m: m.id, namespace="bad name")
    with pytest.raises(fairq.InvalidOption):
        fairq.IdempotentBy(lambda m: m.id, ttl=0)


@dataclasses.dataclass
class Point:
    x: float


async def test_a_result_with_nan_is_refused_not_changed(broker: fairq.Broker) -> None:
    """JSON has no NaN or infinity: such a result is refused (orjson wrote null, so it came
    back as None without a word). A message body is not walked for them (the send path's
    cost): there they become null, as documented."""
    store = broker.idempotency("finite", ttl=100)
    claim = await store.claim("k")
    assert claim is not None
    for bad in (float("nan"), {"total": float("inf")}, [1.0, -float("inf")], Point(float("nan"))):
        with pytest.raises(fairq.InvalidMessage, match="NaN or infinite"):
            await claim.complete(bad)
    await claim.complete({"total": None, "n": 1.5})  # a null of its own is fine
    record = await store.get("k")
    assert record is not None and record.result == {"total": None, "n": 1.5}
    q = await broker.declare_queue("finite")
    await q.send({"price": float("nan")})
    (m,) = await q.receive()
    assert m.json() == {"price": None}
