"""What a connection logs about its broker's outages (videoflow.broker.link), against a
real nats-server SIGKILLed and started again on its port and store: one warning as the
connection is lost, one as it is back, one when it is given up; never a line per
reconnect attempt, never a password. The same through the videoflow command and its
replica processes, as JSON: tests/e2e/test_outage_logs.py."""

from __future__ import annotations

import asyncio
import logging
import re
import socket
import threading
import time
from pathlib import Path

import pytest

from videoflow.broker import server as embedded
from videoflow.broker.link import Outage, connect

LOGGER = "videoflow.broker.link"
PASSWORD = "hunter2-outage"
CREDENTIALS = ("--user", "flow", "--pass", PASSWORD)


async def _ignore(error: BaseException) -> None:
    return None


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def _with_password(server: embedded.EmbeddedServer) -> str:
    return f"nats://flow:{PASSWORD}@127.0.0.1:{_port(server.url)}"


def _link_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LOGGER]


async def _wait(condition: object, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


@pytest.mark.timeout(60)
def test_a_broker_killed_and_restarted_logs_one_lost_and_one_back_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    store = tmp_path / "store"
    servers = [embedded.start(store, extra_args=CREDENTIALS)]
    port = _port(servers[0].url)

    async def ride_out_a_restart() -> None:
        outage = Outage(budget=30.0)
        client = await connect(_with_password(servers[0]), 5.0, _ignore, outage)
        try:
            await client.flush(timeout=2)
            assert servers[0].process is not None
            servers[0].process.kill()
            servers[0].process.wait()
            await _wait(lambda: outage.away, 10)
            # Several reconnect attempts fail meanwhile (the first waits are 0.1 s).
            await asyncio.sleep(2.0)
            servers.append(embedded.start(
                store, extra_args=(*CREDENTIALS, "-p", str(port))))
            await _wait(lambda: client.is_connected and not outage.away, 20)
            await client.flush(timeout=2)
        finally:
            await client.close()  # a close of its owner's is no outage: not logged

    try:
        asyncio.run(ride_out_a_restart())
    finally:
        for server in servers:
            server.stop()
    records = _link_records(caplog)
    assert [(r.levelno, r.getMessage().split(" ")[0]) for r in records] == [
        (logging.WARNING, "lost"), (logging.WARNING, "the")], [r.getMessage() for r in records]
    lost, back = (r.getMessage() for r in records)
    where = f"nats://flow:***@127.0.0.1:{port}"
    assert lost == (f"lost the connection to the broker at {where}; reconnecting for up "
                    "to 30 s (the outage budget)")
    found = re.fullmatch(r"the connection to the broker at (\S+) is back after ([\d.]+) s", back)
    assert found is not None, back
    assert found[1] == where
    assert 2.0 <= float(found[2]) < 20.0
    assert all(PASSWORD not in r.getMessage() for r in caplog.records)


@pytest.mark.timeout(60)
def test_a_broker_away_past_the_budget_logs_the_lost_warning_then_the_given_up_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    server = embedded.start(tmp_path / "store", extra_args=CREDENTIALS)
    port = _port(server.url)

    async def lose_the_broker() -> Outage:
        outage = Outage(budget=1.0)
        client = await connect(_with_password(server), 5.0, _ignore, outage)
        try:
            assert server.process is not None
            server.process.kill()
            server.process.wait()
            await _wait(lambda: client.is_closed, 20)
        finally:
            await client.close()
        return outage

    try:
        outage = asyncio.run(lose_the_broker())
    finally:
        server.stop()
    assert outage.given_up is not None
    records = _link_records(caplog)
    assert [(r.levelno, r.getMessage().split(" ")[0]) for r in records] == [
        (logging.WARNING, "lost"), (logging.WARNING, "gave")], [r.getMessage() for r in records]
    assert records[1].getMessage() == (
        f"gave up the connection: the broker nats://flow:***@127.0.0.1:{port} "
        "was unreachable for more than 1 s (the outage budget; raise it with "
        "--outage-budget, outage_budget= or VIDEOFLOW_OUTAGE_BUDGET)")
    assert all(PASSWORD not in r.getMessage() for r in caplog.records)


@pytest.mark.timeout(60)
def test_a_known_broker_waited_for_at_the_first_connect_logs_the_wait_and_its_end(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    # The port refuses (bound, not listening) until the server takes it, 1.5 s in.
    refusing = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    refusing.bind(("127.0.0.1", 0))
    port = refusing.getsockname()[1]
    url = f"nats://flow:{PASSWORD}@127.0.0.1:{port}"
    started: list[embedded.EmbeddedServer] = []

    def start_later() -> None:
        time.sleep(1.5)
        refusing.close()
        started.append(embedded.start(tmp_path / "store",
                                      extra_args=(*CREDENTIALS, "-p", str(port))))

    async def first_connect() -> None:
        client = await connect(url, 2.0, _ignore, Outage(budget=20.0, where=url, known=True))
        await client.close()

    thread = threading.Thread(target=start_later)
    thread.start()
    try:
        asyncio.run(first_connect())
    finally:
        thread.join()
        for server in started:
            server.stop()
    messages = [r.getMessage() for r in _link_records(caplog)]
    where = f"nats://flow:***@127.0.0.1:{port}"
    assert len(messages) == 2, messages
    assert messages[0] == (f"the broker at {where} does not answer (unreachable); waiting "
                           "for it for up to 20 s (the outage budget)")
    assert re.fullmatch(rf"the connection to the broker at {re.escape(where)} is back after "
                        r"[\d.]+ s", messages[1]), messages[1]
    assert all(r.levelno == logging.WARNING for r in _link_records(caplog))
