"""The value types that cross the backend seam, below both the handles and the engines.

Handles (``fairq.queue``, ``fairq.pubsub`` ...) build these from what user code asks;
backends (``fairq.backends``) take and return them. Nothing here speaks to a backend, so
an engine imports from ``fairq.model`` and never from a handle module. The public names
are also re-exported where users import them (``fairq``, ``fairq.queue`` ...).

* :mod:`.queues` — ``QueueConfig``, ``QueueStats``, ``Envelope``
* :mod:`.topics` — ``TopicConfig``, ``Subscription``, ``SubscriptionIndex``, ``PublishResult``,
  ``TopicStats``
* :mod:`.attention` — ``Plan``, ``AttentionConfig``, ``Slice``, ``AttentionStats``, ``KeyStats``
* :mod:`.idempotency` — ``IdempotencyRecord``, ``Version``
* :mod:`.rooms` — ``RoomConfig``, ``RoomRecord``, ``Place``, ``TickResult``, ``RoomStats``
"""
