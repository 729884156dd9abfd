"""redis-py 5.3's asyncio connection, closed by a Redis Cluster failover while a command was
being sent, raises AttributeError ('NoneType' object has no attribute 'writelines') from
inside the driver: the Redis backend reports that as the engine out of reach
(``fairq.ConnectionError``, which a Worker waits out), and any other AttributeError as
what it is."""

from __future__ import annotations

import os

import pytest
import redis

from fairq.backends.redis.conn import torn_connection


def _raise_inside(filename: str) -> AttributeError:
    namespace: dict[str, object] = {}
    source = "def send(writer):\n    writer.writelines([b'PING'])\n"
    exec(compile(source, filename, "exec"), namespace)
    with pytest.raises(AttributeError) as caught:
        namespace["send"](None)  # type: ignore[operator]
    return caught.value


def test_an_attribute_error_inside_redis_py_is_a_torn_connection() -> None:
    inside = os.path.join(os.path.dirname(redis.__file__), "asyncio", "connection.py")
    assert torn_connection(_raise_inside(inside))


def test_an_attribute_error_elsewhere_is_not() -> None:
    assert not torn_connection(_raise_inside("/work/main/src/fairq/backends/redis/core.py"))
    try:
        None.writelines  # type: ignore[attr-defined]  # noqa: B018
    except AttributeError as exc:
        assert not torn_connection(exc)
