"""The pieces of ``fairq.http.guard``: which ``Host`` names are answered, what counts as a
JSON body (the served behaviour is in test_security_serve.py)."""

from __future__ import annotations

import pytest

from fairq.http.guard import HostPolicy, is_json, split_host


def test_split_host() -> None:
    assert split_host("Example.COM.:8040") == ("example.com", "8040")
    assert split_host("[::1]:8040") == ("[::1]", "8040")
    assert split_host("[::1]") == ("[::1]", None)
    assert split_host("localhost") == ("localhost", None)


@pytest.mark.parametrize(
    ("host", "answered"),
    [
        ("localhost", True),
        ("localhost:8040", True),
        ("LOCALHOST.:1", True),
        ("127.0.0.1:8040", True),
        ("127.9.9.9", True),
        ("[::1]:8040", True),
        ("queue.lan:1234", True),  # allowed for any port
        ("other.lan:9000", True),  # allowed for this port only
        ("other.lan:9001", False),
        ("other.lan", False),
        ("attacker.example", False),
        ("127.0.0.1.attacker.example", False),
        ("127.0.0.1:80@attacker.example", False),
        ("localhost.attacker.example", False),
        ("", False),
        (None, False),
    ],
)
def test_host_policy(host: str | None, answered: bool) -> None:
    assert HostPolicy(["queue.lan", "other.lan:9000"]).allows(host) is answered


def test_a_star_answers_any_host() -> None:
    assert HostPolicy(["*"]).allows("anything.example")


def test_json_content_types() -> None:
    for yes in (
        "application/json",
        "Application/JSON; charset=utf-8",
        "application/merge-patch+json",
    ):
        assert is_json(yes)
    for no in (
        None,
        "",
        "text/plain",
        "application/x-www-form-urlencoded",
        "text/json",
        "multipart/form-data",
    ):
        assert not is_json(no)
