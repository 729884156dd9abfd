"""The ``fairq`` command line: serve, send, receive, stats, redrive, worker, demo, bench.

Every command takes ``--url`` (default ``$FAIRQ_URL``, else ``sqlite:///fairq.db``);
send, receive, stats, redrive and publish also take ``--server http://host:port``
(``$FAIRQ_SERVER``, with ``--api-key``/``$FAIRQ_API_KEY``) to go through a ``fairq serve``.
Tables and progress bars come from rich; long work shows a progress bar.
"""

from __future__ import annotations

# the commands register on import; --help lists them in this order
# isort: off
from . import serve  # noqa: F401
from . import queues  # noqa: F401
from . import topics  # noqa: F401
from . import attention  # noqa: F401
from . import run  # noqa: F401
from . import migrate  # noqa: F401

# isort: on
from .app import app, main

__all__ = ["app", "main"]

if __name__ == "__main__":  # pragma: no cover
    main()
