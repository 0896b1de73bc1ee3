"""The real `videoflow` command in subprocesses, as a shell runs it: a reader that stops
reading ends the command quietly, and a broker URL's password never reaches what the
command prints."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_cli import HERE, base_environment, command, environment, videoflow

from videoflow.broker import server as embedded
from videoflow.cli.common import EXIT_BROKEN_PIPE

PASSWORD = "s3cret-pw"


def with_closed_reader(*args: str, env: dict[str, str] | None = None,
                       ) -> subprocess.CompletedProcess[str]:
    """Run the command with its stdout a pipe nobody reads: the read end is closed
    before it starts, so its first write finds the pipe broken (`... | head` once head
    has what it wanted)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(command(*args), cwd=HERE, env=env or base_environment(),
                              stdout=write_end, stderr=subprocess.PIPE, text=True,
                              timeout=120)
    finally:
        os.close(write_end)


def test_dlq_list_json_into_a_closed_pipe_ends_quietly(
        nats_server: embedded.EmbeddedServer, tmp_path: Path) -> None:
    made = videoflow("provision", "flows:chain", "--out", str(tmp_path / "run.json"),
                     "--nats-url", nats_server.url, env=environment(tmp_path))
    assert made.returncode == 0, made.stderr  # the flow's dead-letter stream exists
    done = with_closed_reader("dlq", "list", "--flow", "cli", "--nats-url", nats_server.url,
                              "--json")
    assert done.returncode == EXIT_BROKEN_PIPE, done.stderr
    assert done.stderr == ""
    # The same command, read, succeeds: it was the pipe, not the command.
    read = videoflow("dlq", "list", "--flow", "cli", "--nats-url", nats_server.url, "--json")
    assert read.returncode == 0 and json.loads(read.stdout) == [], read.stderr


@pytest.fixture
def guarded_server(tmp_path: Path) -> Iterator[embedded.EmbeddedServer]:
    """A broker that takes only user 'flow' with PASSWORD."""
    server = embedded.EmbeddedServer(tmp_path / "store",
                                     extra_args=("--user", "flow", "--pass", PASSWORD))
    with server.start():
        yield server


def test_run_json_reports_the_broker_without_its_password(
        guarded_server: embedded.EmbeddedServer, tmp_path: Path) -> None:
    url = f"nats://flow:{PASSWORD}@127.0.0.1:{guarded_server.port}"
    done = videoflow("run", "flows:chain", "--nats-url", url, "--json",
                     env=environment(tmp_path, count=5))
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["outcome"] == "completed"
    assert report["nats_url"] == f"nats://flow:***@127.0.0.1:{guarded_server.port}"
    assert PASSWORD not in done.stdout + done.stderr


def test_an_unreachable_broker_is_named_without_its_password(tmp_path: Path) -> None:
    done = videoflow("provision", "flows:chain", "--out", str(tmp_path / "x.json"),
                     "--nats-url", f"nats://flow:{PASSWORD}@127.0.0.1:1", "--timeout", "3",
                     env=environment(tmp_path))
    assert done.returncode == 1
    assert done.stderr.startswith(
        "videoflow: error: the broker at nats://flow:***@127.0.0.1:1 did not answer")
    assert PASSWORD not in done.stdout + done.stderr


def test_with_log_format_json_the_command_and_its_replicas_log_json_lines(
        nats_server: embedded.EmbeddedServer, tmp_path: Path) -> None:
    done = videoflow("run", "flows:warning_chain", "--nats-url", nats_server.url,
                     "--log-format", "json", "-v", "--json",
                     env=environment(tmp_path, count=5))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["outcome"] == "completed"
    records = [json.loads(line) for line in done.stderr.splitlines() if line.strip()]
    warned = [r for r in records if r["logger"] == "flow_nodes"]
    assert len(warned) == 1, records  # logged once, in the scale replica's process
    assert warned[0]["level"] == "WARNING"
    assert warned[0]["message"] == "scaling from nats://flow:***@broker:4222"
    assert "hunter2" not in done.stderr
    assert set(warned[0]) >= {"time", "level", "logger", "message", "pid"}


def test_text_logs_mask_a_password_too(
        nats_server: embedded.EmbeddedServer, tmp_path: Path) -> None:
    done = videoflow("run", "flows:warning_chain", "--nats-url", nats_server.url, "-v",
                     "--json", env=environment(tmp_path, count=5))
    assert done.returncode == 0, done.stderr
    assert "videoflow: flow_nodes: scaling from nats://flow:***@broker:4222" in (
        done.stderr.splitlines())
    assert "hunter2" not in done.stderr


def test_a_refused_connect_logs_its_retries_as_json_and_ends_in_one_error_line(
        tmp_path: Path) -> None:
    done = videoflow("-v", "provision", "flows:chain", "--out", str(tmp_path / "x.json"),
                     "--nats-url", f"nats://flow:{PASSWORD}@127.0.0.1:1", "--timeout", "3",
                     "--log-format", "json", env=environment(tmp_path))
    assert done.returncode == 1
    *logged, last = done.stderr.strip().splitlines()
    assert last.startswith("videoflow: error: the broker at nats://flow:***@127.0.0.1:1")
    assert logged, done.stderr
    for line in logged:
        record = json.loads(line)
        assert record["level"] == "WARNING" and record["logger"].startswith("videoflow.")
    assert PASSWORD not in done.stderr
