"""The real `videoflow` command in subprocesses: a run, workers on a provisioned run
(one killed with SIGKILL and restarted, one stopped with SIGTERM), Ctrl-C, and the
one-line errors."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from broker_reads import stream_names, wait_for_pullers
from flow_nodes import applied
from process_tree import alive, descendants_of, replica_pids

from videoflow.backends.shm_payload import shm_root
from videoflow.broker import server as embedded

pytestmark = pytest.mark.timeout(180)

HELPERS = Path(__file__).resolve().parent / "helpers"
"""Where the commands run: a flow reference such as `flows:chain` names a module there."""


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "videoflow", *args]


def base_environment() -> dict[str, str]:
    """This environment, its PYTHONPATH made absolute (the commands run in HELPERS)."""
    env = dict(os.environ)
    if env.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.pathsep.join(
            str(Path(p).resolve()) for p in env["PYTHONPATH"].split(os.pathsep) if p)
    return env


def environment(out: Path, **values: Any) -> dict[str, str]:
    env = base_environment()
    env.update({"VF_TEST_OUT": str(out), **{f"VF_TEST_{k.upper()}": str(v)
                                             for k, v in values.items()}})
    return env


def videoflow(*args: str, env: dict[str, str] | None = None,
              timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command(*args), cwd=HELPERS, env=env or base_environment(),
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def workers() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:  # nothing outlives the test
        if process.poll() is None:
            process.kill()
        process.wait(timeout=30)


def start_worker(workers: list[subprocess.Popen[str]], spec: Path, node: str, url: str,
                 env: dict[str, str], replica: int = 0) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        command("worker", "--spec", str(spec), "--node", node, "--replica", str(replica),
                "--nats-url", url, "--progress-every", "0.5"),
        cwd=HELPERS, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    workers.append(process)
    return process


def wait_for(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def count_applied(out: Path) -> int:
    return sum(1 for p in out.iterdir() if p.name != "applications.log")


def test_run_executes_a_flow_module_and_reports_as_json(
    nats_server: embedded.EmbeddedServer, out: Path,
) -> None:
    done = videoflow("run", "flows:chain", "--nats-url", nats_server.url, "--json",
                     env=environment(out, count=40))
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["outcome"] == "completed" and report["flow_id"] == "cli"
    assert report["nodes"]["record"]["processed"] == 40
    assert sorted(v for (v,) in applied(out)) == [2 * i for i in range(40)]


def test_a_finished_run_is_found_again_by_ls_and_status_with_its_outcome(
    nats_server: embedded.EmbeddedServer, out: Path,
) -> None:
    # Its streams are deleted at its end: ls said "no runs", status needed --run and
    # then said "no streams (never provisioned, or torn down)".
    done = videoflow("run", "flows:chain", "--nats-url", nats_server.url, "--json",
                     env=environment(out, count=5))
    assert done.returncode == 0, done.stderr
    run = json.loads(done.stdout)["run_id"]
    listed = videoflow("ls", "--nats-url", nats_server.url, "--json")
    assert listed.returncode == 0, listed.stderr
    (flow,) = json.loads(listed.stdout)
    (found,) = flow["runs"]
    assert (flow["flow"], found["run"], found["state"], found["outcome"]) == (
        "cli", run, "ended", "completed")
    assert found["started"] <= found["ended"]
    text = videoflow("ls", "--nats-url", nats_server.url).stdout
    assert f"cli   {run}  completed" in text
    status = videoflow("status", "--flow", "cli", "--nats-url", nats_server.url)
    assert status.returncode == 0, status.stderr
    lines = status.stdout.splitlines()
    assert lines[0] == (f"run {run!r} of flow 'cli' (its latest run; videoflow ls --flow "
                        "cli lists them)")
    assert "; completed " in lines[1] and "no streams" not in status.stdout
    assert lines[2] == "its streams were deleted at its end (its dead letters stay)"


def test_a_failed_run_keeps_its_streams_and_no_empty_folder_in_shared_memory(
    nats_server: embedded.EmbeddedServer, out: Path,
) -> None:
    # Its scale replica cannot open: the run fails before any payload was written. Its
    # streams are kept to resume it; its shared-memory folder stayed there, empty.
    done = videoflow("run", "flows:no_model", "--nats-url", nats_server.url, "--json",
                     env=environment(out, count=5))
    assert done.returncode == 1, done.stderr
    run = json.loads(done.stdout)["run_id"]
    assert not (shm_root() / "clinomodel" / run).exists()
    listed = videoflow("ls", "--nats-url", nats_server.url, "--json")
    (found,) = json.loads(listed.stdout)[0]["runs"]
    assert (found["run"], found["state"], found["outcome"]) == (run, "idle", "failed")
    assert found["streams"] == 2


def test_dead_letters_of_a_run_are_listed_by_the_dlq_command(
    nats_server: embedded.EmbeddedServer, out: Path,
) -> None:
    done = videoflow("run", "flows:poison", "--nats-url", nats_server.url, "--json",
                     env=environment(out, count=30))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["nodes"]["reject_multiples_of"]["dead_lettered"] == 4
    listed = videoflow("dlq", "list", "--flow", "clipoison", "--nats-url", nats_server.url,
                       "--json")
    assert listed.returncode == 0, listed.stderr
    records = json.loads(listed.stdout)
    assert len(records) == 4
    text = videoflow("dlq", "list", "--flow", "clipoison", "--nats-url", nats_server.url)
    assert text.returncode == 0 and text.stdout.count("poison") >= 4


def test_a_worker_killed_mid_run_and_restarted_loses_nothing_and_applies_once(
    nats_server: embedded.EmbeddedServer, out: Path, tmp_path: Path,
    workers: list[subprocess.Popen[str]],
) -> None:
    env = environment(out, count=300, pace=0.01)
    spec = tmp_path / "run.json"
    done = videoflow("provision", "flows:chain", "--out", str(spec), "--nats-url",
                     nats_server.url, "--ack-wait", "2", env=env)
    assert done.returncode == 0, done.stderr
    url = nats_server.url
    sink = start_worker(workers, spec, "record", url, env)
    scale = start_worker(workers, spec, "scale", url, env)
    start_worker(workers, spec, "numbers", url, env)
    wait_for(lambda: count_applied(out) >= 60, 60, "the sink to apply 60 groups")
    scale.send_signal(signal.SIGKILL)  # no last words, no hand-back
    assert scale.wait(timeout=10) == -signal.SIGKILL
    start_worker(workers, spec, "scale", url, env)  # its replacement
    wait_for(lambda: count_applied(out) >= 150, 60, "the sink to apply 150 groups")
    sink.send_signal(signal.SIGKILL)  # whatever it applied but had not acked comes back
    assert sink.wait(timeout=10) == -signal.SIGKILL
    sink = start_worker(workers, spec, "record", url, env)
    assert sink.wait(timeout=90) == 0, sink.stderr.read() if sink.stderr else ""
    # Nothing lost, and each group's effect applied once (the sink keys its effects on
    # the group's identity, so a redelivered group finds its effect already there).
    assert sorted(v for (v,) in applied(out)) == [2 * i for i in range(300)]


def test_sigterm_on_a_replica_hands_its_parked_inputs_to_the_survivor_at_once(
    nats_server: embedded.EmbeddedServer, out: Path, tmp_path: Path,
    workers: list[subprocess.Popen[str]],
) -> None:
    # ack_wait 60: had the quiesced replica kept its prefetched inputs until their
    # leases lapsed, the run could not end within the 30 s allowed below.
    env = environment(out, count=120, sink_pace=0.05, sink_replicas=2)
    spec = tmp_path / "run.json"
    done = videoflow("provision", "flows:chain", "--out", str(spec), "--nats-url",
                     nats_server.url, "--ack-wait", "60", env=env)
    assert done.returncode == 0, done.stderr
    url = nats_server.url
    survivor = start_worker(workers, spec, "record", url, env, replica=0)
    leaving = start_worker(workers, spec, "record", url, env, replica=1)
    # Both sink replicas pull before any input exists: a replica still starting when
    # the inputs come would find the other holding them all, and hold none to hand on.
    asyncio.run(wait_for_pullers(url, "record--from--scale", 2, 60))
    start_worker(workers, spec, "scale", url, env)
    start_worker(workers, spec, "numbers", url, env)
    log = out / "applications.log"
    wait_for(lambda: log.exists() and len({line.split()[1] for line in
                                           log.read_text().splitlines()}) == 2,
             60, "both replicas to apply inputs")
    leaving.send_signal(signal.SIGTERM)
    stopped = time.monotonic()
    assert leaving.wait(timeout=30) == 0
    assert "quiesced" in (leaving.stderr.read() if leaving.stderr else "")
    assert survivor.wait(timeout=30) == 0
    assert time.monotonic() - stopped < 30
    assert sorted(v for (v,) in applied(out)) == [2 * i for i in range(120)]


def interrupt_a_run(out: Path, *options: str) -> tuple[dict[str, Any], list[int]]:
    """Start `videoflow run`, let the sink apply some groups, then press Ctrl-C: SIGINT
    to the run's whole process group, as a terminal sends it. Returns the report and
    the processes the run had started."""
    env = environment(out, count=100000, pace=0.005)
    run = subprocess.Popen(command("run", "flows:chain", "--json", *options), cwd=HELPERS,
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           start_new_session=True)
    try:
        wait_for(lambda: count_applied(out) >= 20, 60, "the flow to get going")
        children = descendants_of(run.pid)
        assert len(replica_pids(run.pid)) == 3  # a process per replica
        os.killpg(run.pid, signal.SIGINT)
        stdout, stderr = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    assert run.returncode == 130, stderr  # 128 + SIGINT, as a shell expects of Ctrl-C
    # The key was heard, and what another press would do is said.
    assert "videoflow: stopping: the producers end their streams" in stderr, stderr
    report = json.loads(stdout)
    assert report["outcome"] == "stopped" and report["stopped_by"] == "SIGINT"
    assert report["left_over"] is False  # drained: nothing left to resume
    # Nothing lost: everything the producer published reached the sink.
    emitted = report["nodes"]["numbers"]["emitted"]
    assert 20 <= emitted < 100000
    assert sorted(v for (v,) in applied(out)) == [2 * i for i in range(emitted)]
    # Nothing left running.
    wait_for(lambda: not any(alive(pid) for pid in children), 5, "the children to end")
    return report, children


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads child processes from /proc")
def test_ctrl_c_stops_a_batch_run_cleanly_losing_nothing(
    nats_server: embedded.EmbeddedServer, out: Path,
) -> None:
    report, _ = interrupt_a_run(out, "--nats-url", nats_server.url)
    assert [n for n in asyncio.run(stream_names(nats_server.url))
            if report["run_id"] in n] == []  # the run's streams are gone


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads child processes from /proc")
def test_ctrl_c_on_the_embedded_broker_drains_before_the_broker_stops(
    out: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The run's own nats-server is spared the terminal's SIGINT: the flow still drains
    through it, and the run stops it afterwards."""
    monkeypatch.delenv("VIDEOFLOW_NATS_URL", raising=False)
    report, _ = interrupt_a_run(out)  # its checks: stopped, nothing lost, nothing left
    assert report["torn_down"] is True  # the broker was still there to tear down on


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads child processes from /proc")
def test_a_second_ctrl_c_exits_130_and_the_report_says_the_run_is_unfinished(
    nats_server: embedded.EmbeddedServer, out: Path,
) -> None:
    # The sink applies 20 groups a second, the producer publishes 200: the second press
    # comes with a backlog left, which the run keeps (it exited 0 saying "stopped").
    env = environment(out, count=100000, pace=0.005, sink_pace=0.05)
    run = subprocess.Popen(command("run", "flows:chain", "--nats-url", nats_server.url),
                           cwd=HELPERS, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, start_new_session=True)
    try:
        wait_for(lambda: count_applied(out) >= 20, 60, "the flow to get going")
        children = descendants_of(run.pid)
        os.killpg(run.pid, signal.SIGINT)
        time.sleep(1.0)
        assert run.poll() is None  # still draining the backlog
        os.killpg(run.pid, signal.SIGINT)
        stdout, stderr = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    assert run.returncode == 130, stderr
    assert "videoflow: stopping every replica now" in stderr, stderr
    lines = stdout.splitlines()
    run_id = lines[0].split()[1]
    assert " of flow 'cli' (batch): stopped by SIGINT in " in lines[0], stdout
    assert lines[0].endswith(", unfinished: work left over, kept"), stdout
    (kept,) = [line for line in lines if line.startswith(f"  kept run {run_id} (unprocessed: ")]
    assert f"videoflow run flows:chain --nats-url {nats_server.url} --resume {run_id}" in kept
    wait_for(lambda: not any(alive(pid) for pid in children), 5, "the children to end")
    values = [v for (v,) in applied(out)]
    assert len(values) == len(set(values))  # none applied twice


def test_resuming_a_run_that_is_not_kept_is_refused_and_starts_nothing(
    nats_server: embedded.EmbeddedServer, out: Path,
) -> None:
    # A typo in the run id, a run torn down, another flow's run: started afresh under
    # that id, the flow would publish every output again and say "completed".
    done = videoflow("run", "flows:chain", "--nats-url", nats_server.url,
                     "--resume", "rNOPE", env=environment(out, count=10))
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "run 'rNOPE' of flow 'cli' has no stream for node" in lines[0]
    assert "nothing to resume" in lines[0], lines
    assert asyncio.run(stream_names(nats_server.url)) == []  # nothing provisioned


def test_a_new_run_given_the_id_of_a_run_on_the_broker_is_refused_and_starts_nothing(
    nats_server: embedded.EmbeddedServer, out: Path, tmp_path: Path,
) -> None:
    # Started afresh under a running run's id it took that run's durables over (its
    # sink failed, superseded); under a kept one's it mixed the old messages in.
    env = environment(out, count=10)
    made = videoflow("provision", "flows:chain", "--run", "r1", "--out",
                     str(tmp_path / "run.json"), "--nats-url", nats_server.url, env=env)
    assert made.returncode == 0, made.stderr
    before = asyncio.run(stream_names(nats_server.url))
    done = videoflow("run", "flows:chain", "--nats-url", nats_server.url, "--run", "r1",
                     env=env)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "run 'r1' of flow 'cli' is already on this broker (idle)" \
        in lines[0], lines
    # The way on names this flow and broker, not placeholders.
    assert f"videoflow run flows:chain --nats-url {nats_server.url} --resume r1" in lines[0]
    assert asyncio.run(stream_names(nats_server.url)) == before
    assert applied(out) == []  # nothing ran


WHOLE_RUN_RACES = 3
"""How many times two `videoflow run --run ID` race for one id (test_run_claims races
the claim itself many more times)."""


def test_two_runs_started_at_once_with_one_id_one_runs_and_the_other_is_refused(
    nats_server: embedded.EmbeddedServer, tmp_path: Path,
) -> None:
    # Both passed the check for the id's streams and ran, into each other's durables
    # (issue 46). The winner's producer waits at a gate until the loser has ended, so
    # the loser always meets the winner's run, never one that is already over.
    refusals = []
    for n in range(WHOLE_RUN_RACES):
        run_id, gate = f"race{n}", tmp_path / f"gate{n}"
        outs = [tmp_path / f"out{n}-{side}" for side in "ab"]
        runs = []
        for out in outs:
            out.mkdir()
            runs.append(subprocess.Popen(
                command("run", "flows:chain", "--nats-url", nats_server.url, "--run", run_id),
                cwd=HELPERS, env=environment(out, count=5, gate=gate),
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        try:
            wait_for(lambda started=runs: any(r.poll() is not None for r in started), 90,
                     "one of the two runs to end")
            gate.touch()
            ended = [r.communicate(timeout=120) for r in runs]
        finally:
            for r in runs:
                if r.poll() is None:
                    r.kill()
                    r.wait(timeout=30)
        codes = sorted(r.returncode for r in runs)
        assert codes == [0, 2], ended
        winner, loser = (0, 1) if runs[0].returncode == 0 else (1, 0)
        (line,) = ended[loser][1].strip().splitlines()
        assert f"run {run_id!r} of flow 'cli'" in line and "needs an id of its own" in line
        refusals.append(line)
        assert applied(outs[loser]) == []  # nothing of it ran
        assert sorted(v for (v,) in applied(outs[winner])) == [0, 2, 4, 6, 8]
    print("the losers said:", *refusals, sep="\n")


@pytest.mark.parametrize("budget", ["nan", "-1", "soon"])
def test_a_bad_outage_budget_in_the_environment_is_one_line_before_anything_starts(
    out: Path, budget: str,
) -> None:
    # It was read in each replica: a traceback per replica, then a failed run.
    env = {**environment(out, count=5), "VIDEOFLOW_OUTAGE_BUDGET": budget}
    done = videoflow("run", "flows:chain", "--ephemeral", env=env)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"videoflow: error: VIDEOFLOW_OUTAGE_BUDGET must be a finite number of seconds "
        f">= 0, got {budget!r}"], done.stderr
    assert applied(out) == []


def test_a_run_kept_after_its_broker_was_lost_names_the_command_that_resumes_it(
    tmp_path: Path, out: Path,
) -> None:
    server = embedded.start(tmp_path / "store")
    url = server.url
    try:
        run = subprocess.Popen(
            command("run", "flows:chain", "--nats-url", url, "--outage-budget", "2",
                    "--json"), cwd=HELPERS, env=environment(out, count=100000, pace=0.005),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            wait_for(lambda: count_applied(out) >= 20, 60, "the flow to get going")
            server.stop()
            stdout, stderr = run.communicate(timeout=90)
        finally:
            if run.poll() is None:
                run.kill()
    finally:
        server.stop()
    assert run.returncode == 1, stderr
    report = json.loads(stdout)
    assert report["outcome"] == "failed" and not report["torn_down"]
    # The flow it ran and the broker it ran on, not placeholders.
    assert (f"videoflow run flows:chain --nats-url {url} --resume {report['run_id']}"
            in report["kept"]), report
    assert "raise it with --outage-budget" in stderr, stderr


@pytest.mark.parametrize("args, message", [
    (("run", "flows"), "a flow is named module:attribute"),
    (("run", "nowhere:flow"), "cannot import 'nowhere'"),
    (("run", "flows:missing"), "'flows' has no attribute 'missing'"),
    (("run", "flows:not_a_flow"), "flows:not_a_flow is a int, not a Flow"),
    (("worker", "--spec", "/nonexistent.json", "--node", "x"), "cannot read the run spec"),
])
def test_bad_arguments_get_one_line_and_exit_code_2(args: tuple[str, ...],
                                                    message: str) -> None:
    done = videoflow(*args)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [f"videoflow: error: {message}"] or (
        message in done.stderr and len(done.stderr.strip().splitlines()) == 1), done.stderr


def test_an_unreachable_broker_gets_one_line_not_a_traceback(tmp_path: Path) -> None:
    done = videoflow("provision", "flows:chain", "--out", str(tmp_path / "x.json"),
                     "--nats-url", "nats://127.0.0.1:1", "--timeout", "3",
                     env=environment(tmp_path))
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("videoflow: error: the broker at "
                                                   "nats://127.0.0.1:1 did not answer")


def test_a_run_on_an_unreachable_broker_fails_at_once_naming_the_cause(tmp_path: Path) -> None:
    # Not after provisioning waited out its 30 s retrying, with the cause dropped.
    started = time.monotonic()
    done = videoflow("run", "flows:chain", "--nats-url", "nats://127.0.0.1:1",
                     env=environment(tmp_path))
    took = time.monotonic() - started
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "videoflow: error: the broker at nats://127.0.0.1:1 did not answer"), lines
    assert "ConnectionRefusedError" in lines[0], lines
    assert took < 15, took  # the first connect's bound is 10 s; provisioning's was 30


def test_a_run_on_a_port_that_does_not_speak_nats_says_so(tmp_path: Path) -> None:
    # A port that accepts and never greets (a web server, say): the connect times out
    # with an empty TimeoutError, which said nothing ("TimeoutError: ").
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        done = videoflow("run", "flows:chain", "--nats-url", f"nats://127.0.0.1:{port}",
                         env=environment(tmp_path))
    assert done.returncode == 1
    (line,) = done.stderr.strip().splitlines()
    assert line.endswith("nothing there answered as a NATS server would: is it the "
                         "broker's client port?"), line
    assert "TimeoutError: " not in line, line
