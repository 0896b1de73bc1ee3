"""The engine's replicas, forked from its replica server (videoflow.run.replica_starts),
run a flow as spawned ones do: with everything they import already there, and the
engine's environment as it is at each run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from flow_nodes import Numbers, RecordProcess, Scale

from videoflow.broker import server as embedded
from videoflow.flow import Flow
from videoflow.run.replica_starts import REPLICA_IMPORTS, START_METHOD_ENV

pytestmark = pytest.mark.timeout(120)


def run_once(url: str, out: Path) -> None:
    numbers = Numbers(5)
    flow = Flow([numbers], [RecordProcess(str(out))(Scale(2)(numbers))], name="starts")
    assert flow.run(url, view=False).outcome == "completed"


def test_the_server_imports_what_a_replica_of_a_flow_imports(
        nats_server: embedded.EmbeddedServer, out: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A spawned sink imports everything itself and lists it: of videoflow and its
    dependencies, the server's imports hold it all."""
    monkeypatch.setenv(START_METHOD_ENV, "spawn")
    run_once(nats_server.url, out)
    imported = set((out / "modules.txt").read_text().split())
    done = subprocess.run(
        [sys.executable, "-c",
         f"import sys\nfor name in {REPLICA_IMPORTS!r}: __import__(name)\n"
         "print('\\n'.join(sys.modules))"],
        capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    ours = {m for m in imported
            if m.split(".")[0] in ("videoflow", "numpy", "nats", "msgspec", "rich")}
    assert {"numpy", "nats", "videoflow.messaging.nats_messenger"} <= ours
    assert ours - set(done.stdout.split()) == set()


def test_a_run_after_the_environment_changed_gives_its_replicas_the_new_one(
        nats_server: embedded.EmbeddedServer, out: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Two runs in one process: the second's replicas are forked from the server the
    first started, yet read the variable the program set between the runs."""
    monkeypatch.delenv(START_METHOD_ENV, raising=False)
    monkeypatch.delenv("VF_PROBE", raising=False)
    run_once(nats_server.url, out)
    assert (out / "probe.txt").read_text() == "unset"
    monkeypatch.setenv("VF_PROBE", "between the runs")
    run_once(nats_server.url, out)
    assert (out / "probe.txt").read_text() == "between the runs"
