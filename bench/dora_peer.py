"""The dora-rs peer of the whole-flow benchmarks (bench/test_bench_flow.py): the linear
flow, source -> pass-through -> sink, as a dora dataflow of three Python nodes written
on dora's node API (``from dora import Node``), run by ``dora run``.

``dora run`` is dora's local mode: one process that is coordinator and daemon for this
one dataflow only, listening on 127.0.0.1, spawning the nodes and ending when they
have (no ``dora up`` daemon outlives a round). It and its nodes run in a session of
their own, and whatever of it is left when a round ends, by success, failure or
timeout, is stopped: Ctrl-C first (SIGINT: dora stops the dataflow), then SIGTERM,
then SIGKILL.

The nodes carry what the other sides carry: {"i", "t", "pad"} as msgpack, about 100
bytes, the pass-through applying the same transform(). dora passes messages between
processes on one machine through shared memory, with no broker, no acks and nothing
stored: by default an input's queue (``queue_size``, 10) drops its oldest message
when full. Every input's queue here is as deep as the round is long, and
``queue_policy: backpressure`` (a full queue holds its sender back, as a BATCH edge
does): with the depth alone, dora-rs 1.1.0 still lost messages silently (1,551 of
20,000 at the pass-through, flat out, no log line), with both none. The sink checks
it got every message once. dora has no REALTIME notion (keep the newest, supersede
the rest), so this peer runs BATCH cases only.

Every node measures itself as the peer stages do (Window, Tally; CPU from
time.process_time()) and writes its figures to ``<out>/<stage>.json`` (write_stats),
under the peer's stage names: producer, processor, sink. The dora process's own CPU
is not in them, as the broker's is not on the other sides.

This file is also the nodes' program: ``python dora_peer.py ROLE CONFIG`` runs one
node (the dataflow's descriptor says so). It imports dora only there, so the
benchmarks import it whether or not dora is installed (``unavailable`` says why not).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from flow_bench_nodes import (
    DECODE,
    ENCODE,
    READY_SECONDS,
    Tally,
    Window,
    cpu_since,
    mark_ready,
    message,
    transform,
    write_stats,
)

INSTALL = "pip install '.[bench]'"
"""What installs the dora side: the project's bench extra (dora-rs, dora-rs-cli)."""

OUTPUT = "data"
"""The one output of the source and of the pass-through."""

READERS = ["processor", "sink"]
"""The nodes the source waits for (warm_up), as on the other sides."""

WARM = {"warm": True}
"""The message that warms a reader up (warm_up): passed on, never counted."""

WARM_EVERY_SECONDS = 0.05
"""How often the source sends WARM until every reader has had one."""

STOP_GRACE_SECONDS = 10.0
"""How long each step of a teardown (SIGINT, SIGTERM) waits before the next one."""

MIN_QUEUE = 10
"""dora's default input queue: never made shallower than that."""


# ------------------------------------------------------------------ availability


def dora_cli() -> str | None:
    """The ``dora`` command: beside this interpreter first (a venv's console script,
    installed with it, whether or not the venv is on PATH), else on PATH."""
    beside = Path(sys.executable).with_name("dora")
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("dora")


@functools.lru_cache(maxsize=1)
def unavailable() -> str | None:
    """Why the dora side cannot run here, as a skip reason; None when it can.

    Checked in order: the Python version (dora-rs needs 3.11), dora's node API
    (dora-rs), the dora command (dora-rs-cli), and that the command runs at all.
    """
    if sys.version_info < (3, 11):
        return (f"dora-rs needs Python 3.11 or newer, this is {sys.version.split()[0]}: "
                "the bench extra installs nothing here")
    try:
        dora = importlib.import_module("dora")
    except ImportError as error:
        return f"dora-rs is not installed ({error}); install the bench extra: {INSTALL}"
    if not hasattr(dora, "Node"):  # "dora" on the package index is also another project
        return (f"the module dora at {getattr(dora, '__file__', '?')} is not dora-rs's "
                f"(no dora.Node); install the bench extra: {INSTALL}")
    cli = dora_cli()
    if cli is None:
        return (f"the dora command (dora-rs-cli) is neither beside {sys.executable} nor "
                f"on PATH; install the bench extra: {INSTALL}")
    try:
        done = subprocess.run([cli, "--version"], capture_output=True, text=True,
                              timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"{cli} --version did not run: {error}"
    if done.returncode != 0:
        return (f"{cli} --version failed (exit {done.returncode}): "
                f"{' '.join((done.stderr or done.stdout).split())[-500:]}")
    return None


def version() -> str:
    """What ``dora --version`` says, e.g. "dora-cli 1.1.0" (for extra_info)."""
    cli = dora_cli()
    assert cli is not None and unavailable() is None, unavailable()
    return subprocess.run([cli, "--version"], capture_output=True, text=True, timeout=60,
                          check=True).stdout.strip()


# ------------------------------------------------------------------ a round


def descriptor(config: Path, queue: int) -> dict[str, Any]:
    """The dataflow: source -> processor -> sink, every node this file run by this
    interpreter, every input's queue `queue` deep and holding its sender back when
    full (backpressure: never dropping, see the module's docstring).

    Raises:
        ValueError: a path with white space (dora splits ``args`` on it).
    """
    script = Path(__file__).resolve()
    if any(" " in str(path) or "\t" in str(path) for path in (script, config)):
        raise ValueError(f"dora splits a node's args on white space: {script}, {config}")

    def node(role: str, inputs: dict[str, str], outputs: list[str]) -> dict[str, Any]:
        return {"id": role, "path": sys.executable, "args": f"{script} {role} {config}",
                "inputs": {name: {"source": source, "queue_size": queue,
                                  "queue_policy": "backpressure"}
                           for name, source in inputs.items()},
                "outputs": outputs}

    return {"nodes": [node("producer", {}, [OUTPUT]),
                      node("processor", {"in": f"producer/{OUTPUT}"}, [OUTPUT]),
                      node("sink", {"in": f"processor/{OUTPUT}"}, [])]}


def run_linear(out: Path, n: int, rate: float = 0.0, latency: bool = False,
               bound: float = 240.0, small: bool = False) -> None:
    """Run source -> pass-through -> sink as a dora dataflow to its end; the nodes'
    figures are then in ``<out>/<stage>.json``.

    Arguments:
        out: the round's directory (the descriptor, dora's logs and the figures).
        n: messages.
        rate: the source's pace in messages per second (0: as fast as it can).
        latency: the sink keeps every message's receive time minus its send time.
        bound: seconds the whole run may take.
        small: the source sends message(i, small=True), SMALL_BYTES each.

    Raises:
        AssertionError: dora did not end by itself within bound, or ended with an
            error (its log's tail in the message).
    """
    reason = unavailable()
    assert reason is None, reason
    cli = dora_cli()
    assert cli is not None
    config = out / "dora-config.json"
    config.write_text(json.dumps({"out": str(out), "n": n, "rate": rate, "latency": latency,
                                  "small": small}))
    flow = out / "dataflow.yml"
    # JSON is YAML: no quoting of paths to get wrong.
    flow.write_text(json.dumps(descriptor(config, max(MIN_QUEUE, n)), indent=2))
    log = out / "dora-run.log"
    with log.open("wb") as sink, session([cli, "run", str(flow)], out, sink) as process:
        try:
            code = process.wait(bound)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"dora run did not end within {bound:.0f} s:\n"
                                 f"{tail(log)}") from None
    assert code == 0, f"dora run exited {code}:\n{tail(log)}"


@contextlib.contextmanager
def session(command: list[str], cwd: Path, output: Any) -> Iterator[subprocess.Popen[bytes]]:
    """command in a session of its own (its process group: dora and the nodes it
    spawns), output to output; on leaving the block, whatever of the group is still
    running is stopped (stop_group)."""
    # The nodes import flow_bench_nodes and videoflow as this process does.
    path = os.pathsep.join(dict.fromkeys(
        [str(Path(__file__).resolve().parent), *(p for p in sys.path if p)]))
    # A failed node's Python traceback is what a failure's message needs; a Rust
    # backtrace of dora's (RUST_BACKTRACE=1 in the environment) would push it out of
    # the log's tail.
    env = {**os.environ, "PYTHONPATH": path, "RUST_BACKTRACE": "0"}
    process = subprocess.Popen(command, cwd=cwd, stdout=output, stderr=subprocess.STDOUT,
                               env=env, start_new_session=True)
    try:
        yield process
    finally:
        stop_group(process)


def stop_group(process: subprocess.Popen[bytes]) -> None:
    """Stop what is left of process's group: SIGINT (dora stops its dataflow as on
    Ctrl-C), SIGTERM, SIGKILL, each given STOP_GRACE_SECONDS to end it."""
    group = process.pid
    for sent in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
        process.poll()  # a leader that ended is reaped, never counted as running
        if not group_running(group):
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, sent)
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        while time.monotonic() < deadline:
            process.poll()
            if not group_running(group):
                return
            time.sleep(0.05)


def group_running(group: int) -> bool:
    """Whether a process of the group still runs: read from /proc where there is one
    (a zombie, already ended, does not count), else whether the group takes signals."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return False
        return True
    for stat in proc.glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # ended while read
        if int(fields[2]) == group and fields[0] != "Z":
            return True
    return False


def tail(log: Path, lines: int = 40) -> str:
    """The last lines of dora's log, for a failure's message."""
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError as error:
        return f"(no log: {error})"


# ------------------------------------------------------------------ the nodes


def payload(event: dict[str, Any]) -> bytes:
    """An input's bytes (dora hands them over as an Arrow UInt8Array)."""
    data: bytes = event["value"].to_numpy().tobytes()
    return data


def inputs(node: Any) -> Iterator[dict[str, Any]]:
    """The node's INPUT events until its event stream ends. dora may hand over
    INPUT_CLOSED and STOP before the last inputs queued (1.1.0 does), so the end is
    the stream's, not the first STOP."""
    for event in node:
        if event["type"] == "INPUT":
            yield event


def source(config: dict[str, Any]) -> None:
    """message(i, config's small) for i in 0 .. n-1, paced at rate
    per second from the first one when rate > 0, once the readers are warm (warm_up).
    Records its window: the first message's time to the last send's return."""
    from dora import Node

    node = Node()
    out, n, rate = config["out"], config["n"], config["rate"]
    warm_up(node, out)
    first, cpu_first = time.monotonic(), time.process_time()
    for i in range(n):
        if rate:  # on a schedule from the first, so a late wake-up catches up
            time.sleep(max(0.0, first + i / rate - time.monotonic()))
        node.send_output(OUTPUT, ENCODE(message(i, config.get("small", False))))
    write_stats(out, "producer", count=n, first=first, last=time.monotonic(),
                cpu=cpu_since(cpu_first))


def warm_up(node: Any, out: str) -> None:
    """Send WARM every WARM_EVERY_SECONDS until every reader has had one (each marks
    itself ready on its first): what "ready" means on the other sides, an input
    bound and carrying messages. A reader's first input came 110-190 ms after its
    Node() was made and the source's first send, and in some runs the source's first
    few messages never arrived (dora-rs 1.1.0): measured from Node(), a round would
    time that start-up, and lose messages to it.

    Raises:
        TimeoutError: not every reader warm within READY_SECONDS.
    """
    readers = [Path(out, f"ready-{stage}") for stage in READERS]
    deadline = time.monotonic() + READY_SECONDS
    while not all(ready.exists() for ready in readers):
        if time.monotonic() > deadline:
            raise TimeoutError(f"readers {READERS}: not warm within {READY_SECONDS} s")
        node.send_output(OUTPUT, ENCODE(WARM))
        time.sleep(WARM_EVERY_SECONDS)


def warming(value: Any) -> bool:
    """Whether a message is the source's warm-up (warm_up), not one of the run's."""
    return isinstance(value, dict) and "warm" in value


def processor(config: dict[str, Any]) -> None:
    """transform() per input, sent on; records its window."""
    from dora import Node

    node = Node()
    window = Window()
    warm = False
    for event in inputs(node):
        value = DECODE(payload(event))
        if warming(value):  # passed on, for the sink to warm up too
            if not warm:
                mark_ready(config["out"], "processor")
                warm = True
            node.send_output(OUTPUT, ENCODE(value))
            continue
        window.tick()
        node.send_output(OUTPUT, ENCODE(transform(value)))
    write_stats(config["out"], "processor", **window.fields())


def sink(config: dict[str, Any]) -> None:
    """Counts what arrives (Tally), with each message's receive time minus its send
    time when config says latency."""
    from dora import Node

    node = Node()
    tally = Tally(config["latency"])
    warm = False
    for event in inputs(node):
        received = time.time()
        value = DECODE(payload(event))
        if warming(value):
            if not warm:
                mark_ready(config["out"], "sink")
                warm = True
            continue
        tally.add(value, received)
    write_stats(config["out"], "sink", **tally.fields())


NODES: dict[str, Callable[[dict[str, Any]], None]] = {
    "producer": source, "processor": processor, "sink": sink}


def main(argv: list[str]) -> None:
    """A node's process: ``dora_peer.py ROLE CONFIG`` (a key of NODES, the round's
    JSON config)."""
    role, config = argv
    NODES[role](json.loads(Path(config).read_text()))


if __name__ == "__main__":
    main(sys.argv[1:])
