"""What a queue is, as handles and backends both see it: its options
(:class:`QueueConfig`, checked from ``declare_queue``'s keywords), its statistics
(:class:`QueueStats`) and a message as the backend stores it (:class:`Envelope`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Literal

from ..errors import ConfigConflict, InvalidName, InvalidOption
from ..message import MAX_NAME, check_name, check_number

__all__ = [
    "DEFAULT",
    "MAX_GROUP",
    "MAX_PRIORITY_LIMIT",
    "MAX_RETENTION",
    "QUEUE_COUNTERS",
    "Envelope",
    "Overflow",
    "QueueConfig",
    "QueueStats",
    "check_count",
    "queue_config_from_options",
]


Overflow = Literal["reject", "drop_oldest", "block"]


_OVERFLOWS = ("reject", "drop_oldest", "block")


MAX_PRIORITY_LIMIT = 255


MAX_RETENTION = 1e10  # seconds (317 years): keeps every deadline inside a 64-bit id


MAX_GROUP = 128


#: the most max_attempts and max_length can be, on every engine (PostgreSQL keeps them in
#: 32-bit columns; RabbitMQ's x-max-length is far larger)
MAX_COUNT_OPTION = 2**31 - 1


def check_count(name: str, value: object, *, minimum: int, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidOption(f"{name} must be an integer, got {value!r}")
    if value < minimum or (maximum is not None and value > maximum):
        bound = f"between {minimum} and {maximum}" if maximum is not None else f">= {minimum}"
        raise InvalidOption(f"{name} must be {bound}, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class QueueConfig:
    """The options of one queue (see ``Broker.declare_queue`` for their meaning)."""

    visibility_timeout: float = 30.0
    max_attempts: int | None = 5
    dead_letter: str | None = None
    retention: float = 1_209_600.0
    max_length: int | None = None
    overflow: Overflow = "reject"
    fifo: bool = False
    max_priority: int = 0
    dedup_window: float = 300.0
    freshness_slo: float | None = None

    def validated(self, name: str) -> QueueConfig:
        """Check every option; raise ``InvalidOption``/``ConfigConflict`` naming the bad one."""
        check_number("visibility_timeout", self.visibility_timeout, strict=True)
        if self.max_attempts is not None:
            check_count("max_attempts", self.max_attempts, minimum=1, maximum=MAX_COUNT_OPTION)
        if self.dead_letter is not None:
            check_name(self.dead_letter, "dead-letter queue")
            if self.dead_letter == name:
                raise ConfigConflict(f"queue {name!r} cannot be its own dead-letter queue")
        if check_number("retention", self.retention, strict=True) > MAX_RETENTION:
            raise InvalidOption(
                f"retention must be at most {MAX_RETENTION:g} s, got {self.retention!r}"
            )
        if self.max_length is not None:
            check_count("max_length", self.max_length, minimum=1, maximum=MAX_COUNT_OPTION)
        if self.overflow not in _OVERFLOWS:
            raise InvalidOption(
                f"overflow must be one of {', '.join(_OVERFLOWS)}, got {self.overflow!r}"
            )
        if not isinstance(self.fifo, bool):
            raise InvalidOption(f"fifo must be True or False, got {self.fifo!r}")
        check_count("max_priority", self.max_priority, minimum=0, maximum=MAX_PRIORITY_LIMIT)
        if self.fifo and self.max_priority > 0:
            raise ConfigConflict(
                "a fifo queue has no priorities: use max_priority=0 with fifo=True"
            )
        check_number("dedup_window", self.dedup_window)
        if self.freshness_slo is not None:
            check_number("freshness_slo", self.freshness_slo, strict=True)
        return replace(
            self,
            visibility_timeout=float(self.visibility_timeout),
            retention=float(self.retention),
            dedup_window=float(self.dedup_window),
            freshness_slo=None if self.freshness_slo is None else float(self.freshness_slo),
        )

    def check_change(self, name: str, new: QueueConfig) -> None:
        """Raise ``ConfigConflict`` if re-declaring with ``new`` changes what cannot change."""
        for option in ("fifo", "max_priority"):
            old_value, new_value = getattr(self, option), getattr(new, option)
            if old_value != new_value:
                raise ConfigConflict(
                    f"queue {name!r} was declared with {option}={old_value!r}; it cannot change "
                    f"to {new_value!r} (delete the queue and declare it again)"
                )

    @staticmethod
    def for_dead_letters() -> QueueConfig:
        """The options of an automatically declared dead-letter queue."""
        return QueueConfig(dead_letter=None, max_attempts=None)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> QueueConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


#: the counters of :class:`QueueStats`, as every backend keeps them per queue
QUEUE_COUNTERS = ("sent", "acked", "nacked", "redelivered", "dead_lettered", "expired", "discarded")


@dataclass(frozen=True, slots=True)
class QueueStats:
    """A queue's state now and its counters since it was declared.

    ``visible`` counts messages a receiver could take now (in a FIFO queue, also those
    waiting behind their group's head); ``oldest_age`` is the age in seconds of the oldest
    message not yet acked (0.0 when empty). ``breaching`` is True when ``freshness_slo``
    is set and ``oldest_age`` exceeds it.
    """

    visible: int = 0
    delayed: int = 0
    in_flight: int = 0
    oldest_age: float = 0.0
    sent: int = 0
    acked: int = 0
    nacked: int = 0
    redelivered: int = 0
    dead_lettered: int = 0
    expired: int = 0
    discarded: int = 0
    freshness_slo: float | None = field(default=None)
    breaching: bool = field(default=False)

    @property
    def depth(self) -> int:
        """Every stored message: visible + delayed + in flight."""
        return self.visible + self.delayed + self.in_flight


@dataclass(slots=True)
class Envelope:
    """A message as the backend stores it: encoded body and attributes, checked options
    (``routing_key`` only for topics)."""

    body: bytes
    attributes: dict[str, str]
    delay: float = 0.0
    priority: int = 0
    group: str | None = None
    dedup_id: str | None = None
    routing_key: str = ""


DEFAULT: Any = object()  # "argument not given", where None means something


_QUEUE_OPTIONS = frozenset(f.name for f in fields(QueueConfig))


def queue_config_from_options(name: str, options: Mapping[str, Any]) -> QueueConfig:
    """The checked ``QueueConfig`` of queue ``name`` from ``declare_queue``'s keyword options
    (``dead_letter`` left out or ``DEFAULT`` means ``"<name>.dlq"``)."""
    check_name(name)
    unknown = set(options) - _QUEUE_OPTIONS
    if unknown:
        raise InvalidOption(
            f"unknown queue option(s): {', '.join(sorted(unknown))} "
            f"(known: {', '.join(sorted(_QUEUE_OPTIONS))})"
        )
    values = dict(options)
    if values.get("dead_letter", DEFAULT) is DEFAULT:
        if len(name) > MAX_NAME - len(".dlq"):
            raise InvalidName(
                f"queue name {name[:20]!r}... has {len(name)} characters: with its "
                f"dead-letter queue's '.dlq' it would pass the {MAX_NAME} a name may have; "
                f"use at most {MAX_NAME - len('.dlq')}, or pass dead_letter= (None: no DLQ)"
            )
        values["dead_letter"] = f"{name}.dlq"
    return QueueConfig(**values).validated(name)
