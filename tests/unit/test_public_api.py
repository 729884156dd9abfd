"""The public surface: explicit ``__all__``, a docstring on every public name, and the
names SPEC §1–§3 and §6 promise."""

from __future__ import annotations

import inspect

import fairq

SPEC_NAMES = {
    "connect",
    "connect_sync",
    "Broker",
    "Queue",
    "Outgoing",
    "Received",
    "QueueStats",
    "Worker",
    "Backoff",
    "FairqError",
    "ConnectionError",
    "InvalidName",
    "MessageTooLarge",
    "QueueFull",
    "LeaseLost",
    "QueueNotFound",
    "ConfigConflict",
    "Reject",
    "Unsupported",
}


def test_all_is_explicit_and_complete() -> None:
    exported = set(fairq.__all__)
    assert exported >= SPEC_NAMES
    public = {n for n in vars(fairq) if not n.startswith("_")}
    modules = {n for n in public if inspect.ismodule(getattr(fairq, n))}
    assert public - modules - {"annotations"} == exported - {"__version__"}


def test_public_names_have_docstrings() -> None:
    for name in fairq.__all__:
        obj = getattr(fairq, name)
        if callable(obj):
            assert inspect.getdoc(obj), name


def test_handle_methods_named_as_in_spec() -> None:
    for name in ("declare_queue", "queue", "delete_queue", "list_queues", "redrive", "close"):
        assert inspect.iscoroutinefunction(getattr(fairq.Broker, name)) or name == "queue", name
    for name in ("send", "send_batch", "receive", "ack_batch", "stats", "purge"):
        assert inspect.iscoroutinefunction(getattr(fairq.Queue, name)), name
    for name in ("ack", "nack", "extend", "dead_letter"):
        assert inspect.iscoroutinefunction(getattr(fairq.Received, name)), name
    fields = (
        "id",
        "body",
        "attributes",
        "attempt",
        "enqueued_at",
        "priority",
        "group",
        "receipt",
        "queue",
        "key",
    )
    assert set(fields) <= set(fairq.Received.__slots__)
