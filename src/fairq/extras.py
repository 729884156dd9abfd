"""fairq's optional extras, and the error that names the one to install.

The core (``pip install fairq``) needs orjson, typer and rich only; the rest comes with
extras (``pyproject.toml``): ``server`` (everything ``fairq serve`` mounts: Starlette,
uvicorn, prometheus-client, httpx, msgspec, PyJWT with cryptography for the waiting
rooms), ``room`` (waiting rooms in your own app), ``push`` (push subscriptions),
``demo``, ``bench``, the engines' drivers ``redis``, ``postgres``, ``amqp``, and ``all``.
Code that imports an optional dependency raises :class:`MissingExtra` when it is not
there, so the message says exactly what to install::

    try:
        import jwt
    except ImportError as exc:
        raise MissingExtra("waiting rooms need PyJWT and cryptography", "room", exc) from exc
"""

from __future__ import annotations

__all__ = ["MissingExtra"]


class MissingExtra(ImportError):
    """An optional dependency is not installed; :attr:`extra` is the fairq extra that
    installs it, and the message says ``pip install 'fairq[<extra>]'``."""

    def __init__(self, what: str, extra: str, cause: ImportError | None = None) -> None:
        detail = f" ({cause})" if cause is not None else ""
        super().__init__(
            f"{what}: pip install 'fairq[{extra}]'{detail}",
            name=cause.name if cause is not None else None,
        )
        self.extra = extra
