"""The local engine: run a flow to its end on this machine, one process per replica.

run_flow compiles the flow, starts the embedded nats-server unless a broker URL is
given, provisions the run (bounded), starts every node replica in a process of its
own (videoflow.run.replica_starts: never a fork of this one, whose threads and sockets
would leak into it), and supervises: progress reports feed the live view, a replica
whose process dies without a word is started again (its leased inputs return to the
broker when their ack_wait lapses, its ledger lets the replacement take over), and the
run ends when every replica reached its end. Then the run's streams are deleted (never
the dead-letter stream) and the embedded server stopped.

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

This module holds run_flow: the run set up, its replicas built, the run torn down
and reported. Starting, watching, restarting and reaping the replica processes, and
the processes' own side, are videoflow.run.processes'.
"""

from __future__ import annotations

import contextvars
import copy
import functools
import os
import pickle
import shutil
import signal
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ParamSpec

from videoflow import logs
from videoflow.broker.link import check_budget, outage_budget_from_env, redact_url
from videoflow.core.compiler import CompiledFlow, compile_flow
from videoflow.core.constants import REALTIME
from videoflow.core.naming import sanitize
from videoflow.core.node import Node
from videoflow.core.report import NodeReport, RunReport
from videoflow.run.metrics import (
    MetricsServer,
    ReplicaSample,
    SnapshotCollector,
    check_port,
    merged,
    metrics_port_from_env,
)
from videoflow.run.processes import Replica, Run, publish_control_stop, reap, supervise
from videoflow.run.progress import LiveView, NodeProgress
from videoflow.run.replica_starts import start_method
from videoflow.run.run_ids import RESUME_COMMAND, new_run_id, take_run_id
from videoflow.run.supervision import CrashBook, StopSignals, create_slot, supervision_directory
from videoflow.run.worker import ReplicaJob

if TYPE_CHECKING:
    from videoflow.backends.shm_payload import SharedMemoryPayloadStore
    from videoflow.broker.server import EmbeddedServer
    from videoflow.ops.run_teardown import RunTeardown

NATS_URL_ENV = "VIDEOFLOW_NATS_URL"
"""The environment variable naming the broker when no nats_url is given."""

FIRST_CONTACT_SECONDS = 10.0
"""The bound of the first connect to a broker given by URL (a TLS handshake to a
distant broker included)."""

BROKER_RESTARTS_PER_WINDOW = 3
BROKER_RESTART_WINDOW_SECONDS = 60.0
"""A run's embedded nats-server is started again after it ends, but not a fourth time
within a minute: one that dies as soon as it is up (no memory, a full disk) is left
down, and the run fails within its outage budget saying why."""

CRASH_LIMIT = 2
"""run_flow's default crash_limit: an input in hand at two process deaths of its node
is not handed to a third."""


def _shared_payloads(payloads: bool | str, compiled: CompiledFlow, run_id: str,
                     budget: int | None) -> SharedMemoryPayloadStore | None:
    """The run's shared-memory payload store when payloads is 'shm' (None otherwise),
    once what crashed runs left past its TTL is swept. Every replica of every node that
    publishes is declared a writer of it before any replica starts: until its first put
    it reserves one payload's room, not a share of the budget, so a camera that starts
    late puts its first frame at once while a node that writes no frames costs the
    others almost nothing (videoflow.backends.shm_shares). Its puts wait for room for
    _payload_wait_seconds."""
    if payloads not in (True, False, "shm", "object_store"):
        raise ValueError(f"payloads must be 'shm', 'object_store', True or False, "
                         f"not {payloads!r}")
    if payloads != "shm":
        return None
    return _make_shared_store(compiled, run_id, budget)


def _make_shared_store(compiled: CompiledFlow, run_id: str,
                       budget: int | None) -> SharedMemoryPayloadStore:
    from videoflow.backends.shm_payload import SharedMemoryPayloadStore, sweep_expired
    from videoflow.backends.shm_runs import run_store_dir

    sweep_expired()
    store = SharedMemoryPayloadStore(
        run_store_dir(compiled.flow_id, run_id), budget_bytes=budget,
        budget_wait_seconds=_payload_wait_seconds(compiled))
    store.declare_writers([(spec.name, replica) for spec in compiled.specs
                           if spec.publishes for replica in range(spec.nb_tasks)])
    return store


def shared_memory_store(compiled: CompiledFlow, run_id: str) -> str:
    """Make a provisioned run's shared-memory payload store on this host, its writers
    declared as the local engine's are, and return its mark (RunSpec.shared_memory).

    Raises:
        OSError: shared memory cannot be written here.
    """
    from videoflow.backends.shm_runs import mark_store

    return mark_store(_make_shared_store(compiled, run_id, None).directory)


def _payload_wait_seconds(compiled: CompiledFlow) -> float:
    """How long a put waits for room in the shared-memory budget: BUDGET_WAIT_SECONDS
    plus the flow's longest join timeout. A producer running ahead of a join's other
    parents is over its share while the join holds its frames for a lagging parent,
    which the join gives up on (releasing them) only once that parent has been silent
    for its timeout_ms: its wait is legitimate for that long. A join whose timeout_ms
    is None never gives up; it adds nothing here (the wait covers the longest finite
    timeout), so a producer held only by such a join fails after BUDGET_WAIT_SECONDS
    rather than hang."""
    from videoflow.backends.shm_payload import BUDGET_WAIT_SECONDS

    timeouts = [spec.plan.join.timeout_ms for spec in compiled.specs
                if spec.plan is not None and len(spec.parents) > 1]
    longest = max((timeout for timeout in timeouts if timeout is not None), default=0.0)
    return BUDGET_WAIT_SECONDS + longest / 1000.0


# How _handling_stop_signals hands its handler to the run_flow it wraps (each thread
# starts with its own context, so a run on another thread never sees it).
_SIGNALS: contextvars.ContextVar[StopSignals | None] = contextvars.ContextVar(
    "videoflow_stop_signals", default=None)


# A ParamSpec, not Callable[..., RunReport]: run_flow's options stay visible to mypy
# and editors through the wrapper.
_Options = ParamSpec("_Options")


def _handling_stop_signals(
        function: Callable[_Options, RunReport]) -> Callable[_Options, RunReport]:
    """run_flow with the engine's SIGINT and SIGTERM handler (StopSignals) installed for
    its whole length when it runs on the main thread, the previous handlers restored
    after, however it ends: Ctrl-C and SIGTERM raise KeyboardInterrupt until the
    replicas start and are counted from then on; the reaping and the teardown are cut
    short by the third only (StopSignals)."""

    @functools.wraps(function)
    def run(*args: _Options.args, **options: _Options.kwargs) -> RunReport:
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
    metrics_port: int | None = None,
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
        metrics_port: serve every replica's counters, latencies and broker counts
            on http://127.0.0.1:PORT/metrics while the run lasts (videoflow.run.metrics;
            0: a port the OS picks, said on stderr); None takes VIDEOFLOW_METRICS_PORT,
            else no endpoint. Needs prometheus-client (pip install prometheus-client).

    Returns:
        the RunReport.

    Raises:
        ValueError: the flow does not compile, or a node cannot be sent to a worker
            process (its constructor arguments do not pickle); both store_dir and
            ephemeral; crash_limit neither None nor from 1 to max_restarts; a
            metrics_port that is not a port.
        MetricsUnavailable: metrics asked for without prometheus-client, or on a port
            that cannot be bound.
        TracingSetupError / MissingDependency: VIDEOFLOW_TRACING_SETUP names no function
            the replicas could call, or spans cannot be made (opentelemetry-api not
            installed): checked before anything starts (tracing.check_setup).
        BrokerUnavailable / TimeoutError: the broker unreachable, provisioning not done
            within provision_timeout.
        RunNotKept: resume=True for a run whose streams are not on the broker (never
            run there, torn down, or another flow's): nothing is started.
        RunExists: resume=False for a run_id a run holds: its streams are on the
            broker, or its record has not ended, or another run claimed it at the same
            moment (run_records.claim_run): nothing is started.
        StoreBusy: the embedded server's store is held by another run's server.
        EmbeddedServerError: the embedded server could not start.
    """
    from videoflow.broker.server import EmbeddedServer, store_dir_for
    from videoflow.messaging.topology import provision_flow_sync
    from videoflow.messaging.tracing import check_setup
    from videoflow.ops.dead_letters import dead_letters_line
    from videoflow.ops.run_records import ended_record, keep_record, started_record
    from videoflow.ops.run_teardown import RunTeardown

    if resume and run_id is None:
        raise ValueError("resume=True needs the run_id of the kept run to resume")
    if crash_limit is not None and not 1 <= crash_limit <= max_restarts:
        raise ValueError(f"crash_limit must be None or from 1 to max_restarts "
                         f"({max_restarts}), got {crash_limit!r}")
    # Once here, not in every replica: a tracing setup that cannot give spans, or a
    # start method this platform lacks, is one error before anything starts.
    check_setup()
    start_method()
    # And the budget, here rather than in every replica, for the same reason.
    outage_budget = (outage_budget_from_env() if outage_budget is None
                     else check_budget(outage_budget))
    kv = ledger == "kv"
    metrics_port = (metrics_port_from_env() if metrics_port is None
                    else check_port(metrics_port))
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
    if server is None:
        _first_contact(url, min(provision_timeout, FIRST_CONTACT_SECONDS))
    run = Run(compiled, url, run_id or new_run_id())
    if server is not None:
        run.keep_broker = broker_keeper(server)
    # The run's record in its flow's ledger bucket and its revision, once written: a
    # new run's is its claim on its id, and its end is written over that revision only.
    record, revision, metrics = None, None, None
    try:
        # Before anything is provisioned: a run id whose streams are not there (a typo,
        # a run torn down, another flow's) is refused, never started afresh.
        ended = _ended(url, compiled, run.run_id, nodes, provision_timeout) if resume else {}
        if resume:
            _forget_aborts(url, compiled, run.run_id, kv, replicas, provision_timeout)
        else:
            # Before anything of the run is made (shared memory included), so a run
            # refused its id touches nothing of the run that holds it.
            record, revision = take_run_id(url, compiled.flow_id, run.run_id,
                                           chosen=run_id is not None, replicas=replicas,
                                           timeout=provision_timeout)
        if metrics_port is not None:
            metrics = MetricsServer(SnapshotCollector(
                compiled.flow_id, functools.partial(_metric_samples, run)), metrics_port)
            # Said whatever the log level: with port 0, the only way to learn the port.
            logs.say(f"metrics of run {run.run_id} on {metrics.url}")
        shared = _shared_payloads(payloads, compiled, run.run_id, payload_budget)
    except BaseException:
        if metrics is not None:
            metrics.close()
        if revision is not None and record is not None:  # its id is free again
            keep_record(url, ended_record(record, "failed", False, ""), replicas, revision)
        if server is not None:
            server.stop()
        raise
    started = time.monotonic()
    run.started, run.signals = started, _SIGNALS.get() or run.signals
    supervision = supervision_directory()
    run.crashes = CrashBook(supervision)
    try:
        provision_flow_sync(url, list(compiled.specs), compiled.flow_id, run.run_id,
                            compiled.flow_type, timeout=provision_timeout,
                            max_retries=max_retries, ack_wait=ack_wait, ledger_budget=kv,
                            replicas=replicas)
        if resume:
            record = started_record(compiled.flow_id, run.run_id)
            revision = keep_record(url, record, replicas)
            _release_leases(url, compiled, run.run_id, provision_timeout)
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
                                 replicas=replicas, outage_budget=outage_budget,
                                 observe=metrics is not None)
                run.replicas[job.key] = Replica(job, nodes[spec.name])
                if replica in ended.get(spec.name, ()):
                    run.replicas[job.key].final = {"outcome": "ended",
                                                   "error": "ended before the resume"}
        supervise(run, max_restarts, stop_after, view if isinstance(view, LiveView) else None)
    except BaseException:
        run.failed = True  # its record's end says so (the report is not made)
        raise
    finally:
        try:
            reap(run)
        finally:
            shutil.rmtree(supervision, ignore_errors=True)
        ended_up = RunTeardown(False)  # teardown=False: nothing asked, nothing said
        try:
            if teardown:
                ended_up = _tear_down(url, compiled, run.run_id, provision_timeout,
                                      _unfinished_replayable(compiled, run, nodes, ended))
                if ephemeral and server is not None and not ended_up.torn_down:
                    # Its streams go with the store when the server stops: nothing is
                    # kept, whatever the broker was asked to keep.
                    ended_up = RunTeardown(False, left_over=ended_up.left_over, note=(
                        f"run {run.run_id} did not finish, and its streams go with the "
                        "ephemeral store (--ephemeral): it cannot be resumed"))
                if shared is not None and (ended_up.torn_down or ephemeral):
                    shared.clear()
            if shared is not None:
                shared.remove_if_empty()  # a kept run's, with no payload in it
            if record is not None and revision is not None:
                keep_record(url, ended_record(record, run.outcome(), ended_up.torn_down,
                                              ended_up.note), replicas, revision)
        finally:
            if metrics is not None:
                metrics.close()
            if server is not None:
                server.stop()
    # The report is printed, written as JSON and kept: never with the URL's password.
    report = RunReport(compiled.flow_id, run.run_id, compiled.flow_type, redact_url(url),
                       seconds=time.monotonic() - started, torn_down=ended_up.torn_down,
                       kept=ended_up.note, left_over=ended_up.left_over)
    if run.signals.first is not None:
        report.stopped_by = signal.Signals(run.signals.first).name
    elif run.stopped_after:
        report.stopped_by = "stop_after"
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
    report.dead_letters = dead_letters_line(report.dead_lettered, compiled.flow_id, run.run_id,
                                            nats_url, store_dir, ephemeral)
    return report


def _unfinished_replayable(compiled: CompiledFlow, run: Run, nodes: dict[str, bytes],
                           ended: dict[str, set[int]]) -> list[str]:
    """The replayable producers of which a replica did not end its stream (it failed,
    was lost, or never started: a resume that failed before its replicas did): a
    resume would take them up where their ledger says they were."""
    unfinished = set()
    for spec in compiled.specs:
        for replica in range(spec.nb_tasks if spec.kind == "producer" else 0):
            started = run.replicas.get(f"{spec.name}[{replica}]")
            final = (started.final if started is not None else None) or {}
            if final.get("outcome") != "ended" and replica not in ended.get(spec.name, ()):
                unfinished.add(spec.name)
    return sorted(name for name in unfinished
                  if getattr(pickle.loads(nodes[name]), "replayable", False))


def _tear_down(url: str, compiled: CompiledFlow, run_id: str, timeout: float,
               unfinished: Sequence[str] = ()) -> RunTeardown:
    """The run's end on the broker: a BATCH run is torn down only once nothing of it
    is left unprocessed and no replayable producer is left unfinished
    (teardown_processed), any other wholly; a broker that cannot be reached deletes
    nothing, and says so. The run's record is left to run_flow, which writes its end."""
    from videoflow.errors import BrokerUnavailable
    from videoflow.ops.run_teardown import RunTeardown, teardown, teardown_processed

    if compiled.flow_type != REALTIME:
        hint = (f"resume it with `{RESUME_COMMAND} --resume {run_id}` "
                f"(or run_flow(..., run_id={run_id!r}, resume=True))")
        return teardown_processed(url, compiled.flow_id, run_id, resume_hint=hint,
                                  unfinished=unfinished, end_record=False, timeout=timeout)
    try:
        cleanup = teardown(url, compiled.flow_id, run_id, end_record=False, timeout=timeout)
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
        RunNotKept: a node's stream is not on the broker: nothing to resume.
        BrokerUnavailable: the run's streams could not be read.
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


def _forget_aborts(url: str, compiled: CompiledFlow, run_id: str, kv: bool, replicas: int,
                   timeout: float) -> None:
    """For a resumed run, before any replica starts: the aborts of the run before are
    forgotten, on the streams and in the ledger, as every replica that aborted is
    started again (a child would otherwise end at its parent's old abort)."""
    from videoflow.ops.resume import drop_abort_markers

    drop_abort_markers(url, compiled.flow_id, run_id,
                       [s.name for s in compiled.specs if s.kind != "consumer"],
                       timeout=timeout)
    if kv:
        from videoflow.backends.jetstream.ledger_store import NatsKvRuntimeStore
        from videoflow.core.naming import ledger_bucket
        from videoflow.core.runtime import forget_aborts

        store = NatsKvRuntimeStore(url, ledger_bucket(compiled.flow_id), timeout=timeout,
                                   replicas=replicas)
        try:
            forget_aborts(store, compiled.flow_id, run_id)
        finally:
            store.close()


def _release_leases(url: str, compiled: CompiledFlow, run_id: str, timeout: float) -> None:
    """For a resumed run, before any replica starts: what the failed run's replicas had
    received and not settled is delivered again now, not once ack_wait lapses on
    processes that are gone; said when there was any."""
    from videoflow.errors import BrokerUnavailable
    from videoflow.ops.resume import release_leases

    try:
        held = release_leases(url, compiled.flow_id, run_id,
                              [s.name for s in compiled.specs if s.kind != "consumer"],
                              timeout=timeout)
    except BrokerUnavailable as error:
        # A speed-up, not a step the resume needs: those leases lapse in ack_wait.
        logs.say(f"run {run_id}: what its replicas had not settled is handed out again "
                 f"once ack_wait lapses ({error})", level="WARNING")
        return
    if held:
        logs.say(f"run {run_id}: {held} deliver{'y' if held == 1 else 'ies'} its "
                 f"replicas had not settled {'is' if held == 1 else 'are'} handed out "
                 "again now (not after ack_wait)", held=held)


def _first_contact(url: str, timeout: float) -> None:
    """A broker given by URL is reached once before anything else, failing fast: one
    that refuses, or whose name does not resolve, or that does not speak NATS, is
    reported at once with its cause, not after provisioning waited out its timeout
    retrying (the replicas' first connect fails fast the same way).

    Raises:
        BrokerUnavailable: it did not answer within timeout, and why.
    """
    import asyncio

    from videoflow.broker.loop import ErrorLog, close_client, connect_fail_fast

    async def reach() -> None:
        await close_client(await connect_fail_fast(url, timeout, ErrorLog()))

    asyncio.run(reach())


def broker_keeper(server: EmbeddedServer) -> Callable[[], None]:
    """What keeps a run's embedded nats-server up: called between the supervision
    loop's steps (on the thread that started the server, which its die-with-owner
    signal is bound to), it starts the server again on its store and port if its
    process ended, and says so. The replicas' connections ride that out like any
    broker restart (the outage budget); a server that cannot start again is said once,
    and the run fails when their budget runs out."""
    from videoflow.errors import EmbeddedServerError

    failed = False
    restarts: list[float] = []

    def keep() -> None:
        nonlocal failed
        if failed or server.process is None or server.process.poll() is None:
            return
        pid, code = server.process.pid, server.process.returncode
        now = time.monotonic()
        restarts[:] = [t for t in restarts if now - t < BROKER_RESTART_WINDOW_SECONDS]
        if len(restarts) >= BROKER_RESTARTS_PER_WINDOW:
            failed = True  # it dies as soon as it is up: starting it again will not help
            logs.say(f"the embedded nats-server (pid {pid}) ended ({_how(code)}), its "
                     f"{len(restarts) + 1}th end in {BROKER_RESTART_WINDOW_SECONDS:g} s: "
                     f"not started again (its log: {server.log_path})", level="ERROR")
            return
        restarts.append(now)
        try:
            server.restart()
        except EmbeddedServerError as error:
            failed = True
            logs.say(f"the embedded nats-server (pid {pid}) ended ({_how(code)}) and "
                     f"could not start again: {error}", level="ERROR")
            return
        logs.say(f"the embedded nats-server (pid {pid}) ended ({_how(code)}); started "
                 f"again on its store at {server.url}", level="WARNING")

    return keep


def _how(code: int) -> str:
    """How a process ended, from its exit code (negative: the signal)."""
    if code >= 0:
        return f"exit code {code}"
    try:
        return f"killed by {signal.Signals(-code).name}"
    except ValueError:  # a real-time signal has no name
        return f"killed by signal {-code}"


def _lost(replica: Replica) -> dict[str, Any]:
    """The final word of a replica that never gave one: lost, and why."""
    if not replica.deaths:
        return {"outcome": "lost", "error": "its process ended without a report"}
    last, n = replica.deaths[-1], replica.restarts
    return {"outcome": "lost",
            "error": f"lost after {n} restart{'s' if n != 1 else ''}; the last "
                     f"{last.describe()}"}


def _count_superseded(report: RunReport, compiled: CompiledFlow) -> None:
    """A REALTIME stream keeps only the newest outputs: what a child never received of
    its parent's outputs was superseded there, and is counted as its drop (what it
    received and skipped itself, a one-parent node behind a burst, it counted). Only
    where both ends are fully accounted for (every replica ended, none restarted): a
    lost process's counts died with it, and a guess is not a count."""
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


def _metric_samples(run: Run) -> list[ReplicaSample]:
    """Every replica's latest report for a scrape (on the server's thread: reads and
    copies only), the processes of it that died and were started again summed in."""
    samples = []
    for key, replica in list(run.replicas.items()):
        progress = run.progress.get(replica.job.spec.name)
        live = None if progress is None else progress.replicas.get(key)
        snapshots = [*replica.dead, *([] if live is None else [live])]
        if snapshots:
            samples.append(ReplicaSample(replica.job.spec.name, str(replica.job.replica_id),
                                         merged(snapshots), replica.restarts,
                                         inputs=replica.job.spec.kind != "producer"))
    return samples


def _portable(name: str, node: Node) -> bytes:
    """The node as its worker process receives it: without its parents (the spec
    names them) and pickled now, so a node that cannot travel fails before anything
    starts."""
    alone = copy.copy(node)
    alone.parents = ()
    del alone.context
    try:
        return pickle.dumps(alone)
    except (pickle.PicklingError, TypeError, AttributeError) as error:
        raise ValueError(f"node {name!r} cannot be sent to its worker process: {error} "
                         "(its attributes must pickle; open resources in open())") from error


__all__ = ["NATS_URL_ENV", "new_run_id", "publish_control_stop", "run_flow",
           "shared_memory_store"]
