"""Process supervision by the local engine, end to end on a real nats-server: SIGTERM
to `videoflow run` stops the run as a first Ctrl-C (a second quiesces), a SIGKILLed
engine leaves no replica behind, and an input that kills every process it is handed
to is dead-lettered as 'crashed_worker' while the flow completes; the report names
every restart and every failure's reason."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from broker_reads import stream_names
from flow_nodes import applied
from process_tree import alive, children_of, replica_pids
from supervision_nodes import crash_loop, one_fails_to_start
from test_cli import HELPERS, command, count_applied, environment, wait_for

from videoflow.broker import server as embedded
from videoflow.ops import dlq_list, embedded_broker, teardown
from videoflow.ops.runs import list_flows

pytestmark = [pytest.mark.timeout(180),
              pytest.mark.skipif(not Path("/proc").is_dir(),
                                 reason="reads the engine's child processes from /proc")]


def start_run(out: Path, url: str, *options: str, **sizes: Any) -> subprocess.Popen[str]:
    """`videoflow run flows:chain` (numbers -> scale -> record) on url, in a session of
    its own so a failed test can kill what it started."""
    env = environment(out, **{"count": 100000, "pace": 0.005, **sizes})
    return subprocess.Popen(command("run", "flows:chain", "--nats-url", url, *options),
                            cwd=HELPERS, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def finish(run: subprocess.Popen[str], timeout: float) -> tuple[str, str]:
    try:
        return run.communicate(timeout=timeout)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()


@pytest.mark.parametrize("as_json", [True, False], ids=["json", "table"])
def test_sigterm_to_videoflow_run_stops_it_as_a_first_ctrl_c_does(
    nats_server: embedded.EmbeddedServer, out: Path, as_json: bool,
) -> None:
    # SIGTERM to the engine alone, as `timeout`, docker stop and Kubernetes send it
    # (a terminal's Ctrl-C reaches the whole process group instead).
    run = start_run(out, nats_server.url, *(["--json"] if as_json else []))
    try:
        wait_for(lambda: count_applied(out) >= 20, 60, "the flow to get going")
        replicas = replica_pids(run.pid)
        assert len(replicas) == 3  # numbers, scale, record
        run.send_signal(signal.SIGTERM)
    finally:
        stdout, stderr = finish(run, 60)
    assert run.returncode == 143, stderr  # 128 + SIGTERM, as a shell reports it
    if as_json:
        report = json.loads(stdout)
        assert report["outcome"] == "stopped" and report["torn_down"] is True
        assert report["stopped_by"] == "SIGTERM" and report["left_over"] is False
        emitted, run_id = report["nodes"]["numbers"]["emitted"], report["run_id"]
        assert {key: node["outcomes"] for key, node in report["nodes"].items()} == {
            "numbers": {"numbers[0]": "ended"}, "scale": {"scale[0]": "ended"},
            "record": {"record[0]": "ended"}}
    else:  # the table a terminal shows
        head, _, *rows = stdout.splitlines()
        assert " of flow 'cli' (batch): stopped by SIGTERM in " in head
        assert "restart" not in head and "unfinished" not in head
        run_id = head.split()[1]
        (numbers,) = [row.split() for row in rows if row.split()[0] == "numbers"]
        emitted = int(numbers[3])
        (record,) = [row.split() for row in rows if row.split()[0] == "record"]
        assert int(record[2]) == emitted  # processed
    # The control stop: the producer stopped, everything it published was processed,
    # each value applied once.
    assert 20 <= emitted < 100000
    assert sorted(v for (v,) in applied(out)) == [2 * i for i in range(emitted)]
    wait_for(lambda: not any(alive(pid) for pid in replicas), 5, "the replicas to end")
    assert [n for n in asyncio.run(stream_names(nats_server.url)) if run_id in n] == []


def test_sigterm_to_the_whole_process_group_is_a_first_ctrl_c_too(
    nats_server: embedded.EmbeddedServer, out: Path,
) -> None:
    """systemd (KillMode=control-group, its default) and `timeout` send SIGTERM to
    every process of the run, the replicas too: they leave it to the engine, which
    stops the flow and drains it, as after a terminal's Ctrl-C."""
    run = start_run(out, nats_server.url, "--json")
    try:
        wait_for(lambda: count_applied(out) >= 20, 60, "the flow to get going")
        replicas = replica_pids(run.pid)
        assert len(replicas) == 3
        os.killpg(run.pid, signal.SIGTERM)
    finally:
        stdout, stderr = finish(run, 60)
    assert run.returncode == 143, stderr
    report = json.loads(stdout)
    assert report["outcome"] == "stopped"
    # Drained, not quiesced: every replica reached its end of stream, and everything
    # the producer published was applied, once.
    assert {key: node["outcomes"] for key, node in report["nodes"].items()} == {
        "numbers": {"numbers[0]": "ended"}, "scale": {"scale[0]": "ended"},
        "record": {"record[0]": "ended"}}
    emitted = report["nodes"]["numbers"]["emitted"]
    assert 20 <= emitted < 100000
    assert sorted(v for (v,) in applied(out)) == [2 * i for i in range(emitted)]
    wait_for(lambda: not any(alive(pid) for pid in replicas), 5, "the replicas to end")


def test_a_second_sigterm_quiesces_the_replicas_as_a_second_ctrl_c_does(
    nats_server: embedded.EmbeddedServer, out: Path,
) -> None:
    # The sink applies 20 groups a second and the producer publishes 200: after the
    # first SIGTERM the backlog would take minutes to drain; the second quiesces.
    run = start_run(out, nats_server.url, "--json", sink_pace=0.05)
    try:
        wait_for(lambda: count_applied(out) >= 20, 60, "the flow to get going")
        replicas = replica_pids(run.pid)
        assert len(replicas) == 3
        run.send_signal(signal.SIGTERM)
        time.sleep(2.0)
        assert run.poll() is None  # still draining the backlog
        run.send_signal(signal.SIGTERM)
        quiesced_at = time.monotonic()
    finally:
        stdout, stderr = finish(run, 60)
    assert run.returncode == 143, stderr
    assert time.monotonic() - quiesced_at < 30
    report = json.loads(stdout)
    # The producer had ended on the stop, the fast processor most likely too; the
    # slow sink quiesced with a backlog left, which the run keeps.
    assert report["outcome"] == "stopped" and report["stopped_by"] == "SIGTERM"
    assert report["left_over"] is True and report["kept"].startswith("kept run ")
    outcomes = {key: node["outcomes"] for key, node in report["nodes"].items()}
    assert outcomes["numbers"] == {"numbers[0]": "ended"}
    assert outcomes["scale"]["scale[0]"] in ("ended", "quiesced")
    assert outcomes["record"] == {"record[0]": "quiesced"}
    assert report["nodes"]["record"]["processed"] < report["nodes"]["numbers"]["emitted"]
    wait_for(lambda: not any(alive(pid) for pid in replicas), 5, "the replicas to end")
    values = [v for (v,) in applied(out)]
    assert len(values) == len(set(values))  # none applied twice


def tear_down_every_run(url: str) -> None:
    """What a killed engine left on its broker, torn down as an operator does
    (`videoflow teardown`), and its run's folder in shared memory with it: the broker
    goes with the test, the folder in /dev/shm stayed."""
    for flow in list_flows(url, timeout=10):
        for run in flow.runs:
            assert teardown(url, flow.flow_id, run.run_id, timeout=10).complete


def test_a_sigkilled_engine_leaves_no_replica_running(
    nats_server: embedded.EmbeddedServer, out: Path,
) -> None:
    run = start_run(out, nats_server.url, "--json")
    replicas: list[int] = []
    try:
        wait_for(lambda: count_applied(out) >= 20, 60, "the flow to get going")
        replicas += replica_pids(run.pid)
        assert len(replicas) == 3
        run.send_signal(signal.SIGKILL)  # no handler, no reaping: the kernel's word only
        assert run.wait(timeout=10) == -signal.SIGKILL
        killed = time.monotonic()
        wait_for(lambda: not any(alive(pid) for pid in replicas), 10,
                 "the replicas of the killed engine to end")
        assert time.monotonic() - killed < 10
        # And the flow's work stopped with them: nothing more is applied.
        applied_then = count_applied(out)
        time.sleep(1.0)
        assert count_applied(out) == applied_then
        # They quiesced, none failed (a report the dead engine cannot read is no
        # node's failure, whose abort would reach its descendants).
        _, stderr = run.communicate(timeout=10)
        assert "Traceback" not in stderr, stderr
    finally:  # what this test started ends with it, whatever the engine left
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
        for pid in replicas:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        tear_down_every_run(nats_server.url)


def dead_pids(log: Path) -> list[int]:
    return [int(line) for line in log.read_text().split()] if log.exists() else []


@pytest.mark.parametrize("how, ended", [("kill", "killed by SIGKILL"),
                                        ("exit", "exit code 1")])
def test_an_input_that_kills_every_process_is_dead_lettered_as_crashed_worker(
    nats_server: embedded.EmbeddedServer, out: Path, tmp_path: Path, how: str, ended: str,
) -> None:
    log = tmp_path / "deaths.log"
    flow = crash_loop(str(out), at=7, how=how, log=str(log))
    # ack_wait 2: how long the dead process's input waits to come back.
    report = flow.run(nats_server.url, view=False, ack_wait=2, max_restarts=3,
                      crash_limit=2, stop_after=60)
    assert report.outcome == "completed", report.format()
    # Two processes died on input 7 (stream sequence 8); the third never got it.
    pids = dead_pids(log)
    assert len(pids) == 2
    crash = report.nodes["crash_on"]
    assert crash.restarts == 2 and crash.dead_lettered == 1
    assert [(d.replica, d.pid, d.how, d.in_hand, d.restarted) for d in crash.deaths] == [
        ("crash_on[0]", pid, ended, ["numbers:8"], True) for pid in pids]
    assert 0 < crash.deaths[0].at_seconds < crash.deaths[1].at_seconds < report.seconds
    assert crash.outcomes["crash_on[0]"] == "ended"
    # Every other input applied, once.
    assert sorted(v for (v,) in applied(out)) == [v for v in range(30) if v != 7]
    # The dead letter: the input as it arrived, why, and how the processes ended.
    letters = [e.record for e in dlq_list(nats_server.url, flow.flow_id,
                                          run_id=report.run_id)]
    assert [(r.node, r.parent, r.stream_seq, r.reason) for r in letters if r] == [
        ("crash_on", "numbers", 8, "crashed_worker")]
    assert letters[0] is not None and letters[0].error_type.endswith("WorkerCrashed")
    assert f"({ended}, {ended})" in letters[0].error_message
    # The printed report names each restart.
    text = report.format()
    assert ", 2 restarts" in text.splitlines()[0]
    for pid in pids:
        assert (f"crash_on[0] died: process {pid} {ended}" in text
                and "processing numbers:8; started again" in text), text


def test_a_restarted_only_replica_gets_its_dead_process_inputs_at_once_not_after_ack_wait(
    nats_server: embedded.EmbeddedServer, out: Path, tmp_path: Path,
) -> None:
    # With the default ack_wait (30 s) each restart waited for the dead process's
    # leases to lapse: a user's 30-input flow with one crash took 61 s.
    log = tmp_path / "deaths.log"
    # A name its durables spell otherwise (crash_on--from--numbers): found all the same.
    flow = crash_loop(str(out), at=7, how="kill", log=str(log), name="crash.on")
    report = flow.run(nats_server.url, view=False, ack_wait=30, max_restarts=3,
                      crash_limit=2, stop_after=120)
    assert report.outcome == "completed", report.format()
    crash = report.nodes["crash.on"]
    assert crash.restarts == 2 and crash.dead_lettered == 1
    # Two deaths, each input back at once: far below one ack_wait, let alone two.
    assert report.seconds < 25, report.format()
    assert sorted(v for (v,) in applied(out)) == [v for v in range(30) if v != 7]


def test_competing_replicas_share_the_count_of_an_input_that_kills_them(
    nats_server: embedded.EmbeddedServer, out: Path, tmp_path: Path,
) -> None:
    """The deaths are counted per node: whichever replica the input comes back to,
    crash_limit deaths in all (not per replica) have it dead-lettered."""
    log = tmp_path / "deaths.log"
    flow = crash_loop(str(out), at=7, how="kill", log=str(log), count=60, replicas=2)
    report = flow.run(nats_server.url, view=False, ack_wait=2, max_restarts=3,
                      crash_limit=2, stop_after=60)
    assert report.outcome == "completed", report.format()
    pids = dead_pids(log)
    crash = report.nodes["crash_on"]
    assert len(pids) == 2 and crash.restarts == 2 and crash.dead_lettered == 1
    assert sorted(d.pid for d in crash.deaths) == sorted(pids)
    assert all(d.in_hand == ["numbers:8"] for d in crash.deaths)
    assert sorted(v for (v,) in applied(out)) == [v for v in range(60) if v != 7]
    letters = [e.record for e in dlq_list(nats_server.url, flow.flow_id,
                                          run_id=report.run_id)]
    assert [(r.stream_seq, r.reason) for r in letters if r] == [(8, "crashed_worker")]


def test_a_replica_given_up_on_fails_the_run_with_its_reason(
    nats_server: embedded.EmbeddedServer, out: Path, tmp_path: Path,
) -> None:
    """Without a crash limit the input kills every process until max_restarts are
    spent: the run fails, and the report says which replica was lost, after how many
    restarts, and how each of its processes ended."""
    log = tmp_path / "deaths.log"
    flow = crash_loop(str(out), at=7, how="kill", log=str(log))
    report = flow.run(nats_server.url, view=False, ack_wait=2, max_restarts=1,
                      crash_limit=None)
    assert report.outcome == "failed"
    first, last = dead_pids(log)
    crash = report.nodes["crash_on"]
    assert crash.outcomes["crash_on[0]"] == "lost" and crash.restarts == 1
    assert [(d.pid, d.restarted) for d in crash.deaths] == [(first, True), (last, False)]
    assert crash.errors["crash_on[0]"].startswith(
        f"lost after 1 restart; the last process {last} killed by SIGKILL")
    assert crash.dead_lettered == 0
    text = report.format()
    assert f"crash_on[0] died: process {first} killed by SIGKILL" in text
    assert (f"crash_on[0] lost: lost after 1 restart; the last process {last} "
            "killed by SIGKILL") in text
    assert "not started again" in text


def test_a_replica_that_fails_before_its_task_starts_fails_the_run_instead_of_hanging_it(
    nats_server: embedded.EmbeddedServer, out: Path, tmp_path: Path,
) -> None:
    """A replica that fails before its task runs publishes no end of stream: its
    readers would wait for one forever. The run is stopped and fails with its reason."""
    flow = one_fails_to_start(str(out), str(tmp_path / "claim"))
    began = time.monotonic()
    report = flow.run(nats_server.url, view=False, ack_wait=2)
    assert time.monotonic() - began < 60, report.format()
    assert report.outcome == "failed", report.format()
    errors = report.nodes["fails_to_start_once"].errors
    assert [e for e in errors.values() if "this replica cannot start" in e], report.format()


def test_crash_limit_must_not_exceed_max_restarts(out: Path) -> None:
    flow = crash_loop(str(out), at=7, how="kill", log=str(out / "log"))
    with pytest.raises(ValueError, match=r"crash_limit must be None or from 1 to "
                                         r"max_restarts \(1\), got 2"):
        flow.run("nats://127.0.0.1:1", view=False, max_restarts=1)
    with pytest.raises(ValueError, match="got 0"):
        flow.run("nats://127.0.0.1:1", view=False, crash_limit=0)


def server_pids(engine: int) -> list[int]:
    """The engine's embedded nats-server (its child running the nats-server binary)."""
    found = []
    for pid in children_of(engine):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"nats-server" in cmdline.split(b"\0")[0]:
            found.append(pid)
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_sigkilled_engine_leaves_no_embedded_broker_holding_its_store(
    out: Path, tmp_path: Path,
) -> None:
    store = tmp_path / "store"
    env = environment(out, count=100000, pace=0.005)
    run = subprocess.Popen(command("run", "flows:chain", "--store-dir", str(store), "--json"),
                           cwd=HELPERS, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, start_new_session=True)
    servers: list[int] = []
    try:
        wait_for(lambda: count_applied(out) >= 20, 60, "the flow to get going")
        servers += server_pids(run.pid)
        assert len(servers) == 1
        run.send_signal(signal.SIGKILL)
        assert run.wait(timeout=10) == -signal.SIGKILL
        wait_for(lambda: not alive(servers[0]), 10, "the killed engine's broker to end")
        # Its store is free again: the next run on it starts (and stops at once).
        again = subprocess.run(command("run", "flows:chain", "--store-dir", str(store),
                                       "--stop-after", "0", "--json"),
                               cwd=HELPERS, env=environment(out, count=10), capture_output=True,
                               text=True, timeout=120)
        assert "is in use by" not in again.stderr and again.returncode in (0, 1), again.stderr
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
        for pid in servers:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        with embedded_broker(store) as url:
            tear_down_every_run(url)
