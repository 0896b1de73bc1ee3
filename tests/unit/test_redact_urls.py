"""Redacting broker URLs: no part of a password or token is ever printed, whatever
characters it holds ('/', ',', '@', ':', '#', '?', '%40'), in one URL or a list; and a
comma inside a password does not split the server list."""

from __future__ import annotations

import pytest

from videoflow.broker.link import redact_url, servers_of

TRICKY = ["Pa55/wordQQQ", "pa,ssQQQ", "p@ssQQQ", "pa:ssQQQ", "pa#ssQQQ", "pa?ssQQQ",
          "pa%40ssQQQ", "a/b,c@d:e#f?gQQQ", "QQQ,nats", "x@y,z@hQQQ"]


def _secret_parts(secret: str) -> list[str]:
    """Every piece of secret between its special characters, longer than a letter."""
    parts = [secret]
    for separator in "/,@:#?%":
        parts = [piece for part in parts for piece in part.split(separator)]
    return [part for part in parts if len(part) > 1 and part != "nats"]


@pytest.mark.parametrize("secret", TRICKY)
def test_a_password_with_any_characters_is_masked_whole(secret: str) -> None:
    shown = redact_url(f"nats://vf:{secret}@127.0.0.1:14998")
    assert shown == "nats://vf:***@127.0.0.1:14998"


@pytest.mark.parametrize("secret", [s for s in TRICKY if ":" not in s])  # else a password
def test_a_token_with_any_characters_is_masked_whole(secret: str) -> None:
    assert redact_url(f"tls://{secret}@broker:4222") == "tls://***@broker:4222"


@pytest.mark.parametrize("secret", TRICKY)
def test_no_part_of_a_password_shows_in_a_server_list(secret: str) -> None:
    for url in (f"nats://vf:{secret}@a:4222,nats://vf:{secret}@b:4222",
                f"nats://a:4222, nats://vf:{secret}@b:4222",
                f"vf:{secret}@a:4222,vf:{secret}@b:4222",
                f"a:4222,{secret}@b:4222"):
        shown = redact_url(url)
        assert "***" in shown, shown
        for part in _secret_parts(secret):
            assert part not in shown, (url, shown)


def test_each_server_of_a_list_with_schemes_is_masked_on_its_own() -> None:
    assert redact_url("nats://u:p,1@a:4222,nats://b:4222, tls://t@c") == (
        "nats://u:***@a:4222,nats://b:4222, tls://***@c")


def test_a_url_without_credentials_is_left_as_it_is() -> None:
    for url in ("nats://a:4222", "a:4222,b:4222", "tls://[::1]:4222/"):
        assert redact_url(url) == url


def test_a_user_name_that_may_be_another_servers_token_is_masked_too() -> None:
    shown = redact_url("tok3n@a:4222,u:pw@b:4222")  # no schemes: where does each end?
    assert "tok3n" not in shown and "pw" not in shown


def test_a_comma_in_a_password_stays_in_its_server() -> None:
    assert servers_of("nats://vf:pa,ss@a:4222") == ["nats://vf:pa,ss@a:4222"]
    assert servers_of("nats://vf:a,b,c@a:4222,nats://b:4222") == [
        "nats://vf:a,b,c@a:4222", "nats://b:4222"]
    assert servers_of("nats://tok,en@a") == ["nats://tok,en@a"]
    assert servers_of("u:x,y@a:4222") == ["nats://u:x,y@a:4222"]


def test_a_plain_server_list_is_split_at_each_comma() -> None:
    assert servers_of("a:4222,b:4222, c") == ["nats://a:4222", "nats://b:4222",
                                              "nats://c"]
    assert servers_of("nats://a:4222,nats://u:p@b:4222") == [
        "nats://a:4222", "nats://u:p@b:4222"]
    assert servers_of("u:p@a:4222,u:p@b:4222") == ["nats://u:p@a:4222",
                                                   "nats://u:p@b:4222"]
    with pytest.raises(ValueError, match="empty server"):
        servers_of("a,,b")
