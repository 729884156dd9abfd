"""A domain's shards, as every engine sees them: a key's shard is a stable hash (the same
in every process, host and Python version), the template names it, and the shard count
cannot change under keys. The client's view of Redis shards picks the shard whose first
tenant has the smallest virtual time, counting charges not yet passed there."""

from __future__ import annotations

import pytest

import fairq
from fairq.backends.attention_policy import check_change
from fairq.backends.redis.shards import Shards, shard_id, shard_of_token
from fairq.model.attention import AttentionConfig, default_work_queue, shard_of


def test_a_keys_shard_is_crc32_of_its_bytes() -> None:
    # pinned: a key must stay in its shard (its queue's name) across releases and hosts
    assert [shard_of(k, 8) for k in ("k1", "store-1", "a", "b")] == [1, 2, 3, 1]
    assert shard_of("ümlaut", 1) == 0
    assert {shard_of(f"k{i}", 16) for i in range(1000)} == set(range(16))


def one_dict() -> dict[str, object]:
    return AttentionConfig().to_dict()


def test_the_template_names_the_shard() -> None:
    c = AttentionConfig(shards=4, work_queue=default_work_queue(4)).validated("m")
    assert c.queue_for("m", "k1") == f"m-{shard_of('k1', 4)}.k1.work"
    assert c.shard_queue("m", 3) == "m-3.k.work"
    assert AttentionConfig.from_dict(c.to_dict()) == c
    stored_before_shards = {k: v for k, v in one_dict().items() if k != "shards"}
    assert AttentionConfig.from_dict(stored_before_shards).shards == 1
    one = AttentionConfig().validated("m")
    assert one.queue_for("m", "k1") == "process.m.k1.work"
    assert AttentionConfig(work_queue="{domain}-{shard}.{key}").validated("m").queue_for(
        "m", "k"
    ) == ("m-0.k")
    for bad in (0, 1025, 2.0, True):
        with pytest.raises(fairq.InvalidOption):
            AttentionConfig(shards=bad, work_queue=default_work_queue(4)).validated("m")  # type: ignore[arg-type]
    with pytest.raises(fairq.InvalidOption, match="shard"):
        AttentionConfig(shards=2).validated("m")


def test_the_shard_count_cannot_change_under_keys() -> None:
    old = AttentionConfig(shards=4, work_queue=default_work_queue(4))
    new = AttentionConfig(shards=8, work_queue=default_work_queue(8))
    check_change("m", old, new, has_keys=False)
    with pytest.raises(fairq.ConfigConflict, match="shards"):
        check_change("m", old, new, has_keys=True)


def test_shard_ids_and_tokens() -> None:
    assert shard_id("m", 0, 1) == "m" and shard_id("m", 3, 4) == "m#3"
    assert shard_of_token("ab12cd") == 0 and shard_of_token("ab12cd-7") == 7


def _shards(n: int) -> Shards:
    return Shards("m", [shard_id("m", i, n) for i in range(n)], [f"m-{i}" for i in range(n)])


def test_a_take_goes_to_the_shard_whose_first_tenant_is_furthest_behind() -> None:
    sh = _shards(3)
    sh.learn(0, "10 - 2 B 5 A 7")
    sh.learn(1, "10 - 1 B 6")
    sh.learn(2, "10 12.5 0")
    assert sh.order() == [0, 1, 2]
    # B was charged 4 elsewhere: shard 0's first tenant now is A (7), shard 1's B (6 + 4)
    sh.charged(2, "B", "4")
    assert sh.order() == [0, 1, 2]
    sh.charged(2, "B", "4")  # B at 13 in shard 0, 14 in shard 1: A's 7 is the least
    assert sh.order()[0] == 0
    sh.learn(0, "10 - 1 A 9")
    sh.learn(1, "10 - 1 B 3")  # shard 1's B: 3 + 8 pending
    assert sh.order() == [0, 1, 2]
    # a shard listing fewer tenants than it has: the rest are at least the last one listed
    sh.learn(1, "10 - 5 B 3")
    assert sh.order() == [1, 0, 2]
    assert sh.sync_args(1) == ("10.0", "B 8.0")
    assert sh.sync_args(1) == ("10.0", "")


def test_ties_go_round_and_unknown_shards_come_before_empty_ones() -> None:
    sh = _shards(3)
    assert set(sh.order()) == {0, 1, 2}
    for i in range(3):
        sh.learn(i, "0 - 1 B 5")
    firsts = []
    for _ in range(6):
        first = sh.order()[0]
        sh.took(first)
        firsts.append(first)
    assert sorted(firsts) == [0, 0, 1, 1, 2, 2]
    sh.learn(0, "0 99 0")
    sh.changed(1)  # a wake-up for a shard with a ready signal changes nothing
    assert sh.views[1].ready
    sh.learn(1, "0 - 0")
    sh.changed(1)  # for one with none: look again
    assert sh.views[1].ready is None
    assert sh.order()[-1] == 0 and sh.order()[1] == 1
    assert sh.unknown(now=0.0) == [1]
    assert sh.unknown(now=100.0) == [0, 1], "shard 0's due time has passed"
    assert sh.next_due() == 99.0


def test_a_reply_older_than_a_wake_up_does_not_undo_it() -> None:
    """A look reads the shard while a slice still runs (its next due time: the slice's lease
    end, 30 s on); the slice ends meanwhile with a signal due soon, whose reply and wake-up
    are learnt before the look's reply: that reply must not hide the signal (the stall of
    test_a_due_signal_costs_one_take_however_many_takers on Redis Cluster)."""
    sh = _shards(1)
    sh.learn(0, "0 130 0")  # a slice runs until 130
    since = sh.mark(0)  # the look starts
    sh.learn(0, "0 100.025 0", sh.mark(0))  # the slice's end: a signal due at 100.025
    sh.changed(0)  # its wake-up
    sh.learn_look(0, [0, b"130"], since)  # the look's reply, read before the end
    assert sh.views[0].ready is None, "look again"
    assert sh.unknown(now=100.0) == [0]
    sh.learn_look(0, [0, b"100.025"], sh.mark(0))  # the look again: the signal
    assert sh.views[0].ready is False and sh.next_due() == 100.025
    # a take's reply likewise: the wake-up came while it was on its way
    since = sh.mark(0)
    sh.changed(0)
    sh.learn(0, "0 130 0", since)
    assert sh.views[0].ready is None
    # nothing came meanwhile: the reply holds
    sh.learn(0, "0 130 0", sh.mark(0))
    assert sh.views[0].ready is False and sh.unknown(now=100.0) == []
