"""``mask_url``: what the CLI, logs, errors and ``/healthz`` show of a backend URL."""

from __future__ import annotations

import pytest

from fairq.broker import mask_url


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://app:hunter2@db/fairq", "postgresql://app:***@db/fairq"),
        ("postgresql://app@db/fairq?password=hunter2", "postgresql://app@db/fairq?password=***"),
        (
            "postgresql://db/fairq?sslmode=require&PASSWORD=hunter2&sslpassword=k",
            "postgresql://db/fairq?sslmode=require&PASSWORD=***&sslpassword=***",
        ),
        ("redis://cache:6379/0?token=t0k#x", "redis://cache:6379/0?token=***#x"),
        (
            "amqp://mq/v?store=postgresql%3A%2F%2Fdb%2Ff%3Fpassword%3Dhunter2%26a%3D1",
            "amqp://mq/v?store=postgresql%3A%2F%2Fdb%2Ff%3Fpassword%3D***%26a%3D1",
        ),
        ("sqlite:///fairq.db?synchronous=full", "sqlite:///fairq.db?synchronous=full"),
    ],
)
def test_passwords_are_masked(url: str, shown: str) -> None:
    assert mask_url(url) == shown
    assert "hunter2" not in mask_url(url)
