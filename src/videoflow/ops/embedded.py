"""The broker an operator command talks to when it is given no URL: the embedded
nats-server on the store a `videoflow run` without a broker URL keeps (per user by
default, or the one --store-dir / VIDEOFLOW_STORE_DIR names), started for the length of
the command."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from videoflow.broker.server import (
    EmbeddedServer,
    StoreBusy,
    answers,
    pid_running,
    read_server_record,
    store_dir_for,
)
from videoflow.errors import EmbeddedServerError


@contextmanager
def embedded_broker(store_dir: str | os.PathLike[str] | None = None) -> Iterator[str]:
    """The URL of the embedded broker on a store, for the length of a with block.

    When no server runs on the store, one is started on it (holding its lock, as a
    'command': a run starting meanwhile waits for it) and stopped at the end of the
    block. When a run's embedded server holds the store (a run in progress, or the
    server of a run whose engine was killed) and answers, its URL is used as it is:
    nothing is started, and nothing is stopped.

    Arguments:
        store_dir: the store; None takes VIDEOFLOW_STORE_DIR, else the per-user
            default (server.store_dir_for).

    Yields:
        the broker's URL.

    Raises:
        EmbeddedServerError: there is no store there (nothing ever ran on it: a status
            or listing would only find an empty broker), or the server cannot start.
        StoreBusy: the store is held by a server that does not answer, or by another
            command for longer than server.LOCK_WAIT_SECONDS.
    """
    path = store_dir_for(store_dir)
    assert path is not None  # not ephemeral: a command's store is never temporary
    if not (path / "jetstream").is_dir():
        raise EmbeddedServerError(
            f"no broker store at {path}: no `videoflow run` without a broker URL has kept "
            "one there; give --nats-url URL (or VIDEOFLOW_NATS_URL) for another broker, "
            "or --store-dir DIR for the store a run used")
    server = EmbeddedServer(path, lock=True, purpose="command")
    running_url = None
    try:
        server.start()
    except StoreBusy as busy:
        running = busy.record
        if running is None or running.purpose != "run" or not answers(running.url):
            raise
        running_url = running.url
    if running_url is not None:
        yield running_url
        return
    try:
        yield server.url
    finally:
        server.stop()


class RunBrokers:
    """The broker a `videoflow run` is using on a store, run after run: what `tap` and
    `hz` given no broker URL follow. They start no server of their own on the store,
    which would hold it and keep a run from starting there for as long as they watch.

    Arguments:
        store_dir: the store; None takes VIDEOFLOW_STORE_DIR, else the per-user
            default (server.store_dir_for).
    """

    def __init__(self, store_dir: str | os.PathLike[str] | None = None) -> None:
        path = store_dir_for(store_dir)
        assert path is not None  # not ephemeral: a command's store is never temporary
        self.store = path

    def __call__(self) -> str | None:
        """The URL of the server a run started on the store, if one holds it and
        answers now; else None. A record left by a server that died (a SIGKILLed
        run's) names a port another server may hold since: its pid must run too."""
        record = read_server_record(self.store)
        if (record is None or record.purpose != "run" or not pid_running(record.pid)
                or not answers(record.url)):
            return None
        return record.url

    def __str__(self) -> str:
        return f"the store {self.store}"
