"""Lease tokens (``fairq.message.new_lease``): drawn from the OS CSPRNG in 4 KiB reads,
never 0, at most 62 bits, never the same twice in one process, its threads, or a child
forked from it."""

from __future__ import annotations

import os
import sys
import threading

import pytest

from fairq.message import new_lease


def test_tokens_are_odd_62_bit_and_distinct_across_many_refills() -> None:
    tokens = [new_lease() for _ in range(5000)]  # ~10 reads of 4 KiB
    assert len(set(tokens)) == len(tokens)
    assert all(t & 1 and 0 < t < 1 << 62 for t in tokens)
    assert max(t.bit_length() for t in tokens) > 55  # the whole range is used


def test_threads_never_take_the_same_token() -> None:
    got: list[list[int]] = [[] for _ in range(4)]

    def draw(out: list[int]) -> None:
        for _ in range(3000):
            out.append(new_lease())

    threads = [threading.Thread(target=draw, args=(out,)) for out in got]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [t for out in got for t in out]
    assert len(set(every)) == len(every)


@pytest.mark.skipif(not hasattr(os, "fork") or sys.platform == "win32", reason="needs fork")
def test_a_forked_child_does_not_repeat_its_parents_tokens() -> None:
    new_lease()  # the parent has bytes left in its buffer when it forks
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.write(w, ",".join(str(new_lease()) for _ in range(20)).encode())
        os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    with os.fdopen(r, "rb") as f:
        child = {int(x) for x in f.read().decode().split(",")}
    parent = {new_lease() for _ in range(20)}
    assert len(child) == 20 and not child & parent
