"""amqp:// URLs: options, the store, passwords masked in every error, refused connections."""

from __future__ import annotations

import logging

import pytest

import fairq
from fairq.backends.amqp.link import parse_url
from fairq.backends.open import mask_url
from services import require


def test_parse_url_splits_fairq_options_from_the_broker_url() -> None:
    u = parse_url(
        "amqps://bob:s3cret@rabbit:5671/prod%2Feu?store=redis://:pw@cache:6379/0"
        "&prefetch=50&management=off&heartbeat=30"
    )
    assert (u.host, u.port, u.vhost, u.user, u.password, u.tls) == (
        "rabbit",
        5671,
        "prod/eu",
        "bob",
        "s3cret",
        True,
    )
    assert u.store == "redis://:pw@cache:6379/0"
    assert (u.prefetch, u.management) == (50, None)
    assert u.broker == "amqps://bob:s3cret@rabbit:5671/prod%2Feu?heartbeat=30"
    assert "s3cret" not in u.masked and "pw@" not in u.masked


def test_a_store_urls_own_options_must_be_encoded_not_given_to_rabbitmq() -> None:
    """``store=postgresql://...?pool_max=3&schema=jobs``: the ``&`` ends the store's URL,
    so ``schema`` would have gone to RabbitMQ's client and the store used the default
    schema, unseen. It is refused, naming the option and the fix."""
    from urllib.parse import quote

    with pytest.raises(fairq.InvalidOption, match=r"unknown option\(s\) schema.*percent-encode"):
        parse_url("amqp://h/v?store=postgresql://db/x?pool_max=3&schema=jobs")
    with pytest.raises(fairq.InvalidOption, match="prefix"):
        parse_url("amqp://h/v?store=redis://cache/0&prefix=app:")
    store = "postgresql://u:pw@db/x?pool_max=3&schema=jobs"
    u = parse_url(f"amqp://h/v?store={quote(store, safe='')}")
    assert u.store == store and u.broker == "amqp://h/v?heartbeat=10"
    assert "pw" not in u.masked
    assert "pw" not in mask_url("amqp://h/v?store=redis%3A%2F%2F%3Apw%40cache%3A6379%2F0")


def test_the_heartbeat_is_10_s_unless_the_url_says(  # a frozen holder is dropped in ~30 s
) -> None:
    assert parse_url("amqp://h/v?store=memory://").broker == "amqp://h/v?heartbeat=10"
    assert parse_url("amqp://h/v?store=memory://&heartbeat=60").broker == "amqp://h/v?heartbeat=60"


def test_nested_store_passwords_are_masked() -> None:
    masked = mask_url("amqp://u:one@h/v?store=postgresql://p:two@db/x?password=three")
    assert not any(s in masked for s in ("one", "two", "three"))


@pytest.mark.parametrize("prefetch", ["0", "-1", "65536", "70000", "abc"])
def test_a_prefetch_outside_amqps_16_bits_is_refused(prefetch: str) -> None:
    with pytest.raises(fairq.InvalidOption, match="prefetch"):
        parse_url(f"amqp://h/v?store=memory://&prefetch={prefetch}")
    assert parse_url("amqp://h/v?store=memory://&prefetch=65535").prefetch == 65535


async def test_a_store_that_is_rabbitmq_again_is_refused_as_such() -> None:
    with pytest.raises(fairq.ConnectionError, match="cannot be another amqp:// URL") as info:
        await fairq.connect("amqp://guest:secret@127.0.0.1:5672/?store=amqp://u:pw@h/x")
    assert "secret" not in str(info.value) and "pw@" not in str(info.value)


async def test_a_url_without_a_store_is_refused() -> None:
    with pytest.raises(fairq.ConnectionError) as info:
        await fairq.connect("amqp://guest:secret@127.0.0.1:5672/")
    assert "?store=" in str(info.value) and "secret" not in str(info.value)


async def test_wrong_credentials_are_a_connection_error_with_the_password_masked() -> None:
    require("amqp")
    with pytest.raises(fairq.ConnectionError) as info:
        await fairq.connect("amqp://guest:wrong-pass@127.0.0.1:5672/?store=memory://")
    assert "wrong-pass" not in str(info.value) and "***" in str(info.value)
    assert "refused the login of user 'guest'" in str(info.value)


async def test_a_vhost_that_does_not_exist_is_named_in_the_error() -> None:
    require("amqp")
    with pytest.raises(fairq.ConnectionError) as info:
        await fairq.connect("amqp://guest:guest@127.0.0.1:5672/no-such-vhost-here?store=memory://")
    message = str(info.value)
    assert "would not open vhost 'no-such-vhost-here'" in message, message
    assert "Connection.OpenOk" not in message


async def test_an_unreachable_broker_is_a_connection_error() -> None:
    with pytest.raises(fairq.ConnectionError) as info:
        await fairq.connect("amqp://guest:pw@127.0.0.1:25699/?store=memory://&timeout=2")
    assert "pw@" not in str(info.value)
    assert "Connect call failed" in str(info.value)


async def test_a_failed_connect_is_reported_once_not_also_by_the_driver_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.DEBUG), pytest.raises(fairq.ConnectionError):
        await fairq.connect("amqp://guest:pw@127.0.0.1:25699/?store=memory://&timeout=2")
    assert not [r for r in caplog.records if "creating transport" in r.getMessage()]


async def test_an_amqp_url_at_another_services_port_gives_a_reason() -> None:
    """Redis's port: the handshake never comes (the error said nothing after its colon)."""
    require("redis")
    with pytest.raises(fairq.ConnectionError, match="no AMQP handshake"):
        await fairq.connect("amqp://guest:guest@127.0.0.1:6379/x?store=memory://&timeout=1")
