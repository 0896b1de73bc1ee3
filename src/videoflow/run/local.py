"""The local engine: run a flow to its end on this machine, one process per replica.

run_flow compiles the flow, starts the embedded nats-server unless a broker URL is
given, provisions the run (bounded), starts every node replica in a process of its
own (spawned, so nothing of this process's threads or sockets leaks into them), and
supervises: progress reports feed the live view, a replica whose process dies
without a word is started again (its leased inputs return to the broker when their
ack_wait lapses, its ledger lets the replacement take over), and the run ends when
every replica reached its end. Then the run's streams are deleted (never the
dead-letter stream) and the embedded server stopped.

Ctrl-C, and SIGTERM alike (what systemd, docker stop, Kubernetes and ``timeout``
send): the first asks the flow to stop (the run's control stop: producers stop
producing and end their streams, everything already published is still processed,
so a BATCH flow loses nothing, and the report is printed); a second quiesces every
replica (QUIESCE_SIGNAL: held work goes back to the broker); a third kills what is
left. A terminal sends Ctrl-C, and systemd and ``timeout`` send SIGTERM, to the whole
process group: the replicas ignore both, so the engine alone decides what they mean.
Nothing is left running: a replica also ends when the engine itself dies, SIGKILL
included (videoflow.run.supervision.die_with_parent).

A process that dies while its node processes an input counts one death against each
delivery it had in hand (recorded in a slot the engine reads after the death); a
redelivery of an input that coincided with crash_limit deaths is dead-lettered as
'crashed_worker' and the flow goes on, where it would otherwise kill every restart.
This covers the local engine's own replicas only (videoflow.run.supervision).
"""

from __future__ import annotations

import asyncio
import contextvars
import copy
import functools
import multiprocessing
import multiprocessing.connection
import os
import pickle
import shutil
import signal
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from videoflow.core.compiler import CompiledFlow, compile_flow
from videoflow.core.constants import REALTIME
from videoflow.core.naming import sanitize
from videoflow.core.node import Node
from videoflow.core.report import NodeReport, ProcessDeath, RunReport
from videoflow.core.task import Task
from videoflow.run.progress import LiveView, NodeProgress
from videoflow.run.supervision import (
    QUIESCE_SIGNAL,
    CrashBook,
    StopSignals,
    create_slot,
    die_with_parent,
    exit_description,
    read_in_hand,
    supervision_directory,
)
from videoflow.run.worker import ReplicaJob, run_replica

if TYPE_CHECKING:
    from videoflow.backends.shm_payload import SharedMemoryPayloadStore
    from videoflow.ops.run_teardown import RunTeardown

NATS_URL_ENV = "VIDEOFLOW_NATS_URL"
"""The environment variable naming the broker when no nats_url is given."""

LOST_GRACE_SECONDS = 10.0
"""After a replica is lost for good, how long the rest may wind down on their own
before they are quiesced."""

STOP_GRACE_SECONDS = 15.0
"""How long quiesced replicas get to hand their work back before they are killed."""

START_GATE_SECONDS = 120.0
"""The most a REALTIME producer waits for its readers to bind before it starts anyway."""

CRASH_LIMIT = 2
"""run_flow's default crash_limit: an input in hand at two process deaths of its node
is not handed to a third."""


def new_run_id() -> str:
    """A run id that sorts by start time: 'r' + UTC timestamp + 6 random hex digits."""
    return "r" + time.strftime("%Y%m%d%H%M%S", time.gmtime()) + uuid.uuid4().hex[:6]


def publish_control_stop(nats_url: str, flow_id: str, run_id: str,
                         timeout: float = 5.0) -> None:
    """Publish the run's flow-wide stop (core NATS): producers stop and end their
    streams; the rest drain.

    Raises:
        BrokerUnavailable: the broker could not be reached within timeout.
    """
    import nats

    from videoflow.broker.link import servers_of
    from videoflow.core.naming import control_subject_for
    from videoflow.errors import BrokerUnavailable

    async def send() -> None:
        nc = await nats.connect(servers_of(nats_url), allow_reconnect=False,
                                connect_timeout=timeout,
                                max_reconnect_attempts=1)
        try:
            await nc.publish(control_subject_for(flow_id, run_id), b"stop")
            await nc.flush(timeout=max(1, int(timeout)))
        finally:
            await nc.close()

    try:
        asyncio.run(asyncio.wait_for(send(), timeout))
    except (OSError, asyncio.TimeoutError, nats.errors.Error) as error:
        raise BrokerUnavailable(f"could not publish the stop of run {run_id!r} on "
                                f"{nats_url}: {error!r}") from error


@dataclass
class _Replica:
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
class _Run:
    compiled: CompiledFlow
    url: str
    run_id: str
    replicas: dict[str, _Replica] = field(default_factory=dict)
    progress: dict[str, NodeProgress] = field(default_factory=dict)
    stop_requested: bool = False
    failed: bool = False
    bound: set[str] = field(default_factory=set)  # replicas whose durables are bound
    gate: Any = None  # a multiprocessing Event: producers may start
    started: float = field(default_factory=time.monotonic)
    crashes: CrashBook | None = None  # deaths per input, per node (crash_limit)
    # Ctrl-C and SIGTERM: run_flow's handler on the main thread (else never counting)
    signals: StopSignals = field(default_factory=StopSignals)


def _shared_payloads(payloads: bool | str, flow_id: str, run_id: str,
                     budget: int | None) -> SharedMemoryPayloadStore | None:
    """The run's shared-memory payload store when payloads is 'shm' (None otherwise),
    once what crashed runs left past its TTL is swept."""
    if payloads not in (True, False, "shm", "object_store"):
        raise ValueError(f"payloads must be 'shm', 'object_store', True or False, "
                         f"not {payloads!r}")
    if payloads != "shm":
        return None
    from videoflow.backends.shm_payload import SharedMemoryPayloadStore, shm_root, sweep_expired
    from videoflow.core.naming import sanitize

    sweep_expired()
    return SharedMemoryPayloadStore(shm_root() / sanitize(flow_id) / sanitize(run_id),
                                    budget_bytes=budget)


# How _handling_stop_signals hands its handler to the run_flow it wraps (each thread
# starts with its own context, so a run on another thread never sees it).
_SIGNALS: contextvars.ContextVar[StopSignals | None] = contextvars.ContextVar(
    "videoflow_stop_signals", default=None)


def _handling_stop_signals(function: Callable[..., RunReport]) -> Callable[..., RunReport]:
    """run_flow with the engine's SIGINT and SIGTERM handler (StopSignals) installed for
    its whole length when it runs on the main thread, the previous handlers restored
    after, however it ends: Ctrl-C and SIGTERM raise KeyboardInterrupt until the
    replicas start and are counted from then on; the reaping and the teardown are cut
    short by the third only (StopSignals)."""

    @functools.wraps(function)
    def run(*args: Any, **options: Any) -> RunReport:
        signals = StopSignals().install()
        token = _SIGNALS.set(signals)
        try:
            return function(*args, **options)
        finally:
            _SIGNALS.reset(token)
            signals.restore()

    return run


@_handling_stop_signals
def run_flow(
    flow: Any,
    nats_url: str | None = None,
    *,
    run_id: str | None = None,
    store_dir: str | os.PathLike[str] | None = None,
    ephemeral: bool = False,
    provision_timeout: float = 30.0,
    ack_wait: int = 30,
    max_retries: int = 3,
    eos_quiescence_ms: int = 500,
    stop_after: float | None = None,
    max_restarts: int = 3,
    crash_limit: int | None = CRASH_LIMIT,
    ledger: str = "kv",
    payloads: bool | str = "shm",
    payload_budget: int | None = None,
    teardown: bool = True,
    view: LiveView | None | bool = None,
    replicas: int = 1,
    outage_budget: float | None = None,
    resume: bool = False,
) -> RunReport:
    """Run a flow to its end on this machine.

    Arguments:
        flow: a videoflow.flow.Flow.
        nats_url: the broker; None takes VIDEOFLOW_NATS_URL, else starts the embedded
            nats-server (stopped at the end).
        run_id: the run's id; a fresh one (new_run_id) when None.
        store_dir: the embedded server's JetStream store, kept after the run so its
            dead letters stay listable (`videoflow dlq list`); None takes
            VIDEOFLOW_STORE_DIR, else the per-user default (server.store_dir_for). The
            run holds the store's lock for its length: a second run on a store another
            run's server holds fails at once with StoreBusy (it does not share that
            server, which stops when its own run ends); an operator command's brief hold
            is waited for.
        ephemeral: a throwaway temporary store instead, removed when the run ends (not
            with store_dir).
        provision_timeout: the bound on provisioning, connect included.
        ack_wait / max_retries / eos_quiescence_ms: as ReplicaJob.
        stop_after: seconds after which the flow is asked to stop (as a first Ctrl-C);
            None runs until the producers end.
        max_restarts: per replica, how often a process that died without a word is
            started again.
        crash_limit: how many process deaths of a node an input may have been in hand
            at before a redelivery of it is dead-lettered as 'crashed_worker' instead
            of processed; None never gives up on one (then an input that kills every
            process fails the run once max_restarts are spent). At most max_restarts,
            so the input is given up on before the replica is.
        ledger: as ReplicaJob.
        payloads: how outputs too large to travel inline go by ref: 'shm' (the
            default: every replica runs on this host, so through a shared-memory store
            whose readers map the bytes, SharedMemoryPayloadStore; anything over 64 KiB
            goes by ref), 'object_store' or True (the flow's NATS object store, as
            workers on several hosts use), or False (none: such outputs fail).
        payload_budget: the shared-memory store's bound in bytes (DEFAULT_BUDGET_BYTES
            when None); a full budget holds publishers back until readers release.
        teardown: delete the run's streams at the end (never the dead-letter stream),
            and the run's shared-memory payloads that no dead letter pins. A BATCH run
            that still holds unprocessed work (it failed, was stopped, or lost its
            broker past the outage budget) keeps its streams instead, and its report
            says what was kept and how to resume it (RunReport.kept).
        view: a LiveView; None shows one on a terminal (stderr), False shows none.
        replicas: the copies a clustered broker keeps of every stream, the dead-letter
            stream and the ledger and payload buckets (1: a single server); read back
            at provisioning like every other setting.
        outage_budget: seconds every connection of the run waits for a broker that
            went away (restarted, frozen, electing a leader) before the run fails; None
            takes VIDEOFLOW_OUTAGE_BUDGET, else 60.
        resume: run_id names a kept run: its streams are reconciled, not created, and
            every replica that has not ended its stream is started, taking up what its
            durables still hold; a replica whose clean end is on its stream is not
            started again. A producer that had not ended is started again only if it
            is replayable (it resumes from its last accepted source offset); any other
            would publish its outputs twice, and is refused (ValueError).

    Returns:
        the RunReport.

    Raises:
        ValueError: the flow does not compile, or a node cannot be sent to a worker
            process (its constructor arguments do not pickle); both store_dir and
            ephemeral; crash_limit neither None nor from 1 to max_restarts.
        BrokerUnavailable / TimeoutError: the broker unreachable, provisioning not done
            within provision_timeout.
        StoreBusy: the embedded server's store is held by another run's server.
        EmbeddedServerError: the embedded server could not start.
    """
    from videoflow.broker.server import EmbeddedServer, store_dir_for
    from videoflow.messaging.topology import provision_flow_sync
    from videoflow.ops.run_teardown import RunTeardown

    if resume and run_id is None:
        raise ValueError("resume=True needs the run_id of the kept run to resume")
    if crash_limit is not None and not 1 <= crash_limit <= max_restarts:
        raise ValueError(f"crash_limit must be None or from 1 to max_restarts "
                         f"({max_restarts}), got {crash_limit!r}")
    kv = ledger == "kv"
    compiled = compile_flow(flow, max_retries, ledger_budget=kv)
    nodes = {name: _portable(name, node) for name, node in compiled.nodes.items()}
    if view is None or view is True:
        shown = LiveView()
        view = shown if (shown.tty or view is True) else False
    url = nats_url or os.environ.get(NATS_URL_ENV) or None
    server = None
    if url is None:
        # A broker that outlived a SIGKILLed engine would hold the store's lock: it
        # goes with the engine when the engine runs on its main thread (the thread
        # that starts it must live as long as the run).
        server = EmbeddedServer(
            store_dir_for(store_dir, ephemeral=ephemeral), lock=True, purpose="run",
            die_with_owner=threading.current_thread() is threading.main_thread()).start()
        url = server.url
    run = _Run(compiled, url, run_id or new_run_id())
    shared = _shared_payloads(payloads, compiled.flow_id, run.run_id, payload_budget)
    started = time.monotonic()
    run.started, run.signals = started, _SIGNALS.get() or run.signals
    supervision = supervision_directory()
    run.crashes = CrashBook(supervision)
    try:
        provision_flow_sync(url, list(compiled.specs), compiled.flow_id, run.run_id,
                            compiled.flow_type, timeout=provision_timeout,
                            max_retries=max_retries, ack_wait=ack_wait, ledger_budget=kv,
                            replicas=replicas)
        ended = _ended(url, compiled, run.run_id, nodes, provision_timeout) if resume else {}
        for spec in compiled.specs:
            run.progress[spec.name] = NodeProgress(spec.kind)
            for replica in range(spec.nb_tasks):
                slot = supervision / f"{sanitize(spec.name)}.{replica}.in-hand"
                create_slot(slot)
                job = ReplicaJob(compiled.flow_id, run.run_id, compiled.flow_type, spec,
                                 replica, url, ack_wait, max_retries, eos_quiescence_ms,
                                 ledger, bool(payloads),
                                 None if shared is None else str(shared.directory),
                                 str(slot), str(run.crashes.path(spec.name)), crash_limit,
                                 replicas=replicas, outage_budget=outage_budget)
                run.replicas[job.key] = _Replica(job, nodes[spec.name])
                if replica in ended.get(spec.name, ()):
                    run.replicas[job.key].final = {"outcome": "ended",
                                                   "error": "ended before the resume"}
        _supervise(run, max_restarts, stop_after, view if isinstance(view, LiveView) else None)
    finally:
        try:
            _reap(run)
        finally:
            shutil.rmtree(supervision, ignore_errors=True)
        ended_up = RunTeardown(False)  # teardown=False: nothing asked, nothing said
        try:
            if teardown:
                ended_up = _tear_down(url, compiled, run.run_id, provision_timeout)
                if shared is not None and ended_up.torn_down:
                    shared.clear()
        finally:
            if server is not None:
                server.stop()
    report = RunReport(compiled.flow_id, run.run_id, compiled.flow_type, url,
                       seconds=time.monotonic() - started, torn_down=ended_up.torn_down,
                       kept=ended_up.note)
    for spec in compiled.specs:
        ours = {key: r for key, r in run.replicas.items() if r.job.spec.name == spec.name}
        finals = {key: r.final or _lost(r) for key, r in ours.items()}
        for key, entry in ours.items():
            finals.update({f"{key}~{n}": dead for n, dead in enumerate(entry.dead, 1)})
        restarts = sum(r.restarts for r in ours.values())
        deaths = sorted((d for r in ours.values() for d in r.deaths),
                        key=lambda d: d.at_seconds)
        report.nodes[spec.name] = NodeReport.from_replicas(spec.kind, finals, restarts,
                                                           deaths)
    if compiled.flow_type == REALTIME:
        _count_superseded(report, compiled)
    outcomes = [o for n in report.nodes.values() for o in n.outcomes.values()]
    if run.failed or any(o in ("failed", "lost", "aborted") for o in outcomes):
        report.outcome = "failed"
    elif run.stop_requested:
        report.outcome = "stopped"
    return report


def _tear_down(url: str, compiled: CompiledFlow, run_id: str,
               timeout: float) -> RunTeardown:
    """The run's end on the broker: a BATCH run is torn down only once nothing of it
    is left unprocessed (teardown_processed), any other wholly; a broker that cannot be
    reached deletes nothing, and says so."""
    from videoflow.errors import BrokerUnavailable
    from videoflow.ops.run_teardown import RunTeardown, teardown, teardown_processed

    if compiled.flow_type != REALTIME:
        hint = (f"resume it with `videoflow run MODULE:ATTR --resume {run_id}` "
                f"(or run_flow(..., run_id={run_id!r}, resume=True))")
        return teardown_processed(url, compiled.flow_id, run_id, resume_hint=hint,
                                  timeout=timeout)
    try:
        cleanup = teardown(url, compiled.flow_id, run_id, timeout=timeout)
    except BrokerUnavailable as error:
        return RunTeardown(False, note=f"run {run_id} was not torn down: {error}")
    return RunTeardown(cleanup.complete, tuple(cleanup.remaining), note="" if cleanup.complete
                       else f"run {run_id} was not wholly torn down: "
                            f"{', '.join(cleanup.remaining) or 'its streams could not be listed'}")


def _ended(url: str, compiled: CompiledFlow, run_id: str, nodes: dict[str, bytes],
           timeout: float) -> dict[str, set[int]]:
    """For a resumed run: the replicas that already ended their stream, once every
    producer that has not is known to be replayable.

    Raises:
        ValueError: a producer that had not ended is not replayable.
        BrokerUnavailable: the run's streams could not be read, or are gone.
    """
    from videoflow.ops.resume import ended_replicas

    ended = ended_replicas(url, compiled.flow_id, run_id,
                           [s.name for s in compiled.specs if s.kind != "consumer"],
                           timeout=timeout)
    for spec in compiled.specs:
        if spec.kind != "producer" or len(ended.get(spec.name, ())) == spec.nb_tasks:
            continue
        if not getattr(pickle.loads(nodes[spec.name]), "replayable", False):
            raise ValueError(
                f"run {run_id!r} cannot be resumed: producer {spec.name!r} had not ended "
                "its stream and is not replayable, so it would publish its outputs again "
                "(make it replayable, or start a new run)")
    return ended


def _lost(replica: _Replica) -> dict[str, Any]:
    """The final word of a replica that never gave one: lost, and why."""
    if not replica.deaths:
        return {"outcome": "lost", "error": "its process ended without a report"}
    last, n = replica.deaths[-1], replica.restarts
    return {"outcome": "lost",
            "error": f"lost after {n} restart{'s' if n != 1 else ''}; the last "
                     f"{last.describe()}"}


def _count_superseded(report: RunReport, compiled: CompiledFlow) -> None:
    """A REALTIME stream keeps only the newest outputs: what a child never received of
    its parent's outputs was superseded there, and is counted as its drop. Only where
    both ends are fully accounted for (every replica ended, none restarted): a lost
    process's counts died with it, and a guess is not a count."""
    for spec in compiled.specs:
        child = report.nodes[spec.name]
        if not _accounted(child):
            continue
        for parent in spec.parents:
            source = report.nodes[parent]
            if not _accounted(source):
                continue
            missed = source.emitted - child.received.get(parent, 0)
            if missed > 0:
                child.dropped["superseded"] = child.dropped.get("superseded", 0) + missed


def _accounted(node: NodeReport) -> bool:
    return node.restarts == 0 and all(o == "ended" for o in node.outcomes.values())


def _portable(name: str, node: Node) -> bytes:
    """The node as its worker process receives it: without its parents (the spec
    names them) and pickled now, so a node that cannot travel fails before anything
    starts."""
    alone = copy.copy(node)
    alone.parents, alone.context = (), None
    try:
        return pickle.dumps(alone)
    except (pickle.PicklingError, TypeError, AttributeError) as error:
        raise ValueError(f"node {name!r} cannot be sent to its worker process: {error} "
                         "(its attributes must pickle; open resources in open())") from error


def _supervise(run: _Run, max_restarts: int, stop_after: float | None,
               view: LiveView | None) -> None:
    context = multiprocessing.get_context("spawn")
    # REALTIME keeps only the newest outputs, so a producer that ran before its readers
    # had bound would lose its first outputs to nobody: producers start once every
    # other replica is bound (or gave up). A BATCH stream keeps them, and so needs none.
    run.gate = context.Event()
    if run.compiled.flow_type != REALTIME:
        run.gate.set()
    # Ctrl-C and SIGTERM are counted by run.signals from here on, and acted on
    # between the loop's steps (one 0.2 s wait at most), never in the middle of one.
    # Once the loop is done, the reaping and the teardown that follow are cut short
    # by the third only (StopSignals).
    run.signals.supervising = True
    for replica in run.replicas.values():
        if replica.final is None:  # a resumed run's ended replicas are not started
            _start(context, replica, run.gate)
    _watch(context, run, max_restarts, stop_after, view)
    run.signals.finished = True


def _watch(context: Any, run: _Run, max_restarts: int, stop_after: float | None,
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
            _request_stop(run)
            stop_after = None
        if view is not None:
            view.update(title, run.progress, _restarts_text(run))
        if all(not _alive(r) for r in run.replicas.values()):
            _drain(run, timeout=0.0)
            break
    if view is not None:
        view.update(title, run.progress, _restarts_text(run), force=True)


def _interrupt(run: _Run, count: int) -> None:
    """The count-th Ctrl-C or SIGTERM: the first asks the flow to stop, the second
    quiesces every replica, the third and later kill what is left."""
    if count == 1:
        _request_stop(run)
    elif count == 2:
        _signal_all(run, QUIESCE_SIGNAL)
    else:
        _signal_all(run, signal.SIGKILL)


def _restarts_text(run: _Run) -> str:
    """The live view's word on restarts: how many so far, '' for none."""
    n = sum(r.restarts for r in run.replicas.values())
    return f"{n} restart{'s' if n != 1 else ''}" if n else ""


def _open_gate(run: _Run) -> None:
    """Let the producers start once every reader replica is bound, has ended or is
    lost, or the run is stopping."""
    gate = run.gate
    if gate is None or gate.is_set():
        return
    if run.stop_requested or all(
            key in run.bound or r.final is not None or r.lost
            for key, r in run.replicas.items() if r.job.spec.kind != "producer"):
        gate.set()


def _alive(replica: _Replica) -> bool:
    return replica.process is not None and (replica.process.is_alive()
                                            or replica.process.exitcode is None)


def _start(context: Any, replica: _Replica, run_gate: Any = None) -> None:
    # Each process reports on a pipe of its own, which it alone writes: one killed in
    # the middle of a report (SIGKILL, os._exit) tears only its own pipe, dropped with
    # it. A queue shared by every replica serializes its writers with a lock, which a
    # process killed while writing holds forever: every other replica then hangs on
    # its next report, at its exit at the latest (3 of 20 such kills, 100 KB reports).
    if replica.reports is not None:
        replica.reports.close()
    reader, writer = context.Pipe(duplex=False)
    replica.reports = reader
    replica.process = context.Process(
        target=_child_main,
        args=(replica.job, replica.node_bytes, writer, run_gate, os.getpid()),
        name=f"videoflow {replica.job.key}", daemon=False)
    try:
        _spawn(replica.process)
    finally:
        writer.close()  # the child's is the only writer left: its end is the pipe's


def _spawn(process: Any) -> None:
    # A terminal's Ctrl-C, and the SIGTERM of systemd or `timeout`, reach every process
    # of the group, the replicas too; the engine alone decides what they mean. An
    # ignored SIGINT and a blocked SIGTERM survive the exec of a spawned child, so
    # neither ends a replica still starting (its _child_main then ignores SIGTERM and
    # unblocks it); a SIGTERM to the engine waits the few milliseconds of the spawn.
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


def _check(context: Any, run: _Run, replica: _Replica, max_restarts: int) -> None:
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
        _start(context, replica, run.gate)
    else:
        replica.lost = True
        run.failed = True


def _count_crash(run: _Run, replica: _Replica) -> list[str]:
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


def _drain(run: _Run, timeout: float) -> None:
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


def _take(run: _Run, kind: str, key: str, payload: Any) -> None:
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
    elif kind == "error":  # it died before its task started: no end marker will come
        replica.final = {"outcome": "failed", "error": payload}
        # Its readers would wait for it forever: the run is stopped, as for a lost one.
        replica.lost = True
        run.failed = True


def _request_stop(run: _Run) -> None:
    if run.stop_requested:
        return
    run.stop_requested = True
    try:
        publish_control_stop(run.url, run.compiled.flow_id, run.run_id)
    except Exception:  # the broker is gone: quiesce them instead
        _signal_all(run, QUIESCE_SIGNAL)


def _signal_all(run: _Run, signum: int) -> None:
    for replica in run.replicas.values():
        process = replica.process
        if process is not None and process.is_alive() and process.pid is not None:
            try:
                os.kill(process.pid, signum)
            except ProcessLookupError:  # it ended meanwhile
                pass


def _reap(run: _Run) -> None:
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


def _child_main(job: ReplicaJob, node_bytes: bytes, reports: Any, gate: Any = None,
                engine_pid: int | None = None) -> None:
    """A replica process: it ends when the engine dies (die_with_parent, first of
    all); the engine coordinates Ctrl-C and SIGTERM, so both are ignored here, and it
    quiesces on QUIESCE_SIGNAL. It reports on its pipe (reports, a Connection it alone
    writes, from this thread); a reader says once it is bound; a producer waits for the
    gate (REALTIME)."""
    if engine_pid is not None:
        die_with_parent(engine_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one sent while starting is dropped
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})  # _spawn blocked it
    started = False

    def report(kind: str, payload: Any) -> None:
        try:
            reports.send((kind, job.key, payload))
        except OSError:
            # The engine is gone (a broken pipe): die_with_parent ends this process. A
            # report nobody reads must not fail the node, whose abort would then reach
            # every descendant of a run that could still be resumed.
            pass

    def progress(task: Task) -> None:
        nonlocal started
        started = True
        snapshot = task.stats.snapshot()
        if task.stats.ended is not None:
            snapshot["join_latencies"] = list(task.stats.join_latencies)
            report("final", snapshot)
            return
        report("progress", (snapshot, _pending(task)))

    try:
        node = pickle.loads(node_bytes)
        if job.spec.kind == "producer":
            run_replica(job, node, progress=progress, sigint_quiesces=False,
                        quiesce_signal=QUIESCE_SIGNAL,
                        before_start=None if gate is None else
                        (lambda: gate.wait(START_GATE_SECONDS)))
        else:
            run_replica(job, node, progress=progress, sigint_quiesces=False,
                        quiesce_signal=QUIESCE_SIGNAL,
                        before_start=lambda: report("bound", None))
    except Exception as error:
        if not started:
            report("error", f"{type(error).__name__}: {error}")
        traceback.print_exc()
        raise SystemExit(1) from error


def _pending(task: Task) -> int | str | None:
    """Messages waiting for the replica, or why that is unknown (never 0 for unknown)."""
    observe = getattr(task.messenger, "pending_observation", None)
    if observe is None or task.node.kind == "producer":
        return None
    try:
        seen = observe()
    except Exception as error:  # an observation must never kill the replica
        return f"unread: {type(error).__name__}"
    value = getattr(seen, "value", None)
    return value if isinstance(value, int) else str(getattr(seen, "reason", "unknown"))


__all__ = ["NATS_URL_ENV", "new_run_id", "publish_control_stop", "run_flow"]
