"""A small client of RabbitMQ's management HTTP API (plugin ``rabbitmq_management``).

fairq uses it where AMQP has no answer: virtual hosts (the test suite gives each test its
own), and the numbers of other processes' deliveries for stats. Blocking calls (the
standard library's ``urllib``), run in a thread by the async wrappers.
"""

from __future__ import annotations

import asyncio
import base64
import json
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import quote

from ...errors import BackendError, ConnectionError

__all__ = ["Management"]


class Management:
    """The management API at ``base`` (``http://host:15672``) as ``user``."""

    def __init__(self, base: str, user: str, password: str, timeout: float = 10.0) -> None:
        self.base = base.rstrip("/") + "/api"
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        self._auth = f"Basic {token}"
        self.timeout = timeout

    def call(self, method: str, path: str, body: Any = None) -> Any:
        """One request; the decoded JSON answer (None for an empty one)."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.base + path,
            method=method,
            data=data,
            headers={"Authorization": self._auth, "content-type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            if exc.code == 404 and method == "DELETE":
                return None
            raise BackendError(f"management API {method} {path}: HTTP {exc.code}") from exc
        except OSError as exc:
            raise ConnectionError(f"management API at {self.base} unreachable: {exc}") from exc
        return json.loads(raw) if raw else None

    async def acall(self, method: str, path: str, body: Any = None) -> Any:
        return await asyncio.to_thread(self.call, method, path, body)

    def add_vhost(self, vhost: str, user: str) -> None:
        v = quote(vhost, safe="")
        self.call("PUT", f"/vhosts/{v}", {})
        self.call(
            "PUT",
            f"/permissions/{v}/{quote(user, safe='')}",
            {"configure": ".*", "write": ".*", "read": ".*"},
        )

    def delete_vhost(self, vhost: str) -> None:
        self.call("DELETE", f"/vhosts/{quote(vhost, safe='')}")

    def vhosts(self) -> list[str]:
        return [v["name"] for v in self.call("GET", "/vhosts")]

    def connections(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.call("GET", "/connections")
        return result

    def close_connection(self, name: str) -> None:
        self.call("DELETE", f"/connections/{quote(name, safe='')}")

    async def queue(self, vhost: str, name: str) -> dict[str, Any]:
        result: dict[str, Any] = await self.acall(
            "GET", f"/queues/{quote(vhost, safe='')}/{quote(name, safe='')}"
        )
        return result

    async def ready_queues(self, vhost: str, name_regex: str) -> list[str]:
        """The queues of ``vhost`` whose names match ``name_regex`` and that had ready
        messages when the broker last sampled its statistics (every 5 s by default): one
        paged listing, however many queues there are."""
        v = quote(vhost, safe="")
        found: list[str] = []
        page = 1
        while True:
            query = (
                f"page={page}&page_size=500&use_regex=true&name={quote(name_regex, safe='')}"
                "&columns=name,messages_ready"
            )
            got: dict[str, Any] = await self.acall("GET", f"/queues/{v}?{query}")
            found.extend(q["name"] for q in got.get("items", []) if q.get("messages_ready"))
            if page >= int(got.get("page_count") or 1):
                return found
            page += 1
