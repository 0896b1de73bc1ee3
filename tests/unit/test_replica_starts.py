"""How the local engine starts replica processes (videoflow.run.replica_starts): forked
from a server that imported videoflow once, yet with the engine's environment, stdout
and stderr as they are at each start, and ending with the engine."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from videoflow.core.node import ConsumerNode, ProducerNode
from videoflow.errors import StartMethodError
from videoflow.flow import Flow
from videoflow.run.replica_starts import (
    START_METHOD_ENV,
    ReplicaInheritance,
    replica_context,
    start_method,
)
from videoflow.run.supervision import WATCH_SECONDS

posix_only = pytest.mark.skipif(sys.platform == "win32", reason="forkserver is POSIX's")


@posix_only
def test_replicas_are_forked_from_a_server_unless_spawn_is_asked_for(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(START_METHOD_ENV, raising=False)
    assert start_method() == "forkserver"
    monkeypatch.setenv(START_METHOD_ENV, "spawn")
    assert start_method() == "spawn"
    assert replica_context().get_start_method() == "spawn"


def test_a_start_method_this_platform_lacks_is_refused_naming_those_it_has(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(START_METHOD_ENV, "fork")  # there is one, but never for replicas
    with pytest.raises(StartMethodError, match=r"VIDEOFLOW_START_METHOD='fork': this "
                                               r"platform starts replicas by .*spawn"):
        start_method()


class Drop(ConsumerNode):
    def consume(self, value: int) -> None:
        pass


class Five(ProducerNode):
    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.sent = 0

    def next(self) -> int:
        if self.sent == 5:
            raise StopIteration
        self.sent += 1
        return self.sent


def test_a_run_refuses_a_wrong_start_method_before_it_looks_for_a_broker(
        monkeypatch: pytest.MonkeyPatch) -> None:
    five = Five()
    flow = Flow([five], [Drop()(five)], name="starts")
    monkeypatch.setenv(START_METHOD_ENV, "thread")
    with pytest.raises(StartMethodError, match="thread"):
        flow.run("nats://127.0.0.1:1", view=False)  # nothing listens there


ENGINE = textwrap.dedent("""
    import os, sys
    from videoflow.run.replica_starts import ReplicaInheritance, replica_context

    def show(inherited):
        if inherited is not None:
            inherited.adopt()
        import videoflow.run.processes  # noqa: F401 (the server imported it)
        print(os.environ.get("VF_PROBE", "unset"), flush=True)

    def start(context, inherit):
        inherited = ReplicaInheritance.of_this_process() if inherit else None
        process = context.Process(target=show, args=(inherited,))
        process.start()
        if inherited is not None:
            inherited.close()
        process.join()
        assert process.exitcode == 0, process.exitcode

    if __name__ == "__main__":
        context = replica_context()
        start(context, True)  # starts the server, with VF_PROBE unset
        os.environ["VF_PROBE"] = "set after"
        out = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        sys.stdout.flush()
        os.dup2(out, 1)  # as a test's capture, or a program's redirection, does
        start(context, True)
        start(context, False)
""")


@posix_only
def test_a_forked_replica_takes_the_engines_environment_and_stdout_of_its_start(
        tmp_path: Path) -> None:
    """The server started with the first replica; the engine set a variable and sent
    its stdout to a file since. A replica handed the engine's inheritance prints the
    variable into the file; one forked without it still sees and writes the server's."""
    script = tmp_path / "engine.py"
    script.write_text(ENGINE)
    env = {k: v for k, v in os.environ.items() if k not in ("VF_PROBE", START_METHOD_ENV)}
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "out.txt")],
                          capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out.txt").read_text().splitlines() == ["set after"]
    assert done.stdout.split() == ["unset", "unset"]


def test_a_replica_whose_engine_switched_the_core_since_the_server_imported_it_fails(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # What the replica checks once it adopted the engine's environment: this process's
    # (monkeypatch restores it; adopting in a test process would leak the switch into
    # every later run of this worker).
    from videoflow import native

    inherited = ReplicaInheritance.of_this_process(stdio=False)
    inherited.check_imports()  # agrees: nothing changed
    monkeypatch.setenv(native.PURE_PYTHON_ENV, "0" if native.PURE_PYTHON else "1")
    with pytest.raises(StartMethodError, match=f"{native.PURE_PYTHON_ENV} changed .* "
                                               f"{START_METHOD_ENV}=spawn"):
        inherited.check_imports()


WATCHED = textwrap.dedent("""
    import os, sys, time
    from videoflow.run.replica_starts import replica_context
    from videoflow.run.supervision import die_with_parent

    def replica():
        die_with_parent(pdeathsig=False)  # the sentinel's watch alone
        print(os.getpid(), flush=True)
        time.sleep(120)

    if __name__ == "__main__":
        os.environ["VIDEOFLOW_START_METHOD"] = sys.argv[1]
        process = replica_context().Process(target=replica)
        process.start()
        time.sleep(120)
""")


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":
            return True
        time.sleep(0.02)
    return False


@pytest.mark.timeout(60)
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads process states from /proc")
@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_a_replica_notices_its_engine_killed_at_once_through_the_parent_sentinel(
        tmp_path: Path, method: str) -> None:
    """Whichever process forked it (the server, or the engine itself), a replica that
    watches its engine without the kernel's help ends as soon as the engine is
    SIGKILLed: well within one period of the pid watch it replaces."""
    script = tmp_path / "engine.py"
    script.write_text(WATCHED)
    engine = subprocess.Popen([sys.executable, str(script), method], stdout=subprocess.PIPE,
                              text=True)
    assert engine.stdout is not None
    pid = int(engine.stdout.readline())
    try:
        engine.kill()
        engine.wait()
        assert _gone_within(pid, WATCH_SECONDS * 0.8)
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_die_with_parent_needs_a_pid_outside_multiprocessing() -> None:
    from videoflow.run.supervision import die_with_parent

    with pytest.raises(ValueError, match="not started by multiprocessing"):
        die_with_parent(pdeathsig=False)
