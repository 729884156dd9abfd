"""From a URL to a backend: the one place that knows which scheme names which engine.

``fairq.connect()`` calls it, and so does a backend that keeps part of its state in
another one (RabbitMQ's ``?store=``), which is why it lives below the seam.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, unquote, urlsplit

from ..clock import Clock
from ..errors import ConnectionError
from .base import Backend

__all__ = ["backend_class", "mask_url", "open_backend"]


# the user info of a URL percent-encoded inside another's parameter (?store=redis%3A%2F%2F
# user%3Apassword%40host...): "//user:" then the password up to "@"
_ENCODED_USERINFO = re.compile(
    r"(%2F%2F(?:(?!%3A|%40|%2F)[^/&#])*%3A)(?:(?!%40|%2F)[^/&#])*%40", re.IGNORECASE
)

# query parameters that carry secrets (psycopg's ``password``, ``sslpassword``, ...), also
# percent-encoded inside another URL's parameter (amqp://...?store=postgresql%3A...)
_SECRET_PARAMS = re.compile(
    r"((?:[?&]|%3F|%26)"
    r"(?:password|passwd|pass|pwd|sslpassword|secret|token|api[_-]?key|access[_-]?key)"
    r"(?:=|%3D))(?:(?!%26)[^&#])*",
    re.IGNORECASE,
)


def mask_url(url: str) -> str:
    """``url`` with its passwords — in the user info (also of a ``?store=`` URL inside it) or
    a query parameter such as ``?password=`` — replaced by ``***``."""
    masked = re.sub(r"(//[^:/@]*:)[^@/]*@", r"\1***@", url)
    masked = _ENCODED_USERINFO.sub(r"\1***%40", masked)
    return _SECRET_PARAMS.sub(r"\1***", masked)


def backend_class(scheme: str) -> type[Backend]:
    """The backend class of a URL scheme (imported on demand: drivers are optional)."""
    scheme = scheme.lower()
    if scheme == "memory":
        from .memory import MemoryBackend

        return MemoryBackend
    if scheme == "sqlite":
        from .sqlite import SQLiteBackend

        return SQLiteBackend
    if scheme in ("amqp", "amqps"):
        from .amqp import AmqpBackend

        return AmqpBackend
    if scheme in ("redis", "rediss", "redis+cluster"):
        from .redis import RedisBackend

        return RedisBackend
    if scheme in ("postgresql", "postgres"):
        from .postgres import PostgresBackend

        return PostgresBackend
    raise ConnectionError(
        f"unknown scheme {scheme!r} "
        "(use memory://, sqlite:///path.db, redis://, postgresql:// or amqp://)"
    )


def open_backend(url: str, clock: Clock) -> Backend:
    """The (not yet opened) backend ``url`` names; ``ConnectionError`` with the URL masked."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        backend_class(scheme)
    except ConnectionError as exc:
        raise ConnectionError(f"cannot open {mask_url(url)!r}: {exc}") from None
    if scheme == "memory":
        from .memory import MemoryBackend

        return MemoryBackend(clock)
    if scheme == "sqlite":
        from .sqlite import SQLiteBackend

        path = parts.path[1:] if parts.path.startswith("/") else parts.path
        path = unquote(path)  # a URL's %20 is a space in the file's name
        if parts.netloc:
            raise ConnectionError(
                f"cannot open {mask_url(url)!r}: write sqlite:///relative/path.db or "
                "sqlite:////absolute/path.db"
            )
        if not path:
            raise ConnectionError(f"cannot open {mask_url(url)!r}: the URL names no file")
        return SQLiteBackend(path, clock, dict(parse_qsl(parts.query)))
    if scheme in ("redis", "rediss", "redis+cluster"):
        from .redis import open_redis

        return open_redis(url, clock)
    if scheme in ("postgresql", "postgres"):
        from .postgres import PostgresBackend

        return PostgresBackend(url, clock)
    from .amqp import AmqpBackend

    return AmqpBackend(url, clock)
