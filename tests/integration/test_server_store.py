"""The embedded broker's store held by one server at a time: nats-server does not lock
its store directory itself, so videoflow's locked servers do (videoflow.broker.server)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from videoflow.broker import server as embedded
from videoflow.broker.server import LOCK_FILE, SERVER_RECORD, StoreBusy, read_server_record

pytestmark = pytest.mark.timeout(60)


def test_nats_server_itself_lets_two_servers_share_one_store(tmp_path: Path) -> None:
    # Why videoflow locks: unlocked, a second server on the same store starts and both
    # write it (nats-server 2.15.1).
    with embedded.start(tmp_path / "store") as first, \
            embedded.start(tmp_path / "store") as second:
        assert first.process is not None and second.process is not None
        assert first.process.poll() is None and second.process.poll() is None


def test_a_locked_store_refuses_a_second_run_naming_the_first_and_the_way_out(
        tmp_path: Path) -> None:
    store = tmp_path / "store"
    with embedded.EmbeddedServer(store, lock=True) as first:
        assert first.process is not None
        record = read_server_record(store)
        assert record == embedded.ServerRecord(first.url, first.process.pid, os.getpid(),
                                               "run")
        started = time.monotonic()
        with pytest.raises(StoreBusy, match="--store-dir DIR .*--ephemeral") as busy:
            embedded.EmbeddedServer(store, lock=True).start()
        assert time.monotonic() - started < 5  # a run's hold is refused, not waited on
        assert busy.value.record == record and first.url in str(busy.value)
        assert not busy.value.orphaned and "wait for it to end" in str(busy.value)
    # Let go at stop: the record is gone and the next server takes the store.
    assert not (store / SERVER_RECORD).exists() and (store / LOCK_FILE).exists()
    with embedded.EmbeddedServer(store, lock=True) as second:
        assert read_server_record(store) is not None
        assert second.url


def test_a_commands_hold_is_waited_for(tmp_path: Path) -> None:
    store = tmp_path / "store"
    command = embedded.EmbeddedServer(store, lock=True, purpose="command").start()
    stopper = threading.Timer(1.0, command.stop)
    stopper.start()
    try:
        started = time.monotonic()
        with embedded.EmbeddedServer(store, lock=True) as run:
            assert time.monotonic() - started >= 0.9
            record = read_server_record(store)
            assert record is not None and record.purpose == "run" and record.url == run.url
    finally:
        stopper.join()
        command.stop()


def test_a_command_waits_no_longer_than_lock_wait(tmp_path: Path) -> None:
    store = tmp_path / "store"
    with embedded.EmbeddedServer(store, lock=True, purpose="command"):
        started = time.monotonic()
        with pytest.raises(StoreBusy, match="videoflow command"):
            embedded.EmbeddedServer(store, lock=True, lock_wait=0.5).start()
        assert 0.5 <= time.monotonic() - started < 5


@pytest.mark.skipif(sys.platform == "win32", reason="the lock is inherited on POSIX only")
def test_the_lock_outlives_a_killed_owner_for_as_long_as_its_server_runs(
        tmp_path: Path) -> None:
    store = tmp_path / "store"
    owner = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from videoflow.broker import server; "
         f"s = server.EmbeddedServer({str(store)!r}, lock=True).start(); "
         "print(s.process.pid, flush=True); time.sleep(600)"],
        stdout=subprocess.PIPE, text=True)
    assert owner.stdout is not None
    server_pid = int(owner.stdout.readline())
    try:
        owner.send_signal(signal.SIGKILL)  # no stop(): the nats-server is orphaned
        owner.wait(timeout=10)
        with pytest.raises(StoreBusy, match=f"pid {owner.pid} is gone .*kill {server_pid}"
                           ) as busy:
            embedded.EmbeddedServer(store, lock=True).start()
        assert busy.value.record is not None and busy.value.record.pid == server_pid
        assert busy.value.orphaned
        assert embedded.answers(busy.value.record.url)
    finally:
        os.kill(server_pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while True:  # once the orphan is gone, so is its hold
        try:
            with embedded.EmbeddedServer(store, lock=True) as server:
                assert server.url
            break
        except StoreBusy:
            assert time.monotonic() < deadline, "the orphan's lock was never let go"
            time.sleep(0.1)


def test_answers_tells_a_nats_server_from_a_closed_port(closed_port_url: str) -> None:
    with embedded.start() as running:
        assert embedded.answers(running.url)
    assert not embedded.answers(closed_port_url)
