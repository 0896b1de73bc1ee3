"""The first connect of a replica's connections (videoflow.broker.link.connect
with Outage.known): a broker known to exist (the run was provisioned on it) that is
away when a replica starts is waited for within the outage budget; any other first
connect fails fast, as a mistyped URL should (NATS_FACTS S4)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from pathlib import Path

import pytest

from videoflow.broker import server as embedded
from videoflow.broker.link import Outage, connect
from videoflow.errors import BrokerUnavailable


async def _ignore(error: BaseException) -> None:
    return None


async def _connect_and_flush(url: str, outage: Outage) -> tuple[float, bool]:
    """Seconds the first connect took, and whether the outage was over once the client
    was used (before it is closed, which counts as going away)."""
    began = time.monotonic()
    client = await connect(url, 2.0, _ignore, outage)
    try:
        await client.flush(timeout=2)
        return time.monotonic() - began, not outage.away and outage.back_at is not None
    finally:
        await client.close()


@pytest.mark.timeout(60)
def test_a_known_broker_away_at_the_first_connect_is_waited_for_then_used(
    tmp_path: Path,
) -> None:
    # The port refuses (bound, not listening) until the server takes it, 2 s in.
    refusing = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    refusing.bind(("127.0.0.1", 0))
    port = refusing.getsockname()[1]
    started: list[embedded.EmbeddedServer] = []

    def start_later() -> None:
        time.sleep(2.0)
        refusing.close()
        started.append(embedded.start(tmp_path / "store", extra_args=("-p", str(port))))

    outage = Outage(budget=20.0, known=True)
    thread = threading.Thread(target=start_later)
    thread.start()
    try:
        waited, over = asyncio.run(_connect_and_flush(f"nats://127.0.0.1:{port}", outage))
    finally:
        thread.join()
        for server in started:
            server.stop()
    assert 1.5 <= waited < 20.0, waited
    assert over and outage.given_up is None


@pytest.mark.timeout(60)
def test_a_known_broker_that_never_comes_is_given_up_once_the_budget_is_spent(
    closed_port_url: str,
) -> None:
    outage = Outage(budget=2.0, known=True)
    began = time.monotonic()
    with pytest.raises(BrokerUnavailable, match="unreachable"):
        asyncio.run(connect(closed_port_url, 2.0, _ignore, outage))
    assert 2.0 <= time.monotonic() - began < 15.0


@pytest.mark.timeout(60)
def test_a_first_connect_to_a_broker_not_known_fails_fast(closed_port_url: str) -> None:
    outage = Outage(budget=60.0)
    began = time.monotonic()
    with pytest.raises(BrokerUnavailable, match="unreachable"):
        asyncio.run(connect(closed_port_url, 2.0, _ignore, outage))
    assert time.monotonic() - began < 2.0 and outage.down_since is None
