"""End-to-end fixtures: a real nats-server per test (the flows under test start their
replicas as processes against it)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from videoflow.broker import server as embedded


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[embedded.EmbeddedServer]:
    with embedded.start(tmp_path / "jetstream-store") as server:
        yield server


@pytest.fixture
def out(tmp_path: Path) -> Path:
    """Where the sinks write (the broker's store is elsewhere in tmp_path)."""
    made = tmp_path / "out"
    made.mkdir()
    return made
