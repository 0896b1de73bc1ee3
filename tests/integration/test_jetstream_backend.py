"""The JetStream adapter's layers against a real nats-server (conftest's fixture chain):
its own loop thread and fail-fast connect, typed publication outcomes (MSG-013/014),
and receiving with fenced settlement (MSG-011). Never a mock broker."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

from videoflow import server as embedded
from videoflow.errors import BrokerUnavailable
from videoflow.messaging.jetstream_loop import (
    ErrorLog,
    LoopRunner,
    close_client,
    connect_fail_fast,
)

pytestmark = pytest.mark.timeout(60)


# ------------------------------------------------------------------ layer 1: the loop


def test_runner_propagates_results_and_exceptions_from_its_own_thread() -> None:
    runner = LoopRunner()
    runner.start()
    try:
        async def which_thread() -> int:
            return threading.get_ident()

        assert runner.run(which_thread(), timeout=5) != threading.get_ident()

        async def boom() -> None:
            raise KeyError("from the loop")

        with pytest.raises(KeyError, match="from the loop"):
            runner.run(boom(), timeout=5)
        with pytest.raises(TimeoutError, match="within"):
            runner.run(asyncio.sleep(10), timeout=0.2)
    finally:
        runner.stop()
    assert not runner.running
    with pytest.raises(BrokerUnavailable, match="not running"):
        runner.run(asyncio.sleep(0), timeout=1)


def test_connect_and_close_on_the_runner_loop(nats_server: embedded.EmbeddedServer) -> None:
    runner = LoopRunner()
    runner.start()
    try:
        errors = ErrorLog()
        client = runner.run(connect_fail_fast(nats_server.url, 5.0, errors), timeout=10)
        assert client.is_connected
        runner.run(close_client(client), timeout=10)
        assert client.is_closed
        assert errors.reports == []
    finally:
        runner.stop()


def test_a_refused_connect_fails_fast_with_broker_unavailable(tmp_path: Path) -> None:
    with embedded.start(tmp_path / "gone") as server:
        url = server.url
    # The server is stopped: its port now refuses. S4: without the fail-fast options
    # nats-py would retry for about two minutes.
    runner = LoopRunner()
    runner.start()
    try:
        started = time.monotonic()
        with pytest.raises(BrokerUnavailable, match="unreachable"):
            runner.run(connect_fail_fast(url, 30.0, ErrorLog()), timeout=40)
        assert time.monotonic() - started < 5.0
    finally:
        runner.stop()


def test_runner_keeps_a_timeout_the_coroutine_raised_itself() -> None:
    runner = LoopRunner()
    runner.start()
    try:
        async def own_timeout() -> None:
            raise TimeoutError("the coroutine's own")

        with pytest.raises(TimeoutError, match="the coroutine's own"):
            runner.run(own_timeout(), timeout=5)
    finally:
        runner.stop()
