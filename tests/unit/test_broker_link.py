"""The connection plumbing that rides out a broker (videoflow.broker.link):
server lists, the outage budget's arithmetic, and which failures are worth another
try. The reconnects themselves are exercised against real servers in
tests/e2e/test_broker_faults.py."""

from __future__ import annotations

import asyncio
import re

import nats.errors
import nats.js.errors
import pytest

from videoflow.broker.link import (
    OUTAGE_BUDGET_ENV,
    RECONNECT_MAX_WAIT,
    RECOVERY_SECONDS,
    TRANSIENT_RETRY_SECONDS,
    Outage,
    outage_budget_from_env,
    redact_url,
    retry_until,
    servers_of,
    transient,
)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_url_list_is_split_in_order_and_a_bare_host_gets_the_nats_scheme() -> None:
    assert servers_of("nats://a:4222") == ["nats://a:4222"]
    assert servers_of("nats://a:4222, b:4223,tls://c:4224") == [
        "nats://a:4222", "nats://b:4223", "tls://c:4224"]


@pytest.mark.parametrize("bad", ["", "  ", "nats://a:1,,nats://b:2", "nats://a:1,"])
def test_an_empty_url_or_an_empty_entry_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="URL|server"):
        servers_of(bad)


def test_an_outage_extends_pursuit_until_its_budget_then_a_little_after_it_ends() -> None:
    clock = Clock()
    outage = Outage(60.0, "nats://x:1", clock=clock)
    assert (outage.away, outage.pursue_until()) == (False, 0.0)
    outage.went_away()
    clock.now += 5
    outage.went_away()  # a second report of the same outage changes nothing
    assert outage.away and outage.down_since == 100.0
    assert outage.pursue_until() == 100.0 + 60.0 + RECOVERY_SECONDS
    assert not outage.overdue()
    clock.now += 10
    outage.came_back()
    assert (outage.away, outage.back_at) == (False, 115.0)
    assert outage.pursue_until() == 115.0 + RECOVERY_SECONDS


def test_an_outage_past_its_budget_is_overdue_and_a_given_up_one_pursues_nothing() -> None:
    clock = Clock()
    outage = Outage(5.0, "nats://x:1", clock=clock)
    outage.went_away()
    clock.now += 5.5
    assert outage.overdue()
    outage.given_up = outage.reason()
    assert "unreachable for more than 5 s" in outage.given_up
    assert OUTAGE_BUDGET_ENV in outage.given_up
    assert outage.pursue_until() == 0.0
    assert retry_until(outage, clock()) == 0.0


def test_the_reconnect_wait_starts_short_and_grows_to_its_cap() -> None:
    clock = Clock()
    outage = Outage(60.0, clock=clock)
    outage.went_away()
    waits = []
    for _ in range(8):
        waits.append(outage.reconnect_wait())
        clock.now += 1
    assert waits[0] < waits[1] < waits[2]
    assert waits[-1] == RECONNECT_MAX_WAIT


def test_the_back_callbacks_run_at_every_reconnect() -> None:
    # The client calls reconnected_cb once per reconnect: whatever the connection held
    # on the server (open pull requests) is gone each time, so each return is told.
    outage = Outage(60.0, clock=Clock())
    calls: list[str] = []
    outage.on_back.append(lambda: calls.append("back"))
    for _ in range(2):
        outage.went_away()
        outage.came_back()
    assert calls == ["back", "back"]


def test_a_transient_failure_is_retried_for_a_while_even_without_an_outage() -> None:
    clock = Clock()
    outage = Outage(60.0, clock=clock)
    assert retry_until(outage, clock()) == clock() + TRANSIENT_RETRY_SECONDS
    outage.went_away()
    assert retry_until(outage, clock()) == outage.pursue_until()


@pytest.mark.parametrize("error", [
    asyncio.TimeoutError(), nats.errors.TimeoutError(), nats.errors.ConnectionClosedError(),
    nats.errors.NoRespondersError(), nats.errors.StaleConnectionError(),
    nats.js.errors.ServiceUnavailableError(code=503, err_code=10008),
])
def test_timeouts_lost_connections_and_a_503_are_transient(error: BaseException) -> None:
    assert transient(error)


@pytest.mark.parametrize("error", [
    nats.js.errors.BadRequestError(code=400, err_code=10054),
    nats.js.errors.NotFoundError(code=404, err_code=10059),
    nats.errors.MaxPayloadError(), ValueError("x"),
])
def test_refusals_that_waiting_cannot_change_are_not_transient(error: BaseException) -> None:
    assert not transient(error)


def test_the_budget_comes_from_the_environment_and_a_bad_one_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(OUTAGE_BUDGET_ENV, raising=False)
    assert outage_budget_from_env() == 60.0
    monkeypatch.setenv(OUTAGE_BUDGET_ENV, "12.5")
    assert outage_budget_from_env() == 12.5
    for bad in ("soon", "-1", "inf", "nan"):
        monkeypatch.setenv(OUTAGE_BUDGET_ENV, bad)
        with pytest.raises(ValueError, match="outage budget|number of seconds"):
            outage_budget_from_env()


@pytest.mark.parametrize("url, shown", [
    ("nats://127.0.0.1:4222", "nats://127.0.0.1:4222"),
    ("nats://u:s3cret@h:4222", "nats://u:***@h:4222"),
    ("nats://t0ken@h:4222", "nats://***@h:4222"),  # a user part alone is a token
    ("tls://u:p@a:1, b:2,nats://x:y@c:3", "tls://u:***@a:1, b:2,nats://x:***@c:3"),
    ("u:p@h:4222", "u:***@h:4222"),  # no scheme: taken as nats:// (servers_of)
    ("nats://u:p@ss@h:1", "nats://u:***@h:1"),  # an unescaped '@' in it: masked whole
    # A '/' may be in a password ('u:p@h:1/x' is one), and a NATS URL has no path: the
    # mask runs to the last '@' (test_redact_urls).
    ("nats://u:p@h:1/x@y", "nats://u:***@y"),
    ("nats://u:@h:1", "nats://u:***@h:1"),
])
def test_a_url_is_shown_without_its_password_or_token(url: str, shown: str) -> None:
    assert redact_url(url) == shown


@pytest.mark.parametrize("bad, said", [
    ("http://localhost:4222", "has the scheme 'http://'"),
    ("nats://a:4222,https://b:4222", "'https://b:4222' has the scheme 'https://'"),
    ("not a url", "'not a url' is malformed: a host name holds no spaces"),
    ("nats://a:99999", "'nats://a:99999' is malformed: Port out of range"),
    ("nats://a:port", "'nats://a:port' is malformed: Port could not be cast"),
    ("nats://:4222", "'nats://:4222' names no host"),
    ("nats://h\"st:4222", "'h\"st' is not a host name"),
    ("nats://a:4222,ws://b:8080", "mixes websocket"),
])
def test_a_url_nats_py_would_not_reach_is_refused_saying_what_is_wrong(
        bad: str, said: str) -> None:
    # nats-py takes 'http://h:4222' for the host 'http', and reports only that the
    # name did not resolve (gaierror), once per attempt.
    with pytest.raises(ValueError, match=re.escape(said)):
        servers_of(bad)


def test_a_refused_url_keeps_its_password_out_of_the_message() -> None:
    with pytest.raises(ValueError, match=r"'http://vf:\*\*\*@h:4222'") as refused:
        servers_of("http://vf:s3cret@h:4222")
    assert "s3cret" not in str(refused.value)


@pytest.mark.parametrize("good", ["nats://a:4222", "tls://a", "NATS://A:4222", "a",
                                  "nats://[::1]:4222", "ws://a:8080,wss://b:8443",
                                  "nats://u:p,q@my_host-1.example:4222"])
def test_every_url_nats_py_takes_is_still_taken(good: str) -> None:
    assert servers_of(good)
