"""How fairq's queues, topics and delays map onto RabbitMQ's exchanges, queues and arguments.

Everything fairq declares is durable; its own objects carry a ``/`` in their names, which
fairq names never have, so they cannot collide with a user's queue or topic.

* **A queue** ``Q`` is the RabbitMQ queue ``Q``: a quorum queue (replicated, ordered, with
  ``x-delivery-count``), or a classic queue where quorum queues of RabbitMQ 3.x fall short:
  with priorities (``x-max-priority``; quorum queues have none) or a ``max_length`` (a quorum
  queue applies ``x-max-length`` after the fact and can go one message over). Arguments:
  ``x-message-ttl`` = retention, ``x-max-length`` + ``x-overflow`` (``reject-publish`` for
  ``reject``, ``drop-head`` for ``drop_oldest``), and the dead-letter exchange ``fairq/dlx``
  with the routing key ``Q``: the broker dead-letters what it expires or drops there, and
  ``fairq/dlx`` routes key ``Q`` to ``Q``'s dead-letter queue (a binding, so ``dead_letter``
  can change; no binding is ``dead_letter=None``: the broker discards).
* **A topic** ``T`` is the topic exchange ``T``; a subscription ``S`` is the queue ``T.S``
  bound to it with its routing pattern (``#`` for none), so any AMQP publisher's messages
  reach it. A subscription with an attribute filter is not bound: fairq's publisher
  evaluates the filter and sends it the messages that match (``topics.py``).
* **A delay** is a walk down a wheel of ``LEVELS`` TTL queues: level ``i`` holds a message
  for ``2**i`` units of ``UNIT`` seconds (a queue-wide TTL, so its queue is FIFO by expiry
  and never blocks a short delay behind a long one). The routing key spells the delay in
  binary, one word per level, highest first, then the target queue's name; level
  exchange ``i`` sends a message whose bit ``i`` is 1 to its level queue and one whose bit is
  0 on to level ``i-1``; a level queue dead-letters into the next level's exchange; the
  last level hands over to ``fairq/due``, where each queue is bound by its own name.
  RabbitMQ's clock decides when a delay ends; a message passes at most ``LEVELS`` queues.
  There are two wheels, declared when first needed. **The durable wheel** ``fairq/wheel/NN``
  (every queue but one below): quorum level queues that dead-letter **at least once**
  (``x-dead-letter-strategy``), so a hop leaves a level only once the next queue has
  confirmed the message and a broker crash mid-hop cannot lose it (it may pass a hop
  twice). Its last level hands over to ``fairq/due/durable`` instead, where only queues
  that never refuse a message are bound (not a bounded queue with ``overflow="reject"``,
  bound at declaration by the process that knows its options), and everything also goes to
  ``fairq/due/void``, a classic queue with a TTL of 0 that keeps nothing: every hop can be
  confirmed, and a delay whose queue was deleted (or declared again as a rejecting one)
  ends there instead of being retried by the broker, holding up the level behind it.
  **The classic wheel** ``fairq/delay/NN`` (classic queues, at-most-once dead-lettering)
  serves a bounded queue with ``overflow="reject"``: such a queue refuses a due message
  while it is full, which the durable wheel would retry without end, holding up the other
  queues' due messages behind it; the classic wheel drops it, as RabbitMQ does a refused
  dead letter.
"""

from __future__ import annotations

import math
from typing import Any

from ...errors import Unsupported
from ...model.queues import QueueConfig

__all__ = [
    "CLASSIC",
    "DLX",
    "DUE",
    "DUE_DURABLE",
    "DURABLE",
    "DURABLE_SINCE",
    "LEVELS",
    "RESERVED",
    "UNIT",
    "VOID",
    "VOID_ARGUMENTS",
    "delay_route",
    "due_pattern",
    "hop_queues",
    "level_exchange",
    "level_queue",
    "queue_arguments",
    "quorum",
    "subscription_pattern",
    "wheel",
    "wheel_for",
]

#: names fairq keeps for itself in the store: ``fairq:<work queue>`` holds the tickets of an
#: attention work queue (``attention.py``); no queue of the user's may start with it
RESERVED = "fairq:"
DLX = "fairq/dlx"  # direct: dead letters by source queue name -> its dead-letter queue
DUE = "fairq/due"  # topic: the end of every delay -> the target queue
DUE_DURABLE = "fairq/due/durable"  # topic: the same for the durable wheel (no refusing queue)
VOID = "fairq/due/void"  # classic, TTL 0: bound to DUE_DURABLE by "#", every hop confirmed
DURABLE, CLASSIC = "fairq/wheel", "fairq/delay"  # the two delay wheels (name prefixes)
DURABLE_SINCE = (3, 10)  # the RabbitMQ of quorum TTL and at-least-once dead-lettering
LEVELS = 29  # 2**29 units of 10 ms: delays up to 62 days
UNIT = 0.01  # seconds per unit of the delay wheel
MAX_TTL_MS = 2**32 - 1  # the largest x-message-ttl RabbitMQ takes
MAX_DELAY = (2**LEVELS - 1) * UNIT
ROUTING_KEY_MAX = 255


def quorum(config: QueueConfig) -> bool:
    """A fairq queue is a quorum queue unless it has priorities or a max_length (classic)."""
    return config.max_priority == 0 and config.max_length is None


def queue_arguments(name: str, config: QueueConfig, classic: bool = False) -> dict[str, Any]:
    """The ``queue.declare`` arguments of fairq queue ``name`` (a classic queue whatever
    its options with ``classic``: an attention work queue and its dead-letter queue)."""
    if config.fifo:
        raise Unsupported(
            "FIFO groups (fifo=True) are not available on RabbitMQ: one queue delivers to "
            "competing consumers without per-group leases (capability 'fifo')"
        )
    if config.overflow == "block":
        raise Unsupported(
            "overflow='block' is not available on RabbitMQ: use 'reject' (reject-publish) or "
            "'drop_oldest' (drop-head) (capability 'overflow.block')"
        )
    if config.max_length is not None and config.overflow == "drop_oldest" and config.max_priority:
        raise Unsupported(
            "overflow='drop_oldest' with priorities is not available on RabbitMQ: drop-head "
            "drops the head of a priority queue, its highest-priority message, not the oldest "
            "(capability 'overflow.drop_oldest.priority')"
        )
    ttl = math.ceil(config.retention * 1000)
    if ttl > MAX_TTL_MS:
        raise Unsupported(
            f"retention above {MAX_TTL_MS / 1000:g} s is not available on RabbitMQ "
            "(x-message-ttl is a 32-bit number of milliseconds)"
        )
    args: dict[str, Any] = {
        "x-message-ttl": ttl,
        "x-dead-letter-exchange": DLX,
        "x-dead-letter-routing-key": name,
    }
    if quorum(config) and not classic:
        args["x-queue-type"] = "quorum"
    else:
        args["x-queue-type"] = "classic"
        args["x-max-priority"] = config.max_priority
    if config.max_length is not None:
        args["x-max-length"] = config.max_length
        args["x-overflow"] = "reject-publish" if config.overflow == "reject" else "drop-head"
    return args


def level_exchange(i: int, kind: str = DURABLE) -> str:
    return f"{kind}/{i:02d}"


def level_queue(i: int, kind: str = DURABLE) -> str:
    return f"{kind}/{i:02d}"


def hop_queues() -> frozenset[str]:
    """Every queue a delay passes through, in either wheel: a hop is not a death
    (``x-death`` entries from these are not dead-letter attributes)."""
    return frozenset(level_queue(i, kind) for i in range(LEVELS) for kind in (DURABLE, CLASSIC))


VOID_ARGUMENTS: dict[str, Any] = {"x-queue-type": "classic", "x-message-ttl": 0}


def _pattern(level: int, bit: str) -> str:
    return "*." * (LEVELS - 1 - level) + bit + ".#"


def wheel(kind: str) -> list[tuple[str, str, dict[str, Any], list[tuple[str, str, str]]]]:
    """The delay wheel ``kind`` (:data:`DURABLE` or :data:`CLASSIC`): per level (exchange,
    queue, queue arguments, bindings), bindings as (what, destination, pattern) with what
    ``queue`` or ``exchange``."""
    levels = []
    end = DUE_DURABLE if kind == DURABLE else DUE
    for i in range(LEVELS - 1, -1, -1):
        after = level_exchange(i - 1, kind) if i > 0 else end
        args: dict[str, Any] = {
            "x-queue-type": "classic",
            "x-message-ttl": round((2**i) * UNIT * 1000),
            "x-dead-letter-exchange": after,
        }
        if kind == DURABLE:
            args["x-queue-type"] = "quorum"
            args["x-dead-letter-strategy"] = "at-least-once"
            args["x-overflow"] = "reject-publish"  # what at-least-once dead-lettering requires
        bindings = [
            ("queue", level_queue(i, kind), _pattern(i, "1")),
            ("exchange", after, _pattern(i, "0")),
        ]
        levels.append((level_exchange(i, kind), level_queue(i, kind), args, bindings))
    return levels


def wheel_for(config: QueueConfig) -> str:
    """The wheel a delay to a queue with ``config`` takes (see the module docstring)."""
    return CLASSIC if config.max_length is not None and config.overflow == "reject" else DURABLE


def delay_route(delay: float, target: str, kind: str = DURABLE) -> tuple[str, str]:
    """(exchange, routing key) that brings a message to queue ``target`` after ``delay`` s."""
    units = math.ceil(delay / UNIT - 1e-9)
    if units <= 0:  # a delay too short to count: none
        return "", target
    if units >= 2**LEVELS:
        raise Unsupported(f"delays above {MAX_DELAY:g} s are not available on RabbitMQ")
    bits = format(units, f"0{LEVELS}b")
    key = ".".join(bits) + "." + target
    if len(key) > ROUTING_KEY_MAX:
        raise Unsupported(
            f"a delay to queue {target!r} does not fit a routing key: delays need queue "
            f"names of at most {ROUTING_KEY_MAX - 2 * LEVELS} characters"
        )
    # straight to the exchange of the highest bit set: the levels above would only pass
    # the message down (each pass a topic match in the broker, 29 of them for a short delay)
    return level_exchange(units.bit_length() - 1, kind), key


def due_pattern(queue: str) -> str:
    """The binding of ``queue`` on ``fairq/due``: any delay bits, then its name."""
    return "*." * LEVELS + queue


def subscription_pattern(routing: str | None) -> str:
    """The binding pattern of a subscription on its topic exchange."""
    return "#" if routing is None else routing
