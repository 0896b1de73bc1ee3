"""Broker fixtures: a real nats-server per test, as the chain store_dir -> server ->
client -> jetstream (STYLE.md). Never a mock broker."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import nats
import pytest
import pytest_asyncio
from nats.js import JetStreamContext

from videoflow import server as embedded


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    return tmp_path / "jetstream-store"


@pytest.fixture
def nats_server(store_dir: Path) -> Iterator[embedded.EmbeddedServer]:
    with embedded.start(store_dir) as server:
        yield server


@pytest_asyncio.fixture
async def nats_client(nats_server: embedded.EmbeddedServer) -> AsyncIterator[nats.NATS]:
    # Fail fast: a refused connect otherwise retries for about two minutes.
    nc = await nats.connect(
        nats_server.url, allow_reconnect=False, max_reconnect_attempts=1, reconnect_time_wait=0.1
    )
    try:
        yield nc
    finally:
        await nc.close()


@pytest.fixture
def jetstream(nats_client: nats.NATS) -> JetStreamContext:
    return nats_client.jetstream()
