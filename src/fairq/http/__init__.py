"""fairq over HTTP. For now: :class:`IdempotencyMiddleware`, the ``Idempotency-Key``
header for any ASGI app (pure ASGI, no framework needed).

    from fairq.http import IdempotencyMiddleware
"""

from __future__ import annotations

from .middleware import IdempotencyMiddleware

__all__ = ["IdempotencyMiddleware"]
