"""Message rules every backend applies alike, as pure functions: the attributes of a dead
letter and of a redriven one, deduplication within and across sends, which subscriptions
a publish reaches and what it answers, priority checks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from ..errors import InvalidOption
from ..message import MAX_DETAIL, format_id
from ..model.queues import Envelope
from ..model.topics import PublishResult, Subscription, SubscriptionIndex

__all__ = [
    "ROUTING_KEY",
    "CopyPlan",
    "DedupPlan",
    "check_priorities",
    "dead_letter_attributes",
    "plan_dedup",
    "publish_plan",
    "publish_results",
    "redrive_attributes",
]

#: the attribute a topic copy carries its routing key in
ROUTING_KEY = "fairq.routing_key"


def dead_letter_attributes(
    attributes: Mapping[str, str],
    reason: str,
    source: str,
    message_id: str,
    attempts: int,
    detail: str | None = None,
) -> dict[str, str]:
    """The attributes a message carries into its dead-letter queue.

    ``fairq.original_id`` names the first id the message ever had, so a message that is
    redriven and dead-lettered again still points at its origin.
    """
    attrs = dict(attributes)
    attrs["fairq.reason"] = reason
    attrs["fairq.source"] = source
    attrs.setdefault("fairq.original_id", message_id)
    attrs["fairq.attempts"] = str(attempts)
    if detail and detail != reason:
        attrs["fairq.detail"] = detail[:MAX_DETAIL]
    else:
        attrs.pop("fairq.detail", None)
    return attrs


def redrive_attributes(attributes: Mapping[str, str]) -> dict[str, str]:
    """The attributes of a message leaving a dead-letter queue (its origin is kept)."""
    return {
        k: v
        for k, v in attributes.items()
        if k not in ("fairq.reason", "fairq.source", "fairq.attempts", "fairq.detail")
    }


@dataclass(slots=True)
class DedupPlan:
    """Which envelopes of one send are new, and the id each envelope answers with.

    ``slots`` is None when no envelope has a ``dedup_id`` (the common case: every one is
    new); else one ``(is_new, value)`` per envelope — an index into ``fresh``, or the id
    of the message first sent under that ``dedup_id``. ``first`` maps each new
    ``dedup_id`` to its index in ``fresh``, to be recorded by the backend.
    """

    fresh: list[Envelope]
    slots: list[tuple[bool, int]] | None
    first: dict[str, int]

    def answer(self, made: Sequence[int]) -> list[str]:
        """The ids to return, given the ids ``made`` for ``fresh``."""
        if self.slots is None:
            return [format_id(m) for m in made]
        return [format_id(made[v] if new else v) for new, v in self.slots]


def plan_dedup(envelopes: list[Envelope], sent_before: Callable[[str], int | None]) -> DedupPlan:
    """Split a send into new messages and duplicates (of earlier sends, or within the batch);
    ``sent_before(dedup_id)`` gives the id of a live earlier send, or None."""
    if all(e.dedup_id is None for e in envelopes):
        return DedupPlan(envelopes, None, {})
    fresh: list[Envelope] = []
    slots: list[tuple[bool, int]] = []
    first: dict[str, int] = {}
    for env in envelopes:
        key = env.dedup_id
        if key is not None:
            if key in first:
                slots.append((True, first[key]))
                continue
            earlier = sent_before(key)
            if earlier is not None:
                slots.append((False, earlier))
                continue
            first[key] = len(fresh)
        slots.append((True, len(fresh)))
        fresh.append(env)
    return DedupPlan(fresh, slots, first)


@dataclass(slots=True)
class CopyPlan:
    """What one publish stores: ``copies[i]`` is the copy of new publication ``i`` (with
    ``fairq.routing_key`` added when there is one), ``per_queue`` the indices of the
    copies each subscription queue gets, ``matched[i]`` the subscriptions of publication i."""

    copies: list[Envelope]
    per_queue: dict[str, list[int]]
    matched: list[list[str]]


def publish_plan(
    index: SubscriptionIndex, subscriptions: Mapping[str, Subscription], fresh: list[Envelope]
) -> CopyPlan:
    """Match each new publication against the topic's subscriptions."""
    per_queue: dict[str, list[int]] = {}
    matched: list[list[str]] = []
    copies: list[Envelope] = []
    key_attrs: dict[str, dict[str, str]] = {}  # one shared dict per routing key, if no others
    for i, env in enumerate(fresh):
        key = env.routing_key
        names = index.match(key, env.attributes)
        matched.append(names)
        attrs = env.attributes
        if key:
            if attrs:
                attrs = {**attrs, ROUTING_KEY: key}
            else:
                attrs = key_attrs.get(key) or key_attrs.setdefault(key, {ROUTING_KEY: key})
        copies.append(Envelope(env.body, attrs, env.delay))
        for name in names:
            queue = subscriptions[name].queue
            got = per_queue.get(queue)
            if got is None:
                per_queue[queue] = [i]
            else:
                got.append(i)
    return CopyPlan(copies, per_queue, matched)


def publish_results(
    plan: DedupPlan, made: Sequence[int], matched: list[list[str]], earlier: Mapping[int, list[str]]
) -> list[PublishResult]:
    """One ``PublishResult`` per envelope: new ones with their publication id ``made[i]``,
    duplicates with the first publish's id and subscriptions (``earlier``)."""
    if plan.slots is None:
        return [PublishResult(format_id(m), names) for m, names in zip(made, matched, strict=True)]
    out = []
    answered: set[int] = set()  # fresh publications already answered once in this batch
    for new, v in plan.slots:
        if new:
            out.append(PublishResult(format_id(made[v]), matched[v], v in answered))
            answered.add(v)
        else:
            out.append(PublishResult(format_id(v), earlier[v], True))
    return out


def check_priorities(queue: str, envelopes: Iterable[Envelope], max_priority: int) -> None:
    """Raise ``InvalidOption`` if an envelope's priority is above the queue's maximum."""
    for env in envelopes:
        if env.priority > max_priority:
            raise InvalidOption(
                f"priority {env.priority} is above queue {queue!r}'s max_priority {max_priority}"
            )
