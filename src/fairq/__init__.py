"""fairq: durable work queues, publish/subscribe, fair attention queues, idempotent
consumers and a flash-sale waiting room — embedded on SQLite, or on a distributed engine.

    import fairq
    broker = await fairq.connect()              # $FAIRQ_URL or sqlite:///fairq.db
    q = await broker.declare_queue("ticket-pdf")
    await q.send({"order": "o-7731"})
    for msg in await q.receive(wait=5):
        ...
        await msg.ack()
"""

from .attention import Attention, AttentionStats, KeyStats, Plan, TenantStats
from .broker import Broker, connect
from .clock import Clock, ManualClock, SystemClock
from .errors import (
    AttentionNotFound,
    BackendError,
    ConfigConflict,
    ConnectionError,
    FairqError,
    InvalidFilter,
    InvalidMessage,
    InvalidName,
    InvalidOption,
    InvalidTicket,
    InvalidToken,
    LeaseLost,
    MessageTooLarge,
    QueueFull,
    QueueNotFound,
    Reject,
    RoomNotFound,
    TopicNotFound,
    Unsupported,
)
from .idempotency import (
    Claim,
    ClaimLost,
    IdempotencyRecord,
    IdempotencyStore,
    IdempotentBy,
    VersionGate,
)
from .message import Outgoing, Received
from .pubsub import Listener, PublishResult, Subscription, Topic, TopicStats
from .queue import Queue, QueueConfig, QueueStats
from .sync import connect_sync
from .waitingroom import (
    AdaptiveRate,
    Health,
    HealthMeter,
    RoomConfig,
    RoomStats,
    Status,
    Ticket,
    WaitingRoom,
)
from .worker import Backoff, Worker

__version__ = "0.1.0"

__all__ = [
    "AdaptiveRate",
    "Attention",
    "AttentionNotFound",
    "AttentionStats",
    "BackendError",
    "Backoff",
    "Broker",
    "Claim",
    "ClaimLost",
    "Clock",
    "ConfigConflict",
    "ConnectionError",
    "FairqError",
    "Health",
    "HealthMeter",
    "IdempotencyRecord",
    "IdempotencyStore",
    "IdempotentBy",
    "InvalidFilter",
    "InvalidMessage",
    "InvalidName",
    "InvalidOption",
    "InvalidTicket",
    "InvalidToken",
    "KeyStats",
    "LeaseLost",
    "Listener",
    "ManualClock",
    "MessageTooLarge",
    "Outgoing",
    "Plan",
    "PublishResult",
    "Queue",
    "QueueConfig",
    "QueueFull",
    "QueueNotFound",
    "QueueStats",
    "Received",
    "Reject",
    "RoomConfig",
    "RoomNotFound",
    "RoomStats",
    "Status",
    "Subscription",
    "SystemClock",
    "TenantStats",
    "Ticket",
    "Topic",
    "TopicNotFound",
    "TopicStats",
    "Unsupported",
    "VersionGate",
    "WaitingRoom",
    "Worker",
    "__version__",
    "connect",
    "connect_sync",
]
