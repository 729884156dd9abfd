"""``fairq.connect_sync``: the same API, blocking, with no hand-copied twins."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

import fairq


@pytest.mark.parametrize("scheme", ["memory", "sqlite"])
def test_blocking_round_trip(tmp_path: Path, scheme: str) -> None:
    url = "memory://" if scheme == "memory" else f"sqlite:///{tmp_path / 's.db'}"
    with fairq.connect_sync(url) as broker:
        q = broker.declare_queue("sync", max_attempts=2)
        assert q.name == "sync"
        ids = q.send_batch([fairq.Outgoing(b"a"), fairq.Outgoing({"n": 1})])
        assert len(ids) == 2
        a, b = q.receive(max_messages=2)
        assert (a.body, b.json(), b.attempt) == (b"a", {"n": 1}, 1)
        a.ack()
        b.nack()
        with pytest.raises(fairq.LeaseLost):
            a.ack()
        (again,) = q.receive(wait=1)
        assert again.attempt == 2
        again.dead_letter("done with it")
        s = q.stats()
        assert (s.acked, s.nacked, s.dead_lettered) == (1, 1, 1)
        assert broker.list_queues() == ["sync", "sync.dlq"]
        assert broker.redrive("sync.dlq") == 1


def test_blocking_calls_from_threads(tmp_path: Path) -> None:
    with fairq.connect_sync(f"sqlite:///{tmp_path / 't.db'}") as broker:
        q = broker.declare_queue("threads")

        def produce() -> None:
            for _ in range(50):
                q.send(b"x")

        threads = [threading.Thread(target=produce) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert q.stats().sent == 200


def test_errors_surface_unchanged() -> None:
    with fairq.connect_sync("memory://") as broker:
        with pytest.raises(fairq.QueueNotFound):
            broker.queue("nope").send(b"x")
        with pytest.raises(fairq.InvalidName):
            broker.declare_queue("bad name")
    with pytest.raises(fairq.ConnectionError):
        fairq.connect_sync("bogus://x")


def test_async_context_managers_and_iterators_block_too(tmp_path: Path) -> None:
    """``with store.once(...)``, ``with topic.listen()`` and ``for m in listener`` as in
    async code (README: "the same API blocks")."""
    with fairq.connect_sync(f"sqlite:///{tmp_path / 'c.db'}") as broker:
        store = broker.idempotency("mailer")
        with store.once("order-1", lease=5) as first:
            assert first is True
        with store.once("order-1") as again:
            assert again is False, "done once already"
        with pytest.raises(RuntimeError), store.once("order-2") as first:
            raise RuntimeError("the block failed: the claim is released")
        with store.once("order-2") as first:
            assert first is True, "a retry runs"
        t = broker.declare_topic("orders")
        with t.listen() as listener:
            t.publish({"n": 1})
            t.publish({"n": 2})
            got = []
            for m in listener:
                got.append(m.json()["n"])
                if len(got) == 2:
                    break
        assert got == [1, 2]
        with pytest.raises(TypeError, match="not a context manager"), broker.queue("x"):
            pass
