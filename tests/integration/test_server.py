"""The embedded nats-server: a real process, an OS-chosen port, readiness from its log."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import nats
import pytest
from nats.js import JetStreamContext

from videoflow.broker import server as embedded
from videoflow.errors import EmbeddedServerError

pytestmark = pytest.mark.timeout(60)


@pytest.mark.asyncio
async def test_started_server_accepts_jetstream_clients_on_an_os_chosen_port(
    nats_server: embedded.EmbeddedServer, jetstream: JetStreamContext
):
    assert nats_server.port > 0 and nats_server.url == f"nats://127.0.0.1:{nats_server.port}"
    await jetstream.add_stream(name="probe", subjects=["probe.>"])
    ack = await jetstream.publish("probe.x", b"hello")
    assert ack.stream == "probe" and ack.seq == 1
    assert (nats_server.store_dir / "jetstream").is_dir()


def test_two_servers_run_side_by_side_on_different_ports():
    with embedded.start() as first, embedded.start() as second:
        assert first.port != second.port


def test_temporary_store_is_removed_and_a_given_one_kept(tmp_path: Path):
    server = embedded.start()
    store = server.store_dir
    assert store is not None and store.is_dir()
    server.stop()
    assert not store.exists() and server.process is None

    given = tmp_path / "store"
    with embedded.start(given) as server:
        assert server.store_dir == given
    assert (given / "jetstream").is_dir()


def test_stop_terminates_cleanly_and_twice_is_harmless():
    server = embedded.start()
    process = server.process
    assert process is not None
    log = server.log_text()
    server.stop()
    assert process.returncode == 0, log
    server.stop()
    with pytest.raises(EmbeddedServerError, match="not running"):
        _ = server.url


def test_start_failure_quotes_the_servers_fatal_line(tmp_path: Path):
    not_a_dir = tmp_path / "store"
    not_a_dir.write_text("a file where the store should be")
    with pytest.raises(EmbeddedServerError, match=r"\[FTL\] Can't start JetStream"):
        embedded.start(not_a_dir)


def test_unknown_flag_is_reported_with_the_servers_own_words():
    with pytest.raises(EmbeddedServerError, match="flag provided but not defined"):
        embedded.start(extra_args=("--no-such-flag",))


def test_bad_config_file_is_reported_with_the_servers_own_words(tmp_path: Path):
    config = tmp_path / "bad.conf"
    config.write_text("jetstream { max_mem: not_a_size }\n")
    with pytest.raises(EmbeddedServerError, match="bad.conf:1"):
        embedded.start(extra_args=("-c", str(config)))


@pytest.mark.asyncio
async def test_the_server_takes_messages_up_to_its_max_payload(tmp_path: Path):
    # 8 MiB by default (a raw 1080p frame travels inline), nats-server's own 1 MiB with
    # None, and a config file given in extra_args decides for itself.
    config = tmp_path / "own.conf"
    config.write_text("max_payload: 2MB\n")
    cases = [({}, embedded.DEFAULT_MAX_PAYLOAD), ({"max_payload": None}, 1 << 20),
             ({"max_payload": 3 << 20}, 3 << 20),
             ({"extra_args": ("-c", str(config))}, 2 << 20)]
    for options, expected in cases:
        with embedded.start(**options) as server:
            client = await nats.connect(server.url)
            try:
                assert client.max_payload == expected, options
                if expected == embedded.DEFAULT_MAX_PAYLOAD:
                    await client.publish("x", b"\0" * 6_220_800)  # taken: no error
                    await client.flush()
                    assert client.is_connected
            finally:
                await client.close()
    assert embedded.DEFAULT_MAX_PAYLOAD == 8 << 20


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "8MB"])
def test_a_max_payload_that_is_not_a_positive_int_is_refused(bad: object):
    with pytest.raises(ValueError, match="max_payload"):
        embedded.EmbeddedServer(max_payload=bad)  # type: ignore[arg-type]


def test_configured_binary_that_does_not_exist_is_named(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("VIDEOFLOW_NATS_SERVER", "/nonexistent/nats-server")
    with pytest.raises(EmbeddedServerError, match="/nonexistent/nats-server"):
        embedded.find_binary()


def test_binary_comes_from_the_package_when_nothing_else_names_one(
    monkeypatch: pytest.MonkeyPatch,
):
    monkeypatch.delenv("VIDEOFLOW_NATS_SERVER", raising=False)
    monkeypatch.setenv("PATH", "")
    path = embedded.find_binary()
    assert os.access(path, os.X_OK)
    version = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10)
    assert "nats-server" in version.stdout + version.stderr


@pytest.mark.skipif(sys.platform == "win32", reason="a POSIX shell script stands in for the binary")
def test_a_server_that_ignores_sigterm_is_killed_after_the_grace_period(tmp_path: Path):
    # Process handling only: a script that logs readiness like nats-server, then
    # ignores SIGTERM, must still be gone when stop() returns.
    fake = tmp_path / "stubborn-server"
    fake.write_text(
        "#!/bin/sh\ntrap '' TERM\n"
        "echo '[1] [INF] Listening for client connections on 127.0.0.1:4999'\n"
        "echo '[1] [INF] Server is ready'\nwhile :; do sleep 0.1; done\n"
    )
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    server = embedded.EmbeddedServer(binary=str(fake), stop_grace=0.3).start()
    process = server.process
    assert process is not None and server.port == 4999
    server.stop()
    assert process.returncode is not None and process.returncode < 0
