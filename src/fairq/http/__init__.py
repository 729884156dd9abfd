"""fairq over HTTP.

* :class:`IdempotencyMiddleware` — the ``Idempotency-Key`` header for any ASGI app (pure
  ASGI, no framework needed);
* :class:`RequireAdmission` — a waiting room's admission tokens demanded on purchase paths
  (pure ASGI); the room's own routes are :func:`fairq.http.rooms.rooms_routes`;
* :class:`Client` — a ``fairq serve`` server through the in-process API's method names
  (needs httpx: ``pip install 'fairq[server]'``);
* :func:`create_app` — the Starlette app of ``fairq serve`` (REST API ``/v1``,
  ``/openapi.json``, ``/metrics``, ``/healthz``, the dashboard); needs the ``server`` extra.

Importing this package stays light: ``Client`` and ``create_app`` load their
dependencies on first use.

    from fairq.http import IdempotencyMiddleware, Client, RequireAdmission
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .admission import RequireAdmission
from .middleware import IdempotencyMiddleware

if TYPE_CHECKING:
    from .app import create_app
    from .client import Client

__all__ = ["Client", "IdempotencyMiddleware", "RequireAdmission", "create_app"]


def __getattr__(name: str) -> Any:
    if name == "Client":
        from .client import Client

        return Client
    if name == "create_app":
        from .app import create_app

        return create_app
    raise AttributeError(f"module 'fairq.http' has no attribute {name!r}")
