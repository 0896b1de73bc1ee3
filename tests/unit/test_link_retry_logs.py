"""The warning a retry ladder's request retried with the connection up gives
(videoflow.broker.link.wait_back): once per connection every TRANSIENT_RETRY_SECONDS,
never while the broker is away (the outage's lost and back lines say that), the URL
redacted. The outage lines themselves, against a real broker:
tests/integration/test_link_logs.py."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import nats.errors
import pytest

from videoflow.broker.link import TRANSIENT_RETRY_SECONDS, Outage, wait_back

LOGGER = "videoflow.broker.link"
URL = "nats://flow:hunter2@broker:4222"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def client(connected: bool) -> Any:
    return SimpleNamespace(is_connected=connected, is_closed=False)


def retry(outage: Outage, connection: Any) -> None:
    """One step of a retry ladder: wait_back from the except block of a failure."""
    try:
        raise nats.errors.NoRespondersError
    except nats.errors.Error:
        wait_back(connection, outage, outage.clock() + 5.0, step=0.0)


def test_a_request_retried_with_the_connection_up_is_one_warning_per_window(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    clock = Clock()
    outage = Outage(60.0, URL, clock=clock)
    for _ in range(5):
        retry(outage, client(connected=True))
        clock.now += 1.0
    clock.now += TRANSIENT_RETRY_SECONDS
    retry(outage, client(connected=True))
    records = [r for r in caplog.records if r.name == LOGGER]
    assert [r.levelno for r in records] == [logging.WARNING, logging.WARNING]
    assert records[0].getMessage() == (
        "a request to the broker at nats://flow:***@broker:4222 failed with the connection "
        "up (NoRespondersError: nats: no responders available for request); trying again "
        "for up to 5 s")


def test_a_request_retried_while_the_broker_is_away_is_the_outage_s_to_log(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    clock = Clock()
    outage = Outage(60.0, URL, clock=clock)
    clock.now += 10.0  # the wait ends at `until`, the broker still away
    connection = client(connected=False)
    wait_back(connection, outage, clock.now - 1.0, step=0.0)
    given_up = Outage(60.0, URL, clock=clock)
    given_up.given_up = given_up.reason()
    retry(given_up, client(connected=True))
    assert [r for r in caplog.records if r.name == LOGGER] == []
