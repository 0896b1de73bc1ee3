"""The local engine's replica processes: one spawned per replica, watched,
restarted when it dies without a word, stopped and reaped; and the process's own side
(its main, reporting progress on a pipe of its own).

run_flow (videoflow.run.local) builds the Run and its Replicas and hands them to
supervise, then to reap, however the run ended. How Ctrl-C and SIGTERM are counted,
and how a process's death is charged to what it had in hand, is
videoflow.run.supervision's.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from videoflow import logs
from videoflow.broker.link import redact_url
from videoflow.broker.options import auth_options
from videoflow.core.compiler import CompiledFlow
from videoflow.core.constants import REALTIME
from videoflow.core.report import ProcessDeath
from videoflow.core.task import Task
from videoflow.errors import BrokerUnavailable, MissingDependency, StartMethodError
from videoflow.messaging.tracing import TracingSetupError
from videoflow.run.metrics import observed_snapshot
from videoflow.run.progress import LiveView, NodeProgress, OutputRelay, RelayEnd
from videoflow.run.replica_starts import ReplicaInheritance, replica_context
from videoflow.run.supervision import (
    QUIESCE_SIGNAL,
    CrashBook,
    StopSignals,
    create_slot,
    die_with_parent,
    exit_description,
    read_in_hand,
)
from videoflow.run.unread_stdout import UnreadStdout
from videoflow.run.worker import ReplicaJob, run_replica

logger = logging.getLogger(__name__)

LOST_GRACE_SECONDS = 10.0
"""After a replica is lost for good, how long the rest may wind down on their own
before they are quiesced."""

STOP_GRACE_SECONDS = 15.0
"""How long quiesced replicas get to hand their work back before they are killed."""

START_GATE_SECONDS = 120.0
"""The most a REALTIME producer waits for its readers to bind and open before it starts
anyway."""


def publish_control_stop(nats_url: str, flow_id: str, run_id: str,
                         timeout: float = 5.0) -> None:
    """Publish the run's flow-wide stop (core NATS): producers stop and end their
    streams; the rest drain.

    Raises:
        BrokerUnavailable: the broker could not be reached within timeout.
    """
    import nats

    from videoflow.broker.client import connect
    from videoflow.broker.link import servers_of
    from videoflow.core.naming import control_subject_for
    from videoflow.errors import BrokerUnavailable

    async def no_logs(error: Exception) -> None:
        """Each failed attempt is in the error raised, not logged by nats-py."""

    async def send() -> None:
        nc = await connect(servers_of(nats_url), allow_reconnect=False,
                           connect_timeout=timeout, max_reconnect_attempts=1,
                           error_cb=no_logs, **auth_options(nats_url))
        try:
            await nc.publish(control_subject_for(flow_id, run_id), b"stop")
            await nc.flush(timeout=max(1, int(timeout)))
        finally:
            await nc.close()

    try:
        asyncio.run(asyncio.wait_for(send(), timeout))
    except (OSError, asyncio.TimeoutError, nats.errors.Error) as error:
        raise BrokerUnavailable(f"could not publish the stop of run {run_id!r} on "
                                f"{redact_url(nats_url)}: {error!r}") from error


@dataclass
class Replica:
    """One replica as the engine keeps it: its job, its pickled node, its current
    process and report pipe, and what became of its earlier processes."""

    job: ReplicaJob
    node_bytes: bytes
    process: Any = None
    restarts: int = 0
    final: dict[str, Any] | None = None
    lost: bool = False
    dead: list[dict[str, Any]] = field(default_factory=list)  # its dead processes' last words
    deaths: list[ProcessDeath] = field(default_factory=list)  # how each of them ended
    reports: Any = None  # the engine's end of its current process's report pipe


@dataclass
class Run:
    """A run under supervision: its replicas, their progress, and what the engine
    decided (stop requested, failed, producers' gate open)."""

    compiled: CompiledFlow
    url: str
    run_id: str
    replicas: dict[str, Replica] = field(default_factory=dict)
    progress: dict[str, NodeProgress] = field(default_factory=dict)
    stop_requested: bool = False
    stopped_after: bool = False  # the stop was stop_after's (not a signal's, nor a loss's)
    failed: bool = False
    bound: set[str] = field(default_factory=set)  # replicas bound and open
    gate: Any = None  # a multiprocessing Event: producers may start
    started: float = field(default_factory=time.monotonic)
    crashes: CrashBook | None = None  # deaths per input, per node (crash_limit)
    # Ctrl-C and SIGTERM: run_flow's handler on the main thread (else never counting)
    signals: StopSignals = field(default_factory=StopSignals)
    # The live view's: the replicas' stdout and stderr printed above it (else inherited)
    output: OutputRelay | None = None
    # Called between the loop's steps, on the main thread: the embedded broker's keeper
    keep_broker: Callable[[], None] | None = None

    def outcome(self) -> str:
        """The run's outcome, as its report says it: 'failed' when the run failed or a
        process of a replica failed, was lost (it gave no final word) or aborted;
        else 'stopped' when asked to stop; else 'completed'."""
        finals = [r.final or {} for r in self.replicas.values()]
        finals += [dead for r in self.replicas.values() for dead in r.dead]
        if self.failed or any(f.get("outcome", "lost") in ("failed", "lost", "aborted")
                              for f in finals):
            return "failed"
        return "stopped" if self.stop_requested else "completed"


def supervise(run: Run, max_restarts: int, stop_after: float | None,
              view: LiveView | None) -> None:
    """Start every replica that has not ended, and supervise them until every process
    ended (restarts, Ctrl-C and SIGTERM, the stop, the live view)."""
    context = replica_context()
    # REALTIME keeps only the newest outputs, so a producer that ran before its readers
    # had bound and opened would lose its first outputs to nobody (or to a reader still
    # loading its model in open()): producers start once every other replica is bound
    # and open (or gave up). A BATCH stream keeps them, and so needs none.
    run.gate = context.Event()
    if run.compiled.flow_type != REALTIME:
        run.gate.set()
    # Ctrl-C and SIGTERM are counted by run.signals from here on, and acted on
    # between the loop's steps (one 0.2 s wait at most), never in the middle of one.
    # Once the loop is done, the reaping and the teardown that follow are cut short
    # by the third only (StopSignals).
    run.signals.supervising = True
    run.output = None if view is None else view.relay()
    try:
        for replica in run.replicas.values():
            if replica.final is None:  # a resumed run's ended replicas are not started
                _start(context, replica, run.gate, run.output)
        _watch(context, run, max_restarts, stop_after, view)
    finally:
        if view is not None:
            view.close()  # once the replicas' last lines are printed
    run.signals.finished = True


def _watch(context: Any, run: Run, max_restarts: int, stop_after: float | None,
           view: LiveView | None) -> None:
    """Supervise until every replica's process ended: read their reports, restart
    the dead, act on each Ctrl-C or SIGTERM, stop the flow when asked or when a
    replica is lost, and keep the live view up to date."""
    began = time.monotonic()
    interrupts = 0
    lost_at: float | None = None
    title = f"{run.compiled.flow_id} {run.run_id}"
    while True:
        while interrupts < run.signals.received:
            interrupts += 1
            _interrupt(run, interrupts)
        _drain(run, timeout=0.2)
        if run.keep_broker is not None:
            run.keep_broker()
        for replica in run.replicas.values():
            _check(context, run, replica, max_restarts)
        _open_gate(run)
        if lost_at is None and any(r.lost for r in run.replicas.values()):
            lost_at = time.monotonic()
            _request_stop(run)
        if lost_at is not None and time.monotonic() - lost_at > LOST_GRACE_SECONDS:
            _signal_all(run, QUIESCE_SIGNAL)
            lost_at = float("inf")
        if stop_after is not None and time.monotonic() - began >= stop_after:
            run.stopped_after = not run.stop_requested
            _request_stop(run)
            stop_after = None
        if view is not None:
            view.update(title, run.progress, _restarts_text(run))
        if all(not _alive(r) for r in run.replicas.values()):
            _drain(run, timeout=0.0)
            break
    if view is not None:
        view.update(title, run.progress, _restarts_text(run), force=True)


def _interrupt(run: Run, count: int) -> None:
    """The count-th Ctrl-C or SIGTERM: the first asks the flow to stop, the second
    quiesces every replica, the third and later kill what is left; each says so, and
    what the next one would do (a wind-down can take a while, with nothing else to
    show the key was heard)."""
    if count == 1:
        logs.say("stopping: the producers end their streams and the rest finish what "
                 "they hold (again: the replicas stop now; a third time: killed)",
                 level="WARNING")
        _request_stop(run)
    elif count == 2:
        logs.say("stopping every replica now, handing back what it had not begun "
                 "(again: killed)", level="WARNING")
        _signal_all(run, QUIESCE_SIGNAL)
    else:
        logs.say("killing what is left", level="WARNING")
        _signal_all(run, signal.SIGKILL)


def _restarts_text(run: Run) -> str:
    """The live view's word on restarts: how many so far, '' for none."""
    n = sum(r.restarts for r in run.replicas.values())
    return f"{n} restart{'s' if n != 1 else ''}" if n else ""


def _open_gate(run: Run) -> None:
    """Let the producers start once every reader replica is bound and open, has ended
    or is lost, or the run is stopping."""
    gate = run.gate
    if gate is None or gate.is_set():
        return
    if run.stop_requested or all(
            key in run.bound or r.final is not None or r.lost
            for key, r in run.replicas.items() if r.job.spec.kind != "producer"):
        gate.set()


def _alive(replica: Replica) -> bool:
    return replica.process is not None and (replica.process.is_alive()
                                            or replica.process.exitcode is None)


def _start(context: Any, replica: Replica, run_gate: Any = None,
           output: OutputRelay | None = None) -> None:
    # Each process reports on a pipe of its own, which it alone writes: one killed in
    # the middle of a report (SIGKILL, os._exit) tears only its own pipe, dropped with
    # it. A queue shared by every replica serializes its writers with a lock, which a
    # process killed while writing holds forever: every other replica then hangs on
    # its next report, at its exit at the latest (3 of 20 such kills, 100 KB reports).
    if replica.reports is not None:
        replica.reports.close()
    reader, writer = context.Pipe(duplex=False)
    replica.reports = reader
    job = replica.job
    relayed = None if output is None else output.open(f"[{job.spec.name}/{job.replica_id}] ")
    inherited = ReplicaInheritance.of_this_process(stdio=relayed is None)
    replica.process = context.Process(
        target=_child_main,
        args=(job, replica.node_bytes, writer, inherited, run_gate, relayed),
        name=f"videoflow {job.key}", daemon=False)
    try:
        _spawn(replica.process)
    finally:
        writer.close()  # the child's is the only writer left: its end is the pipe's
        inherited.close()  # the same for its stdout and stderr
        if relayed is not None:
            relayed.close()


def _spawn(process: Any) -> None:
    # A terminal's Ctrl-C, and the SIGTERM of systemd or `timeout`, reach every process
    # of the group, the replicas too; the engine alone decides what they mean. An
    # ignored SIGINT and a blocked SIGTERM survive the exec of a spawned child, so
    # neither ends a replica still starting (its _child_main then ignores SIGTERM and
    # unblocks it); a SIGTERM to the engine waits the few milliseconds of the spawn.
    # The replica server (a forkserver, started by the first start) keeps both for its
    # life, and its forks inherit them as a spawned child does.
    blocked = {signal.SIGTERM} if hasattr(signal, "pthread_sigmask") else set()
    if blocked:
        signal.pthread_sigmask(signal.SIG_BLOCK, blocked)
    try:
        if threading.current_thread() is not threading.main_thread():
            process.start()
            return
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            process.start()
        finally:
            signal.signal(signal.SIGINT, previous)
    finally:
        if blocked:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, blocked)


def _check(context: Any, run: Run, replica: Replica, max_restarts: int) -> None:
    """A replica whose process exited without its final report died (SIGKILL, the
    OOM killer, a segfault): count the death against what it had in hand, note how
    and when it died, and start it again, or give it up."""
    process = replica.process
    if process is None or process.exitcode is None or replica.final is not None:
        return
    if replica.lost:
        return
    _drain(run, timeout=0.0)  # its last words may still be in its pipe
    if replica.final is not None:
        return
    # What the dead process did is what it last reported (at most progress_every
    # before it died); it stays in the counts under a name of its own.
    key, progress = replica.job.key, run.progress[replica.job.spec.name]
    last = progress.replicas.pop(key, None)
    progress.pending.pop(key, None)
    if last is not None:
        dead = dict(last, outcome="restarted")
        progress.replicas[f"{key}~{replica.restarts + 1}"] = dead
        replica.dead.append(dead)
    restart = replica.restarts < max_restarts and not run.stop_requested
    replica.deaths.append(ProcessDeath(
        key, process.pid, exit_description(process.exitcode),
        time.monotonic() - run.started, _count_crash(run, replica), restart))
    if restart:
        replica.restarts += 1
        progress.restarts += 1
        _hand_back(run, replica)
        _start(context, replica, run.gate, run.output)
    else:
        replica.lost = True
        run.failed = True


def _hand_back(run: Run, replica: Replica) -> None:
    """Before a node's only replica starts again: what its dead process had leased is
    handed out at once (ops.resume.release_leases, its own durables only), not after
    ack_wait (30 s a restart). A node with several replicas waits ack_wait out: the
    live ones' leases would lapse too, and their inputs be delivered twice. Meanwhile
    (a second or two; at most _HAND_BACK_SECONDS with the broker away) supervision
    waits: the view stands still, and nothing is lost."""
    from videoflow.core.naming import durable_name_for
    from videoflow.ops.resume import release_leases

    spec = replica.job.spec
    if spec.kind == "producer" or spec.nb_tasks != 1:
        return
    try:
        release_leases(run.url, run.compiled.flow_id, run.run_id, spec.parents,
                       durables=[durable_name_for(spec.name, p) for p in spec.parents],
                       timeout=_HAND_BACK_SECONDS)
    except BrokerUnavailable as error:  # a speed-up only: the leases lapse in ack_wait
        logger.warning("%s: what its last process had in hand comes back after ack_wait "
                       "(%s)", replica.job.key, error)


_HAND_BACK_SECONDS = 5.0
"""How long a restart may spend handing the dead process's leases back."""


def _count_crash(run: Run, replica: Replica) -> list[str]:
    """What the dead process had in hand: each such delivery counts one death in the
    node's crash book (crash_limit), and the slot is cleared for the next process.

    Returns:
        the deliveries, as '<parent>:<stream_seq>'.
    """
    job = replica.job
    if job.in_hand_path is None or run.crashes is None:
        return []
    in_hand = read_in_hand(job.in_hand_path, job.spec.parents)
    # Cleared, so a next process that dies before it holds a group is charged nothing.
    create_slot(job.in_hand_path)
    if in_hand:
        run.crashes.count(job.spec.name, in_hand,
                          exit_description(replica.process.exitcode))
    return [f"{parent}:{seq}" for parent, seq in in_hand]


def _drain(run: Run, timeout: float) -> None:
    """Read the replicas' reports until none comes within timeout (0: until none is
    waiting); a pipe at its end (its process ended, maybe in the middle of a report)
    is closed."""
    deadline = time.monotonic() + timeout
    while True:
        pipes = {r.reports: r for r in run.replicas.values() if r.reports is not None}
        remaining = max(0.0, deadline - time.monotonic())
        if not pipes:
            time.sleep(remaining)
            return
        ready = multiprocessing.connection.wait(list(pipes), remaining)
        if not ready:
            return
        for pipe in ready:
            replica = pipes[pipe]
            try:
                message = replica.reports.recv()
            except (EOFError, OSError):
                replica.reports.close()
                replica.reports = None
                continue
            _take(run, *message)


def _take(run: Run, kind: str, key: str, payload: Any) -> None:
    """One report of a replica's process: progress, final, bound or error."""
    replica = run.replicas[key]
    name = replica.job.spec.name
    if kind == "progress":
        snapshot, pending = payload
        run.progress[name].replicas[key] = snapshot
        if pending is not None:
            run.progress[name].pending[key] = pending
    elif kind == "final":
        replica.final = payload
        run.progress[name].replicas[key] = payload
        # A replica that reached its end of stream left nothing waiting; of any
        # other end, nothing is known any more.
        if payload.get("outcome") == "ended":
            run.progress[name].pending[key] = 0
        else:
            run.progress[name].pending.pop(key, None)
    elif kind == "bound":
        run.bound.add(key)
    elif kind == "unread":  # the command's reader stopped reading its output
        logger.debug("%s: its output is no longer read; stopping the run", key)
        _request_stop(run)
    elif kind == "error":  # it died before its task started: no end marker will come
        replica.final = {"outcome": "failed", "error": payload}
        # Its readers would wait for it forever: the run is stopped, as for a lost one.
        replica.lost = True
        run.failed = True


def _request_stop(run: Run) -> None:
    if run.stop_requested:
        return
    run.stop_requested = True
    try:
        publish_control_stop(run.url, run.compiled.flow_id, run.run_id)
    except Exception:  # the broker is gone: quiesce them instead
        _signal_all(run, QUIESCE_SIGNAL)


def _signal_all(run: Run, signum: int) -> None:
    for replica in run.replicas.values():
        process = replica.process
        if process is not None and process.is_alive() and process.pid is not None:
            try:
                os.kill(process.pid, signum)
            except ProcessLookupError:  # it ended meanwhile
                pass


def reap(run: Run) -> None:
    """Nothing is left running: quiesce what still runs, then kill what will not end."""
    processes = [r.process for r in run.replicas.values() if r.process is not None]
    if any(p.is_alive() for p in processes):
        _signal_all(run, QUIESCE_SIGNAL)
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        for process in processes:
            process.join(max(0.0, deadline - time.monotonic()))
        _signal_all(run, signal.SIGKILL)
    for process in processes:
        process.join()
    for replica in run.replicas.values():
        if replica.reports is not None:
            replica.reports.close()
            replica.reports = None


def _child_main(job: ReplicaJob, node_bytes: bytes, reports: Any,
                inherited: ReplicaInheritance, gate: Any = None,
                output: RelayEnd | None = None) -> None:
    """A replica process: it takes the engine's environment, stdout and stderr
    (inherited: a forked replica has its server's); it ends when the engine dies
    (die_with_parent); the engine coordinates Ctrl-C and SIGTERM, so both are ignored
    here, and it quiesces on QUIESCE_SIGNAL. It reports on its pipe (reports, a
    Connection it alone writes, from this thread); a reader says once it is bound and
    open; a producer waits for the gate (REALTIME), once open itself. With output, its
    stdout and stderr go to the live view's relay."""
    inherited.adopt()
    if output is not None:
        output.adopt()
    die_with_parent()
    if os.environ.get(logs.LOG_FORMAT_ENV):  # the videoflow command chose how to log
        logs.configure()
    logs.set_origin(job.key)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one sent while starting is dropped
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})  # _spawn blocked it
    started = False
    stdout = None
    if output is None and sys.stdout is not None:
        stdout = UnreadStdout(sys.stdout)
        sys.stdout = stdout
        stdout.watch()

    def report(kind: str, payload: Any) -> None:
        try:
            reports.send((kind, job.key, payload))
        except OSError:
            # The engine is gone (a broken pipe): die_with_parent ends this process. A
            # report nobody reads must not fail the node, whose abort would then reach
            # every descendant of a run that could still be resumed.
            pass

    cpu_from: float | None = None  # the process's CPU time once its task could start

    def then_count_cpu(wait: Callable[[], Any]) -> Callable[[], None]:
        def start() -> None:
            nonlocal cpu_from
            wait()
            cpu_from = time.process_time()
        return start

    def progress(task: Task) -> None:
        nonlocal started, stdout
        started = True
        if stdout is not None and stdout.gone.is_set():
            report("unread", None)  # from this thread, which alone writes reports
            stdout = None
        if task.stats.ended is not None:
            snapshot = observed_snapshot(task)[0] if job.observe else task.stats.snapshot()
            snapshot["join_latencies"] = list(task.stats.join_latencies)
            # All its threads (the broker client's loop included), from its start gate
            # to its end: what running the node cost this process, its startup not.
            snapshot["cpu_seconds"] = (None if cpu_from is None
                                       else time.process_time() - cpu_from)
            report("final", snapshot)
            return
        # One read of the broker serves the view and the metrics: per durable, so that
        # replicas sharing one are counted once.
        report("progress", observed_snapshot(task))

    try:
        inherited.check_imports()
        node = pickle.loads(node_bytes)
        if job.spec.kind == "producer":
            run_replica(job, node, progress=progress, sigint_quiesces=False,
                        quiesce_signal=QUIESCE_SIGNAL,
                        before_start=then_count_cpu(
                            (lambda: None) if gate is None else
                            (lambda: gate.wait(START_GATE_SECONDS))))
        else:
            run_replica(job, node, progress=progress, sigint_quiesces=False,
                        quiesce_signal=QUIESCE_SIGNAL,
                        before_start=then_count_cpu(lambda: report("bound", None)))
    except Exception as error:
        if not started:
            report("error", f"{type(error).__name__}: {error}")
        if not started and isinstance(error, (TracingSetupError, MissingDependency,
                                              StartMethodError)):
            # It says what to fix (a package to install, a tracing setup to mend), and
            # the engine's report says it for each replica: a traceback in every replica
            # would bury it. (run_flow checks the tracing setup before any starts; this
            # is the backstop, for a setup function that raised ImportError when called,
            # and for a node whose open() needs a package that is not installed.)
            logger.debug("%s failed", job.key, exc_info=True)
        elif isinstance(error, BrokerUnavailable):
            # The broker away past the outage budget, or refusing: the connection's own
            # warning and the run's report say so, and how to resume; a traceback in
            # every replica would bury both. One line each, the trace at debug.
            logger.error("%s failed: %s: %s", job.key, type(error).__name__, error)
            logger.debug("%s failed", job.key, exc_info=True)
        elif logs.in_json():  # stderr stays JSON lines: the traceback in the record
            logger.error("%s failed: %s: %s", job.key, type(error).__name__, error,
                         exc_info=True)
        else:
            if output is None:  # no live view to label its lines: say whose it is
                logs.say(f"{job.key} failed: {type(error).__name__}: {error}",
                         level="ERROR")
            traceback.print_exc()
        raise SystemExit(1) from error


__all__ = ["LOST_GRACE_SECONDS", "START_GATE_SECONDS", "STOP_GRACE_SECONDS", "Replica", "Run",
           "publish_control_stop", "reap", "supervise"]
