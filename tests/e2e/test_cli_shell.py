"""The real `videoflow` command in subprocesses, as a shell runs it: a reader that stops
reading ends the command quietly, a broker URL's password never reaches what the
command prints or logs, and tap, hz and ls watch a flow that runs."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from broker_reads import stream_names
from flow_nodes import applied
from test_cli import HELPERS, base_environment, command, environment, videoflow

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
        return subprocess.run(command(*args), cwd=HELPERS, env=env or base_environment(),
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


@pytest.mark.parametrize("flow, flow_id", [("printing_chain", "cliprint"),
                                           ("raw_printing_chain", "cliraw")])
def test_a_run_whose_reader_stops_reading_stops_quietly_and_dead_letters_nothing(
        nats_server: embedded.EmbeddedServer, tmp_path: Path, flow: str,
        flow_id: str) -> None:
    # `videoflow run F | head -1`: each print of the node failed its input with
    # BrokenPipeError, retried and dead-lettered, for the whole of the run.
    count = 2000  # 20 s at this pace, were it not stopped
    out = tmp_path / "out"
    out.mkdir()
    done = with_closed_reader("run", f"flows:{flow}", "--nats-url", nats_server.url,
                              env=environment(out, count=count, pace=0.01))
    assert done.returncode == EXIT_BROKEN_PIPE, done.stderr
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr
    listed = videoflow("dlq", "list", "--flow", flow_id, "--nats-url", nats_server.url,
                       "--json")
    assert listed.returncode == 0 and json.loads(listed.stdout) == [], listed.stdout
    # The run stopped as a pipeline ends, and what it had taken in went all the way.
    got = sorted(v for (v,) in applied(out))
    assert 0 < len(got) < count and got == [2 * i for i in range(len(got))]


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


def test_run_json_keeps_stdout_for_its_document_and_what_nodes_print_goes_to_stderr(
        nats_server: embedded.EmbeddedServer, tmp_path: Path) -> None:
    done = videoflow("run", "flows:printing_chain", "--nats-url", nats_server.url, "--json",
                     env=environment(tmp_path, count=5))
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)  # the whole of stdout is the one document
    assert report["outcome"] == "completed"
    assert [line for line in done.stderr.splitlines() if line.startswith("scaling")] == [
        f"scaling {n}" for n in range(5)]


def test_an_unreachable_broker_is_named_without_its_password(tmp_path: Path) -> None:
    done = videoflow("provision", "flows:chain", "--out", str(tmp_path / "x.json"),
                     "--nats-url", f"nats://flow:{PASSWORD}@127.0.0.1:1", "--timeout", "3",
                     env=environment(tmp_path))
    assert done.returncode == 1
    assert done.stderr.startswith(
        "videoflow: error: the broker at nats://flow:***@127.0.0.1:1 did not answer")
    assert PASSWORD not in done.stdout + done.stderr


@pytest.mark.parametrize("args", [
    ("--log-format", "json", "ls", "--timeout", "nan"),
    ("ls", "--log-format=json", "--timeout", "nan"),
])
def test_with_log_format_json_a_usage_error_is_a_json_record_too(args: tuple[str, ...]) -> None:
    done = videoflow(*args)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr  # not argparse's usage and line
    record = json.loads(lines[0])
    assert record["level"] == "ERROR" and record["logger"] == "videoflow"
    assert record["message"] == ("error: videoflow ls: argument --timeout: must be a finite "
                                 "number, got 'nan'")


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
    assert warned[0]["replica"] == "warning_scale[0]"


def test_with_log_format_json_stderr_is_json_lines_progress_and_a_replicas_failure_too(
        nats_server: embedded.EmbeddedServer, tmp_path: Path) -> None:
    # Off a terminal, without --json: the view reports on stderr, as JSON lines too.
    done = videoflow("run", "flows:no_model", "--nats-url", nats_server.url,
                     "--log-format", "json", env=environment(tmp_path, count=5))
    assert done.returncode == 1, done.stderr  # the scale replica could not open
    records = [json.loads(line) for line in done.stderr.splitlines()]  # every line
    views = [r for r in records if r["logger"] == "videoflow.run.progress"]
    assert views and all(r["level"] == "INFO" for r in views), records
    assert [n["node"] for n in views[-1]["nodes"]] == ["numbers", "scale", "record"]
    for node in views[-1]["nodes"][1:]:  # readers: a count, or unknown and why
        assert isinstance(node["pending"], int) or node["pending_unknown"], node
    failed = [r for r in records if r["logger"] == "videoflow.run.processes"]
    assert len(failed) == 1 and failed[0]["level"] == "ERROR", records
    assert failed[0]["message"] == (
        "scale[0] failed: RuntimeError: no model file at /models/scale.onnx")
    assert failed[0]["exception"].startswith("Traceback (most recent call last):")
    assert failed[0]["exception"].endswith(
        "RuntimeError: no model file at /models/scale.onnx")
    assert "flow_nodes.py" in failed[0]["exception"]  # the user's file, whole


def test_text_logs_mask_a_password_too(
        nats_server: embedded.EmbeddedServer, tmp_path: Path) -> None:
    done = videoflow("run", "flows:warning_chain", "--nats-url", nats_server.url, "-v",
                     "--json", env=environment(tmp_path, count=5))
    assert done.returncode == 0, done.stderr
    # Logged in the replica's process, which names itself.
    assert "videoflow: warning_scale[0]: flow_nodes: scaling from nats://flow:***@broker:4222" in (
        done.stderr.splitlines())
    assert "hunter2" not in done.stderr


def test_a_refused_connect_logs_its_retries_as_json_and_ends_in_one_error_line(
        tmp_path: Path) -> None:
    done = videoflow("-v", "provision", "flows:chain", "--out", str(tmp_path / "x.json"),
                     "--nats-url", f"nats://flow:{PASSWORD}@127.0.0.1:1", "--timeout", "3",
                     "--log-format", "json", env=environment(tmp_path))
    assert done.returncode == 1
    *logged, last = done.stderr.strip().splitlines()
    error = json.loads(last)  # the command's own error is a record too
    assert (error["level"], error["logger"]) == ("ERROR", "videoflow")
    assert error["message"].startswith("error: the broker at nats://flow:***@127.0.0.1:1")
    assert logged, done.stderr
    for line in logged:
        record = json.loads(line)
        assert record["level"] == "WARNING" and record["logger"].startswith("videoflow.")
    assert PASSWORD not in done.stderr


def watch_a_run(watcher: list[str], url: str, out: Path, **sizes: Any,
                ) -> tuple[subprocess.CompletedProcess[str], str, str, str]:
    """Start a watcher command (tap, hz), wait until it listens (the first line it
    writes to stderr: from then on it misses nothing), run flows:chain, and wait for the
    watcher to end. Returns the run, and the watcher's 'listening on' line, stdout and
    the rest of its stderr."""
    watching = subprocess.Popen(command(*watcher, "--nats-url", url), cwd=HELPERS,
                                env=base_environment(), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    try:
        listening = watching.stderr.readline() if watching.stderr else ""
        assert listening.startswith("listening on "), listening
        run = videoflow("run", "flows:chain", "--nats-url", url, "--json",
                        env=environment(out, **sizes))
        assert run.returncode == 0, run.stderr
        stdout, stderr = watching.communicate(timeout=30)
    finally:
        watching.kill()
    assert watching.returncode == 0, stderr
    return run, listening, stdout, stderr


def test_tap_prints_each_output_of_a_node_decoded_as_the_flow_runs(
        nats_server: embedded.EmbeddedServer, tmp_path: Path) -> None:
    run, listening, out, err = watch_a_run(
        ["tap", "cli", "scale", "--count", "10", "--json", "--seconds", "60"],
        nats_server.url, tmp_path, count=30, pace=0.01)
    assert listening == "listening on vf.cli.*.scale\n"
    lines = [json.loads(line) for line in out.splitlines()]
    run_id = json.loads(run.stdout)["run_id"]
    # The first ten outputs of scale (x2), in order, each with its run and producer.
    assert [line["message"] for line in lines] == [repr(2 * n) for n in range(10)]
    assert {(line["run"], line["producer"]) for line in lines} == {(run_id, "scale")}
    assert err.strip().startswith("tap: 10 messages in ")


def test_tap_logs_each_output_to_a_rerun_file_as_it_prints_it(
        nats_server: embedded.EmbeddedServer, tmp_path: Path) -> None:
    pytest.importorskip("rerun", reason="rerun-sdk (the 'rerun' extra) not installed")
    from rerun_files import read_back

    path = tmp_path / "scale.rrd"
    _, _, out, _ = watch_a_run(
        ["tap", "cli", "scale", "--count", "10", "--json", "--seconds", "60",
         "--rerun", str(path)], nats_server.url, tmp_path, count=30, pace=0.01)
    printed = [json.loads(line) for line in out.splitlines()]
    scale = read_back(path, timed=False)["/scale"]
    assert [list(v) for v in scale["Scalars:scalars"]] == [[2.0 * n] for n in range(10)]
    assert scale["event_time"] == [line["event_ts"] for line in printed]


def test_tap_refuses_a_rerun_target_it_cannot_write_before_listening(tmp_path: Path) -> None:
    tapped = videoflow("tap", "cli", "scale", "--nats-url", "nats://127.0.0.1:1",
                       "--rerun", str(tmp_path / "scale.txt"))
    assert tapped.returncode == 2
    assert "a Rerun target is a path ending in .rrd" in tapped.stderr


def test_hz_reports_a_paced_producers_rate_each_window(
        nats_server: embedded.EmbeddedServer, tmp_path: Path) -> None:
    _, _, out, _ = watch_a_run(
        ["hz", "cli", "numbers", "--window", "1", "--seconds", "15", "--json"],
        nats_server.url, tmp_path, count=150, pace=0.02)
    windows = [json.loads(line) for line in out.splitlines()]
    assert len(windows) == 15
    assert sum(w["messages"] for w in windows) == 150  # every output, in some window
    busy = [w for w in windows if w["messages"] >= 20]
    assert busy, windows
    for window in busy:  # paced at 50/s: a loaded machine is slower, never faster
        assert 15 <= window["rate_per_second"] <= 55, window
        assert window["gap_ms"]["min"] >= 0 and window["event_lag_ms"]["p50"] >= 0


def store_environment(store: Path, out: Path | None = None, **sizes: Any) -> dict[str, str]:
    """The environment of a command given no broker URL: the embedded broker on store."""
    env = base_environment() if out is None else environment(out, **sizes)
    env.pop("VIDEOFLOW_NATS_URL", None)
    env["VIDEOFLOW_STORE_DIR"] = str(store)
    return env


def test_tap_given_no_url_follows_run_after_run_on_the_store_and_keeps_none_out(
        tmp_path: Path) -> None:
    store = tmp_path / "store"
    watching = subprocess.Popen(
        command("tap", "cli", "scale", "--count", "10", "--json", "--seconds", "120"),
        cwd=HELPERS, env=store_environment(store), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    assert watching.stderr is not None
    runs, told = [], []
    try:
        told.append(watching.stderr.readline())
        assert told[0] == f"waiting for a run on the store {store}\n"
        for k in range(2):
            out, gate = tmp_path / f"out{k}", tmp_path / f"gate{k}"
            out.mkdir()
            # A tap that started a server on the store would hold it: this run would
            # wait for it, then fail. Its producer starts once the tap listens on it.
            env = store_environment(store, out, count=5, gate=gate)
            run = subprocess.Popen(command("run", "flows:chain", "--json"), cwd=HELPERS,
                                   env=env, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True)
            while sum(line.startswith("listening on") for line in told) < k + 1:
                told.append(watching.stderr.readline())
                assert told[-1], told  # the tap ended
            gate.touch()
            stdout, stderr = run.communicate(timeout=120)
            assert run.returncode == 0, stderr
            runs.append(json.loads(stdout)["run_id"])
        stdout, rest = watching.communicate(timeout=60)
    finally:
        watching.kill()
        watching.wait()
    assert watching.returncode == 0, rest
    seen = [(line["run"], line["message"]) for line in map(json.loads, stdout.splitlines())]
    assert seen == [(run, repr(2 * n)) for run in runs for n in range(5)]
    told = [line.rstrip("\n") for line in told] + rest.splitlines()
    assert told.count("listening on vf.cli.*.scale") == 2, told
    stopped = [line for line in told if line.startswith("the run's broker at nats://")]
    assert len(stopped) == 1 and stopped[0].endswith(" stopped"), told  # the first run's
    assert told[-1].startswith("tap: 10 messages in "), told


@pytest.mark.parametrize("verbose", [False, True])
def test_tap_says_when_its_broker_is_lost_and_ends_in_one_error_past_the_budget(
        tmp_path: Path, verbose: bool) -> None:
    server = embedded.start(tmp_path / "store")
    url = server.url
    env = base_environment()
    env["VIDEOFLOW_OUTAGE_BUDGET"] = "2"
    watching = subprocess.Popen(command("tap", "cli", "scale", "--nats-url", url,
                                        *(["-v"] if verbose else [])),
                                cwd=HELPERS, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    try:
        said = watching.stderr.readline() if watching.stderr else ""
        assert said == "listening on vf.cli.*.scale\n"
        server.stop()
        stdout, stderr = watching.communicate(timeout=60)
    finally:
        watching.kill()
        watching.wait()
        server.stop()
    assert watching.returncode == 1, stderr
    assert stdout == ""
    gave_up = (f"the broker {url} was unreachable for more than 2 s (the outage budget; "
               "raise it with --outage-budget, outage_budget= or VIDEOFLOW_OUTAGE_BUDGET)")
    # Said once: by the tap, or with -v by the connection's own warnings.
    assert stderr.splitlines() == ([
        f"videoflow: videoflow.broker.link: lost the connection to the broker at {url}; "
        "reconnecting for up to 2 s (the outage budget)",
        f"videoflow: videoflow.broker.link: gave up the connection: {gave_up}"] if verbose
        else [f"lost the broker at {url}; reconnecting"]) + [f"videoflow: error: {gave_up}"]


def test_hz_says_a_window_the_broker_was_away_for_is_unknown_not_zero(tmp_path: Path) -> None:
    # It printed 'rate 0.00/s' while the broker was away: nothing seen is not nothing sent.
    server = embedded.start(tmp_path / "store")
    env = base_environment()
    env["VIDEOFLOW_OUTAGE_BUDGET"] = "30"
    watching = subprocess.Popen(command("hz", "cli", "scale", "--nats-url", server.url,
                                        "--window", "1", "--json"),
                                cwd=HELPERS, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    try:
        assert watching.stdout is not None
        before = json.loads(watching.stdout.readline())  # a window with the broker up
        assert server.process is not None
        server.process.kill()
        server.process.wait()
        windows = [json.loads(watching.stdout.readline()) for _ in range(2)]
        server.restart()
        # Until a whole window with it back, each says unknown; then 0 again.
        for _ in range(6):
            windows.append(json.loads(watching.stdout.readline()))
            if windows[-1]["rate_per_second"] is not None:
                break
    finally:
        watching.kill()
        watching.wait()
        server.stop()
    assert before["rate_per_second"] == 0.0 and "unknown" not in before
    away = [w for w in windows if w["rate_per_second"] is None]
    assert away and all(w["unknown"] == "the broker was away during the window"
                        for w in away), windows
    assert windows[-1]["rate_per_second"] == 0.0, windows  # back: known again


def provision_r1(url: str, tmp_path: Path) -> Callable[[], subprocess.Popen[bytes]]:
    """Run r1 of flows:chain provisioned on url; returns what starts a worker of its
    record node (which pulls, so `ls` tells the run running)."""
    env = environment(tmp_path, count=5)
    spec = tmp_path / "run.json"
    made = videoflow("provision", "flows:chain", "--run", "r1", "--out", str(spec),
                     "--nats-url", url, env=env)
    assert made.returncode == 0, made.stderr
    return lambda: subprocess.Popen(
        command("worker", "--spec", str(spec), "--node", "record", "--nats-url", url),
        cwd=HELPERS, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def test_ls_shows_a_provisioned_run_idle_then_running_once_a_worker_pulls(
        nats_server: embedded.EmbeddedServer, tmp_path: Path) -> None:
    start_worker = provision_r1(nats_server.url, tmp_path)

    def listed() -> list[dict[str, Any]]:
        done = videoflow("ls", "--nats-url", nats_server.url, "--json")
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    assert listed() == [{"flow": "cli", "dead_letters": 0, "runs": [
        {"run": "r1", "streams": 2, "messages": 0, "state": "idle", "outcome": None,
         "started": None, "ended": None}]}]  # numbers, scale; provisioned: no record
    worker = start_worker()
    try:
        deadline = time.monotonic() + 30
        while listed()[0]["runs"][0]["state"] != "running":
            assert time.monotonic() < deadline, listed()
            time.sleep(0.3)
        text = videoflow("ls", "--nats-url", nats_server.url, "--flow", "cli")
        assert text.returncode == 0 and text.stdout.splitlines()[1].split() == [
            "cli", "r1", "running", "2", "0", "-"], text.stdout  # not ended
    finally:
        worker.kill()
        worker.wait(timeout=10)
    assert videoflow("ls", "--nats-url", nats_server.url, "--flow", "other").stdout == (
        "no flows named 'other'\n")


def test_teardown_of_a_running_run_is_refused_unless_forced(
        nats_server: embedded.EmbeddedServer, tmp_path: Path) -> None:
    # Its replicas would wait on streams that are gone: an operator who meant another
    # run, or did not know it still ran, is told, and --force says they did.
    worker = provision_r1(nats_server.url, tmp_path)()
    base = ["teardown", "--nats-url", nats_server.url, "--flow", "cli", "--run", "r1"]
    try:
        deadline = time.monotonic() + 30
        while "running" not in videoflow("ls", "--nats-url", nats_server.url).stdout:
            assert time.monotonic() < deadline
            time.sleep(0.3)
        refused = videoflow(*base)
        assert refused.returncode == 1, refused.stderr
        assert refused.stderr.strip() == (
            "videoflow: error: run 'r1' of flow 'cli' is running (a replica reads its "
            "streams): stop it first (Ctrl-C, or SIGTERM to its `videoflow run`), or pass "
            "--force to tear it down under it")
        assert asyncio.run(stream_names(nats_server.url)) != []  # nothing deleted
        forced = videoflow(*base, "--force")
        assert forced.returncode == 0, forced.stderr
        assert "removed: " in forced.stdout
        assert "the flow's dead-letter stream is kept" in forced.stdout
        # Again: nothing is there, and nothing is said of a stream it did not look at.
        again = videoflow(*base)
        assert again.returncode == 0, again.stderr
        assert again.stdout.splitlines() == [
            "run 'r1' of flow 'cli' has no streams on this broker: nothing to remove (torn "
            "down already, or not that name: videoflow ls lists the runs)"]
    finally:
        worker.kill()
        worker.wait(timeout=10)


def test_off_a_terminal_a_replicas_traceback_is_headed_by_its_name(
        nats_server: embedded.EmbeddedServer, tmp_path: Path) -> None:
    # No live view labels its lines there: in a log, whose traceback is it?
    done = videoflow("run", "flows:no_model", "--nats-url", nats_server.url,
                     env=environment(tmp_path, count=5))
    assert done.returncode == 1, done.stderr
    lines = done.stderr.splitlines()
    at = lines.index("videoflow: scale[0] failed: RuntimeError: no model file at "
                     "/models/scale.onnx")
    assert lines[at + 1] == "Traceback (most recent call last):", lines
