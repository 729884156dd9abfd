"""A hypothesis state machine drives one queue with random sends, receives, acks, nacks,
extends and clock moves, and checks every answer against a small reference model of
SPEC §3 (order, leases, attempts, dead letters, stats). Runs on every backend through
the blocking facade, with a manual clock.
"""

from __future__ import annotations

import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass
from typing import Any

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import fairq
from fairq.backends.open import backend_class
from services import BACKENDS, SCHEMES, backend_url, drop_namespace, rabbit_vhost, require

MAX_ATTEMPTS = 3
LEASE = 10.0


@dataclass
class Msg:
    id: str
    prio: int
    avail: float  # ready: when it became visible; delayed/leased: when it comes due
    state: str  # "ready" | "delayed" | "leased"
    attempt: int = 0
    receipt: str | None = None
    seq: int = 0  # when it (last) became available, as an event count: RabbitMQ's tie-break


class Model:
    """What SPEC §3 says the queue holds."""

    def __init__(self, arrival_ties: bool = False) -> None:
        self.msgs: dict[str, Msg] = {}
        self.dead = 0
        self.arrival_ties = arrival_ties
        self.events = 0

    def arrived(self, m: Msg) -> None:
        self.events += 1
        m.seq = self.events

    def settle_time(self, now: float) -> None:
        for m in sorted(self.msgs.values(), key=lambda m: m.avail):
            if m.state != "ready" and m.avail <= now:
                self.arrived(m)
                if m.state == "leased" and m.attempt >= MAX_ATTEMPTS:
                    self.dead_letter(m)
                else:
                    m.state, m.receipt = "ready", None

    def dead_letter(self, m: Msg) -> None:
        del self.msgs[m.id]
        self.dead += 1

    def delivery_order(self) -> list[Msg]:
        ready = [m for m in self.msgs.values() if m.state == "ready"]
        if self.arrival_ties:
            return sorted(ready, key=lambda m: (-m.prio, m.avail, m.seq))
        return sorted(ready, key=lambda m: (-m.prio, m.avail, m.id))

    def current(self, receipt: str, now: float) -> Msg | None:
        for m in self.msgs.values():
            if m.state == "leased" and m.receipt == receipt and m.avail > now:
                return m
        return None


class QueueMachine(RuleBasedStateMachine):
    """On a backend whose capability table lacks ``clock.delays`` every delay is 0 (the
    manual clock cannot end them), without ``priority.prefetch`` every priority is 0, and
    without ``order.ties`` messages that become available at the same instant are delivered
    in the order they did (not in send order)."""

    backend = "memory"

    def __init__(self) -> None:
        super().__init__()
        from pathlib import Path

        missing = backend_class(SCHEMES.get(self.backend, self.backend)).missing
        self.delays = "clock.delays" not in missing
        self.priorities = "priority.prefetch" not in missing
        self.dir = tempfile.mkdtemp(prefix="fairq-model-")
        self._vhost = rabbit_vhost() if self.backend == "amqp" else None
        # each example its own namespace (key prefix, vhost), removed at teardown
        namespace = (
            self._vhost.__enter__() if self._vhost is not None else f"model-{uuid.uuid4().hex}"
        )
        self.url = url = backend_url(self.backend, Path(self.dir), namespace)
        self.clock = fairq.ManualClock()
        self.broker = fairq.connect_sync(url, clock=self.clock)
        self.q = self.broker.declare_queue(
            "model",
            visibility_timeout=LEASE,
            max_attempts=MAX_ATTEMPTS,
            max_priority=2 if self.priorities else 0,
        )
        self.dlq = self.broker.queue("model.dlq")
        self.model = Model(arrival_ties="order.ties" in missing)
        self.deliveries: list[Any] = []

    def teardown(self) -> None:
        self.broker.close()
        drop_namespace(self.url)
        if self._vhost is not None:
            self._vhost.__exit__(None, None, None)
        shutil.rmtree(self.dir, ignore_errors=True)

    @property
    def now(self) -> float:
        return self.clock.now()

    @rule(prio=st.integers(0, 2), delay=st.sampled_from([0.0, 0.0, 1.5, 5.0]))
    def send(self, prio: int, delay: float) -> None:
        prio, delay = (prio if self.priorities else 0), (delay if self.delays else 0.0)
        mid = self.q.send(b"x", priority=prio, delay=delay)
        self.model.settle_time(self.now)
        state = "delayed" if delay > 0 else "ready"
        self.model.msgs[mid] = Msg(mid, prio, self.now + delay, state)
        if state == "ready":
            self.model.arrived(self.model.msgs[mid])

    @rule(prios=st.lists(st.integers(0, 2), min_size=1, max_size=5))
    def send_batch(self, prios: list[int]) -> None:
        prios = prios if self.priorities else [0] * len(prios)
        ids = self.q.send_batch([fairq.Outgoing(b"b", priority=p) for p in prios])
        assert ids == sorted(ids) and len(set(ids)) == len(ids)
        self.model.settle_time(self.now)
        for mid, p in zip(ids, prios, strict=True):
            self.model.msgs[mid] = Msg(mid, p, self.now, "ready")
            self.model.arrived(self.model.msgs[mid])

    @rule(n=st.integers(1, 4), lease=st.sampled_from([None, 3.0]))
    def receive(self, n: int, lease: float | None) -> None:
        got = self.q.receive(max_messages=n, visibility_timeout=lease)
        self.model.settle_time(self.now)
        expected = self.model.delivery_order()[:n]
        assert [m.id for m in got] == [m.id for m in expected]
        for m, want in zip(got, expected, strict=True):
            want.attempt += 1
            assert m.attempt == want.attempt
            assert m.priority == want.prio
            want.state, want.receipt = "leased", m.receipt
            want.avail = self.now + (LEASE if lease is None else lease)
            self.deliveries.append(m)

    def _pick(self, index: int) -> tuple[object, Msg | None]:
        """A delivery seen so far (maybe stale) and the model's message it still leases."""
        delivery = self.deliveries[index % len(self.deliveries)]
        self.model.settle_time(self.now)
        return delivery, self.model.current(delivery.receipt, self.now)

    @precondition(lambda self: self.deliveries)
    @rule(index=st.integers(0, 1000))
    def ack(self, index: int) -> None:
        delivery, target = self._pick(index)
        try:
            delivery.ack()
        except fairq.LeaseLost:
            assert target is None, "ack of a current lease raised LeaseLost"
            return
        assert target is not None, "ack of a stale receipt succeeded"
        del self.model.msgs[target.id]

    @precondition(lambda self: self.deliveries)
    @rule(index=st.integers(0, 1000), delay=st.sampled_from([0.0, 2.0]))
    def nack(self, index: int, delay: float) -> None:
        delay = delay if self.delays else 0.0
        delivery, target = self._pick(index)
        try:
            delivery.nack(delay)
        except fairq.LeaseLost:
            assert target is None, "nack of a current lease raised LeaseLost"
            return
        assert target is not None, "nack of a stale receipt succeeded"
        if target.attempt >= MAX_ATTEMPTS:
            self.model.dead_letter(target)
        elif delay > 0:
            target.state, target.receipt, target.avail = "delayed", None, self.now + delay
        else:
            target.state, target.receipt, target.avail = "ready", None, self.now
            self.model.arrived(target)

    @precondition(lambda self: self.deliveries)
    @rule(index=st.integers(0, 1000), seconds=st.sampled_from([1.0, 20.0]))
    def extend(self, index: int, seconds: float) -> None:
        delivery, target = self._pick(index)
        try:
            delivery.extend(seconds)
        except fairq.LeaseLost:
            assert target is None, "extend of a current lease raised LeaseLost"
            return
        assert target is not None, "extend of a stale receipt succeeded"
        target.avail = self.now + seconds

    @rule(dt=st.sampled_from([0.5, 1.0, 3.0, 7.0]))
    def advance(self, dt: float) -> None:
        self.clock.advance(dt)

    @invariant()
    def stats_match(self) -> None:
        s = self.q.stats()
        self.model.settle_time(self.now)
        states = [m.state for m in self.model.msgs.values()]
        want = (states.count("ready"), states.count("delayed"), states.count("leased"))
        if self.backend == "amqp":  # RabbitMQ counts a requeued message a moment later
            for _ in range(20):
                if (s.visible, s.delayed, s.in_flight) == want:
                    break
                time.sleep(0.1)
                s = self.q.stats()
        assert (s.visible, s.delayed, s.in_flight) == want
        assert s.dead_lettered == self.model.dead
        assert self.dlq.stats().visible == self.model.dead


SETTINGS = settings(
    max_examples=40,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

for _backend in BACKENDS:

    class _Machine(QueueMachine):
        backend = _backend

    _test = _Machine.TestCase
    _test.settings = SETTINGS

    def _setup(self: object, _b: str = _backend) -> None:
        require(_b)

    _test.setUp = _setup  # type: ignore[method-assign]
    globals()[f"TestQueueModel_{_backend}"] = _test

del _test, _Machine, _setup
