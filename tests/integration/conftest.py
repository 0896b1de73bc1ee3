"""Broker fixtures: a real nats-server per test, as the chain store_dir -> server ->
client -> jetstream (STYLE.md). Never a mock broker."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import nats
import pytest
import pytest_asyncio
from jetstream_helpers import FLOW, RUN, Wired
from nats.js import JetStreamContext

from videoflow.backends.jetstream.backend import JetStreamMessagingBackend
from videoflow.broker import server as embedded
from videoflow.core.constants import BATCH


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


@pytest.fixture
def closed_port_url() -> Iterator[str]:
    """A URL whose port refuses connections: a socket bound but never listening, held for
    the whole test so nothing else can take the port (no bind-then-reuse race)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    try:
        yield f"nats://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()


@pytest.fixture
def start_server() -> Iterator[Callable[..., embedded.EmbeddedServer]]:
    """Starts extra servers with EmbeddedServer's options (extra_args for credentials or
    a config file, jetstream=False); every one is stopped at teardown."""
    started: list[embedded.EmbeddedServer] = []

    def start(**options: Any) -> embedded.EmbeddedServer:
        server = embedded.start(**options)
        started.append(server)
        return server

    try:
        yield start
    finally:
        for server in started:
            server.stop()


@pytest.fixture
def freeze() -> Callable[[embedded.EmbeddedServer], contextlib.AbstractContextManager[None]]:
    """freeze(server): a context in which the test's own server process is stopped
    (SIGSTOP) -- its socket still accepts and holds connections, but nothing is answered
    until SIGCONT on exit."""

    @contextlib.contextmanager
    def frozen(server: embedded.EmbeddedServer) -> Iterator[None]:
        assert server.process is not None
        pid = server.process.pid
        os.kill(pid, signal.SIGSTOP)
        # The signal is asynchronous: until the child is reported stopped it may still
        # answer a request sent after kill() returned.
        _, status = os.waitpid(pid, os.WUNTRACED)
        assert os.WIFSTOPPED(status)
        try:
            yield
        finally:
            os.kill(pid, signal.SIGCONT)

    return frozen


@pytest.fixture
def wired(nats_server: embedded.EmbeddedServer):  # type: ignore[no-untyped-def]
    w = Wired(nats_server.url)
    try:
        yield w
    finally:
        w.close()


@pytest.fixture
def backends(nats_server: embedded.EmbeddedServer):  # type: ignore[no-untyped-def]
    made: list[JetStreamMessagingBackend] = []

    def make(**options: object) -> JetStreamMessagingBackend:
        options.setdefault("fetch_timeout", 0.5)
        backend = JetStreamMessagingBackend(nats_server.url, FLOW, RUN, BATCH,
                                            **options)  # type: ignore[arg-type]
        backend.start()
        made.append(backend)
        return backend

    try:
        yield make
    finally:
        for backend in made:
            backend.shutdown(hand_back=False)

