"""The real `videoflow` command on the broker's kept store: dead letters of one run
after another, `run` then `dlq list` then `dlq replay` on the default embedded broker,
one store per engine, and `provision` that validates its output path first."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from broker_reads import stream_names
from test_cli import HELPERS, base_environment, command, count_applied, videoflow, wait_for

from videoflow import ops
from videoflow.broker import server as embedded
from videoflow.broker.server import SERVER_RECORD, read_server_record

pytestmark = pytest.mark.timeout(240)

POISON_FLOW = "clipoison"
MULTIPLES = [7, 14, 21, 28]  # what flows:poison dead-letters of 0 .. 29


def poison_env(out: Path, store: Path | None = None, **values: Any) -> dict[str, str]:
    """The environment of a flows:poison command: no broker URL (the embedded broker)
    unless one is given, the store in the test's tmp dir."""
    env = base_environment()
    env.pop("VIDEOFLOW_NATS_URL", None)
    if store is not None:
        env["VIDEOFLOW_STORE_DIR"] = str(store)
    env.update({"VF_TEST_OUT": str(out), **{f"VF_TEST_{k.upper()}": str(v)
                                             for k, v in values.items()}})
    return env


def run_json(*args: str, env: dict[str, str]) -> dict[str, Any]:
    done = videoflow("run", "flows:poison", "--json", *args, env=env)
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def listed(*args: str, env: dict[str, str]) -> list[dict[str, Any]]:
    done = videoflow("dlq", "list", "--flow", POISON_FLOW, "--json", *args, env=env)
    assert done.returncode == 0, done.stderr
    records: list[dict[str, Any]] = json.loads(done.stdout)
    return records


def poisoned_values(records: list[dict[str, Any]]) -> list[int]:
    """The inputs the records are of, from their error messages ('7 is a multiple of 7')."""
    assert {r["reason"] for r in records} <= {"poison"}
    return sorted(int(r["error_message"].split()[0]) for r in records)


@pytest.fixture
def out_dirs(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    first, second = tmp_path / "out-1", tmp_path / "out-2"
    first.mkdir()
    second.mkdir()
    yield first, second


# ------------------------------------------------------------- dead letters per run


def test_two_runs_of_a_poisoning_flow_within_a_minute_both_keep_their_dead_letters(
    nats_server: embedded.EmbeddedServer, out_dirs: tuple[Path, Path],
) -> None:
    # Both runs' parent streams number from 1, so each run's dead letters have the
    # same (node, parent, seq) as the other's, well within the 2-minute duplicate
    # window of the flow's dead-letter stream.
    runs = []
    for out in out_dirs:
        report = run_json("--nats-url", nats_server.url, env=poison_env(out, count=30))
        assert report["nodes"]["reject_multiples_of"]["dead_lettered"] == 4
        runs.append(report["run_id"])
    assert runs[0] != runs[1]
    for run in runs:
        entries = ops.dlq_list(nats_server.url, POISON_FLOW, run_id=run, timeout=10)
        assert [e.record.run_id for e in entries if e.record] == [run] * 4
        assert sorted(int(e.record.error_message.split()[0]) for e in entries
                      if e.record) == MULTIPLES
    env = poison_env(out_dirs[0])
    records = listed("--nats-url", nats_server.url, env=env)
    assert sorted(r["run"] for r in records) == sorted(runs * 4)
    for run in runs:
        assert poisoned_values([r for r in records if r["run"] == run]) == MULTIPLES
    text = videoflow("dlq", "list", "--flow", POISON_FLOW, "--nats-url", nats_server.url,
                     env=env)
    assert text.returncode == 0, text.stderr
    assert all(text.stdout.count(run) == 4 for run in runs), text.stdout


# -------------------------------------------------- the default embedded broker


def default_store_env(tmp_path: Path, out: Path, **values: Any) -> tuple[dict[str, str], Path]:
    """An environment whose per-user data directory is in tmp_path and that names no
    store and no broker: the commands take the default of a fresh user."""
    env = poison_env(out, **values)
    env.pop("VIDEOFLOW_STORE_DIR", None)
    env.update(HOME=str(tmp_path / "home"), XDG_DATA_HOME=str(tmp_path / "user-data"),
               LOCALAPPDATA=str(tmp_path / "user-data"))
    return env, embedded.default_store_dir(environ=env, home=tmp_path / "home")


def test_run_then_dlq_list_then_dlq_replay_on_the_default_embedded_broker(
    tmp_path: Path, out_dirs: tuple[Path, Path],
) -> None:
    env, store = default_store_env(tmp_path, out_dirs[0], count=30)
    assert store.is_relative_to(tmp_path)
    report = run_json(env=env)  # no --nats-url, no VIDEOFLOW_NATS_URL, no store named
    run = report["run_id"]
    assert report["nodes"]["reject_multiples_of"]["dead_lettered"] == 4
    assert report["torn_down"] is True
    # The run's broker kept its store, and let it go.
    assert (store / "jetstream").is_dir() and not (store / SERVER_RECORD).exists()

    # dlq list, with no URL either: the dead letters of that run, with their reasons.
    records = listed(env=env)
    assert [r["run"] for r in records] == [run] * 4
    assert poisoned_values(records) == MULTIPLES
    assert all(r["node"] == "reject_multiples_of" and r["parent"] == "numbers"
               for r in records)
    status = videoflow("status", "--flow", POISON_FLOW, "--run", run, env=env)
    assert status.returncode == 0, status.stderr
    # Its record says how it ended, and where its streams went.
    assert "; completed " in status.stdout
    assert "its streams were deleted at its end (its dead letters stay)" in status.stdout
    assert status.stdout.rstrip().endswith(": 4"), status.stdout

    # dlq replay into the ended run: its streams were torn down, nothing reads them.
    # Each record says so, and what to do instead; exit 1, the records kept.
    replay = videoflow("dlq", "replay", "--flow", POISON_FLOW, "--run", run, "--json",
                       env=env)
    assert replay.returncode == 1, replay.stderr
    outcome = json.loads(replay.stdout)
    assert (outcome["replayed"], outcome["failed"]) == (0, 4)
    for result in outcome["results"]:
        assert ops.TORN_DOWN in result["reason"] and "--into-run RUN" in result["reason"]
    assert len(listed("--run", run, env=env)) == 4

    # Replayed into a run of the flow that is running, the dead letters are processed
    # again by its workers (and, still poison, dead-lettered again under that run).
    live_env, _ = default_store_env(tmp_path, out_dirs[1], count=200, pace=0.05)
    live = subprocess.Popen(command("run", "flows:poison", "--json", "--run", "live"),
                            cwd=HELPERS, env=live_env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: count_applied(out_dirs[1]) >= 5, 60, "the live run to get going")
        holder = read_server_record(store)
        assert holder is not None and holder.purpose == "run"

        # A second engine on the same store is refused at once, in one line.
        second = videoflow("run", "flows:poison", env=env)
        assert second.returncode == 1
        (line,) = second.stderr.strip().splitlines()
        assert line.startswith(f"videoflow: error: the broker store {store} is in use")
        assert holder.url in line and "--store-dir" in line and "--ephemeral" in line

        # The operator command uses the running run's broker.
        replay = videoflow("dlq", "replay", "--flow", POISON_FLOW, "--run", run,
                           "--into-run", "live", "--json", env=env)
        assert replay.returncode == 0, replay.stderr
        outcome = json.loads(replay.stdout)
        assert (outcome["replayed"], outcome["failed"]) == (4, 0)
        assert {r["subject"] for r in outcome["results"]} == {"vf.clipoison.live.numbers"}
        stdout, stderr = live.communicate(timeout=120)
    finally:
        if live.poll() is None:
            live.kill()
            live.wait()
    assert live.returncode == 0, stderr
    live_report = json.loads(stdout)
    assert live_report["nodes"]["reject_multiples_of"]["dead_lettered"] == 28 + 4
    again = listed("--run", "live", env=env)
    own = [i for i in range(1, 200) if i % 7 == 0]
    assert poisoned_values(again) == sorted(own + MULTIPLES)
    assert read_server_record(store) is None  # the live run let its store go


def test_an_ephemeral_run_keeps_nothing_and_the_commands_say_there_is_no_store(
    tmp_path: Path, out_dirs: tuple[Path, Path],
) -> None:
    store = tmp_path / "store"
    env = poison_env(out_dirs[0], store, count=30)
    report = run_json("--ephemeral", env=env)
    assert report["nodes"]["reject_multiples_of"]["dead_lettered"] == 4
    assert not store.exists()
    done = videoflow("dlq", "list", "--flow", POISON_FLOW, env=env)
    assert done.returncode == 1
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"videoflow: error: no broker store at {store}")
    assert not store.exists()


def test_store_dir_on_the_command_line_wins_over_the_environment(
    tmp_path: Path, out_dirs: tuple[Path, Path],
) -> None:
    given, from_env = tmp_path / "given", tmp_path / "from-env"
    env = poison_env(out_dirs[0], from_env, count=30)
    run = run_json("--store-dir", str(given), env=env)["run_id"]
    assert (given / "jetstream").is_dir() and not from_env.exists()
    records = listed("--store-dir", str(given), env=env)
    assert [r["run"] for r in records] == [run] * 4
    both = videoflow("run", "flows:poison", "--store-dir", str(given), "--ephemeral",
                     env=env)
    assert both.returncode == 2 and "not allowed with argument" in both.stderr


def test_the_real_per_user_store_is_never_the_one_the_suite_uses() -> None:
    assert os.environ.get("VIDEOFLOW_STORE_DIR")
    assert Path(os.environ["VIDEOFLOW_STORE_DIR"]) != embedded.default_store_dir()


# ------------------------------------------------------------------------ provision


def run_streams(url: str, run: str | None = None) -> list[str]:
    names = asyncio.run(stream_names(url))
    return [n for n in names if n.startswith("vf-cli-") and (run is None or run in n)]


@pytest.mark.parametrize("where, message", [
    ("missing/run.json", "the directory {dir!r} does not exist"),
    ("a-file/run.json", "{dir!r} is not a directory"),
    ("a-dir", "is a directory, not a file"),
])
def test_provision_refuses_an_unwritable_out_before_creating_anything(
    nats_server: embedded.EmbeddedServer, tmp_path: Path, where: str, message: str,
) -> None:
    (tmp_path / "a-file").write_text("not a directory")
    (tmp_path / "a-dir").mkdir()
    out = tmp_path / where
    done = videoflow("provision", "flows:chain", "--out", str(out), "--nats-url",
                     nats_server.url, env=poison_env(tmp_path))
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"videoflow: error: --out {str(out)!r}")
    assert message.format(dir=str(out.parent)) in line
    assert run_streams(nats_server.url) == []  # nothing on the broker


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_provision_whose_spec_cannot_be_written_names_the_run_and_its_teardown(
    nats_server: embedded.EmbeddedServer, tmp_path: Path,
) -> None:
    # /dev/full passes every check (a writable file in a writable directory) and then
    # fails the write (ENOSPC): the failure comes after the streams exist.
    env = poison_env(tmp_path)
    done = videoflow("provision", "flows:chain", "--out", "/dev/full", "--run", "r-full",
                     "--nats-url", nats_server.url, env=env)
    assert done.returncode == 1
    assert done.stdout.strip() == "provisioning run r-full of flow 'cli'"
    (line,) = done.stderr.strip().splitlines()
    teardown = f"videoflow teardown --flow cli --run r-full --nats-url {nats_server.url}"
    assert line.startswith("videoflow: error: provisioned run r-full of flow 'cli', but "
                           "could not write its spec to '/dev/full'")
    assert teardown in line and "Traceback" not in done.stderr
    assert run_streams(nats_server.url, "r-full")
    # What the line says works: provisioning again under the same run writes the spec,
    # and the teardown it names removes the run.
    spec = tmp_path / "run.json"
    again = videoflow("provision", "flows:chain", "--out", str(spec), "--run", "r-full",
                      "--nats-url", nats_server.url, env=env)
    assert again.returncode == 0, again.stderr
    assert json.loads(spec.read_text())["run_id"] == "r-full"
    removed = videoflow(*teardown.split()[1:], env=env)
    assert removed.returncode == 0, removed.stderr
    assert run_streams(nats_server.url, "r-full") == []
