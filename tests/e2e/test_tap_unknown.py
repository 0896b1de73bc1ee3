"""`videoflow tap` and `hz` given a broker say at once when what they were asked to
watch is not there (a node the flow does not have, a run that is not there, a node
that only reads), naming what is; and a connect that fails is the one line the other
commands print, never a repr."""

from __future__ import annotations

import asyncio
from pathlib import Path

import nats
import pytest
from test_cli import environment, videoflow

from videoflow.broker import server as embedded
from videoflow.core.naming import eos_subject_for
from videoflow.ops.runs import list_flows

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def provisioned(nats_server: embedded.EmbeddedServer, tmp_path: Path) -> str:
    """The broker's URL, with a run of flows:chain (numbers -> scale -> record)."""
    made = videoflow("provision", "flows:chain", "--out", str(tmp_path / "run.json"),
                     "--nats-url", nats_server.url, env=environment(tmp_path))
    assert made.returncode == 0, made.stderr
    return nats_server.url


def said(done: object) -> list[str]:
    return str(getattr(done, "stderr", "")).strip().splitlines()


@pytest.mark.parametrize("watcher", ["tap", "hz"])
def test_an_unknown_node_is_named_with_the_nodes_there_and_the_tap_listens_on(
        provisioned: str, watcher: str) -> None:
    done = videoflow(watcher, "cli", "nosuch", "--nats-url", provisioned, "--seconds", "1")
    assert done.returncode == 0, done.stderr
    assert said(done)[:2] == [
        "listening on vf.cli.*.nosuch",
        "flow 'cli' has no node 'nosuch' on this broker (nodes with output: numbers, "
        "scale); listening anyway"]


def test_a_run_that_is_not_there_is_named_with_the_runs_there(provisioned: str) -> None:
    done = videoflow("tap", "cli", "scale", "--run", "nope", "--nats-url", provisioned,
                     "--seconds", "1")
    assert done.returncode == 0, done.stderr
    assert said(done)[1].startswith("flow 'cli' has no run 'nope' on this broker (runs: r")
    assert said(done)[1].endswith("); listening anyway, for a run that starts later")


def test_a_node_that_only_reads_ends_the_tap_in_one_line(provisioned: str) -> None:
    done = videoflow("tap", "cli", "record", "--nats-url", provisioned, "--seconds", "30")
    assert done.returncode == 2, done.stderr
    assert said(done)[-1] == ("videoflow: error: node 'record' of flow 'cli' publishes "
                              "nothing: it only reads (nodes with output: numbers, scale)")


def test_a_node_that_publishes_is_watched_without_a_word(provisioned: str) -> None:
    done = videoflow("tap", "cli", "scale", "--nats-url", provisioned, "--seconds", "1")
    assert done.returncode == 0, done.stderr
    assert said(done)[0] == "listening on vf.cli.*.scale"
    assert said(done)[1].startswith("tap: 0 messages in ")


@pytest.mark.parametrize("watcher", ["tap", "hz"])
def test_a_node_that_ended_its_stream_is_said_to_have_ended(
        provisioned: str, watcher: str) -> None:
    # A tap sees what is published from now on: on a node that had published all it
    # would, it waited in silence (and hz printed 0.00/s), saying nothing.
    (run,) = [r.run_id for f in list_flows(provisioned, flow_id="cli", timeout=10)
              for r in f.runs]

    async def end_stream() -> None:
        nc = await nats.connect(provisioned)
        try:
            await nc.jetstream().publish(eos_subject_for("cli", run, "scale"), b"end")
        finally:
            await nc.close()

    asyncio.run(end_stream())
    done = videoflow(watcher, "cli", "scale", "--nats-url", provisioned, "--seconds", "1")
    assert done.returncode == 0, done.stderr
    assert said(done)[1] == (
        f"node 'scale' of flow 'cli' has ended its stream (run {run}): it publishes "
        "nothing more, and a tap shows only what is published from now on; listening "
        "anyway, for a run that starts later")
    numbers = videoflow(watcher, "cli", "numbers", "--nats-url", provisioned, "--seconds", "1")
    assert "ended" not in numbers.stderr  # its stream has not ended


def test_a_refused_port_is_the_one_line_ls_prints(tmp_path: Path) -> None:
    tapped = videoflow("tap", "cli", "scale", "--nats-url", "nats://127.0.0.1:1",
                       "--seconds", "5")
    listed = videoflow("ls", "--nats-url", "nats://127.0.0.1:1")
    assert tapped.returncode == listed.returncode == 1, tapped.stderr
    assert len(said(tapped)) == 1 and "no answer within" not in tapped.stderr
    assert said(tapped)[0].startswith("videoflow: error: cannot connect to "
                                      "nats://127.0.0.1:1 (unreachable)")
    assert said(tapped)[0] == said(listed)[0]


def test_refused_credentials_are_the_one_line_ls_prints(tmp_path: Path) -> None:
    server = embedded.EmbeddedServer(tmp_path / "store",
                                     extra_args=("--user", "vf", "--pass", "right-pw"))
    with server.start():
        url = f"nats://vf:wrong-pw@127.0.0.1:{server.port}"
        tapped = videoflow("tap", "cli", "scale", "--nats-url", url, "--seconds", "5")
        listed = videoflow("ls", "--nats-url", url)
    assert tapped.returncode == 1, tapped.stderr
    assert said(tapped) == said(listed)
    assert said(tapped)[0].startswith("videoflow: error: the broker at nats://vf:***@")
    assert "refused the credentials" in tapped.stderr and "wrong-pw" not in tapped.stderr
