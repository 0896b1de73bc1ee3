"""One node replica in one process: its messenger, ledger and payload store on a
broker, its task, and the signals that stop it.

The local engine (videoflow.run.local) runs run_replica in a child process per
replica; ``videoflow worker`` runs it in the foreground on any host. Both describe the
replica with a ReplicaJob, so a replica behaves the same wherever it runs.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from types import FrameType, SimpleNamespace
from typing import Any

from videoflow.broker.link import BROKER_KNOWN_ENV, OUTAGE_BUDGET_ENV, check_budget
from videoflow.core.compiler import NodeSpec
from videoflow.core.naming import ledger_bucket, payload_bucket
from videoflow.core.node import Node
from videoflow.core.task import RuntimeContext, Task, TaskStats, task_for
from videoflow.run.allocator import tune_allocator
from videoflow.run.gc_freeze import freeze_setup


@dataclass(frozen=True)
class ReplicaJob:
    """Everything a replica needs besides its node.

    Attributes:
        flow_id / run_id / flow_type: the run.
        spec: the node's compiled spec (compile_flow), whose plan its messenger binds
            with, as provisioning created its durables (MSG-017).
        replica_id: which of its spec.nb_tasks replicas this is.
        nats_url: the broker.
        ack_wait: seconds a delivery stays leased before the broker redelivers it.
        max_retries: the delivery preset's retry count.
        eos_quiescence_ms: the end-of-stream fallback when drain cannot be observed.
        ledger: 'kv' (the run's FlowRuntime in NATS KV: durable and shared, so a
            restarted replica resumes its checkpoint and epoch, and retry budgets are
            counted across replicas) or 'memory' (dies with the process).
        payloads: whether outputs above the broker's inline limit travel by ref
            through the flow's NATS object store.
        payload_dir: when set, payloads travel by ref through the shared-memory store
            in this folder instead (replicas on one host; SharedMemoryPayloadStore,
            whose own threshold sends anything over 64 KiB by ref).
        in_hand_path / crashes_path / crash_limit: the local engine's crash
            bookkeeping (videoflow.run.supervision): the replica's in-hand slot, its
            node's crash counts, and the process deaths an input may coincide with
            before it is dead-lettered as crashed_worker (None: never). None for a
            ``videoflow worker``, whose restarts its own supervisor makes.
        replicas: the copies a clustered broker keeps of the flow's ledger and payload
            buckets when this replica creates them (1: a single server).
        outage_budget: seconds this replica's connections wait for a broker that went
            away before giving up (None: VIDEOFLOW_OUTAGE_BUDGET, else 60).
        observe: the final report carries the broker's count of the replica's work
            per parent too, as each progress report does (metrics.observed_snapshot):
            the engine serves metrics.
    """

    flow_id: str
    run_id: str
    flow_type: str
    spec: NodeSpec
    replica_id: int
    nats_url: str
    ack_wait: int = 30
    max_retries: int = 3
    eos_quiescence_ms: int = 500
    ledger: str = "kv"
    payloads: bool = True
    payload_dir: str | None = None
    in_hand_path: str | None = None
    crashes_path: str | None = None
    crash_limit: int | None = None
    replicas: int = 1
    outage_budget: float | None = None
    observe: bool = False

    def __post_init__(self) -> None:
        """Refuses a spec without a plan (one built by hand, not compiled).

        Raises:
            ValueError: naming the replica.
        """
        if self.spec.plan is None:
            raise ValueError(f"{self.key}: its spec has no plan; a replica runs a spec "
                             "compile_flow made")

    @property
    def key(self) -> str:
        """'<node>[<replica>]', how reports and logs name the replica."""
        return f"{self.spec.name}[{self.replica_id}]"


def run_replica(job: ReplicaJob, node: Node, *,
                progress: Callable[[Task], None] | None = None,
                progress_every: float = 1.0, sigint_quiesces: bool = True,
                quiesce_signal: int = signal.SIGTERM,
                before_start: Callable[[], Any] | None = None) -> TaskStats:
    """Run one node replica to its end in this (the main) thread.

    quiesce_signal, SIGTERM by default, quiesces it (RUN-030: it stops taking input,
    its prefetched inputs go back to the broker at once, it publishes no end of
    stream); so does SIGINT when sigint_quiesces, else SIGINT is ignored. The local
    engine, which coordinates Ctrl-C and SIGTERM for its whole process group, passes
    another quiesce_signal: then SIGTERM is ignored too.

    Arguments:
        job: the replica.
        node: the node object (its name is set to the spec's).
        progress: called with the task about every progress_every seconds.
        before_start: called once the replica's durables are bound and its node is
            open and its setup frozen, before its first input or output (the local
            engine's start gate: a REALTIME reader still in open() would lose the
            first outputs of a producer already running).

    It is the process's: its allocator is tuned for frame-sized buffers first
    (videoflow.run.allocator), and once it is set up and its node open, what it holds
    is frozen out of the garbage collector's full collections (videoflow.run.gc_freeze;
    on the main thread only).

    Returns:
        the task's stats.

    Raises:
        BrokerUnavailable: the broker, its ledger or payload store unreachable.
        Exception: whatever killed the node (after its abort was published).
    """
    tune_allocator()
    from videoflow.backends.jetstream.ledger_store import NatsKvRuntimeStore
    from videoflow.backends.jetstream.payloads import NatsObjectPayloadStore
    from videoflow.backends.payload import PayloadStore
    from videoflow.backends.shm_payload import SharedMemoryPayloadStore
    from videoflow.core.runtime import FlowRuntime
    from videoflow.messaging.nats_messenger import NATSMessenger

    spec = job.spec
    node._name = spec.name  # the compiler's name, also for unnamed nodes
    if job.outage_budget is not None:
        # Every connection of this process reads it: the backend's, the ledger's and
        # the payload store's (the backend's constructor is the reference's, fixed).
        os.environ[OUTAGE_BUDGET_ENV] = repr(check_budget(job.outage_budget))
    # The run was provisioned on this broker: a replica (re)started while it is away
    # waits for it, within the budget, instead of failing its first connect.
    os.environ[BROKER_KNOWN_ENV] = "1"
    with ExitStack() as stack:
        runtime = None
        if job.ledger == "kv":
            store = NatsKvRuntimeStore(job.nats_url, ledger_bucket(job.flow_id),
                                       replicas=job.replicas)
            stack.callback(store.close)
            runtime = FlowRuntime(store, job.flow_id, job.run_id, spec.name, job.replica_id)
        elif job.ledger != "memory":
            raise ValueError(f"ledger must be 'kv' or 'memory', got {job.ledger!r}")
        payload_store: PayloadStore | None = None
        if job.payloads and job.payload_dir is not None:
            # Its puts are charged to this replica's share of the budget (the engine
            # declared it, and recorded how long a put may wait for room).
            payload_store = SharedMemoryPayloadStore(job.payload_dir, flow_type=job.flow_type,
                                                     writer=(spec.name, job.replica_id))
        elif job.payloads:
            payload_store = NatsObjectPayloadStore(job.nats_url, payload_bucket(job.flow_id),
                                                   replicas=job.replicas,
                                                   flow_type=job.flow_type)
            stack.callback(payload_store.close)
        messenger = NATSMessenger(
            SimpleNamespace(name=spec.name, codecs=node.codecs, pack=node.pack),
            list(spec.parents),
            job.nats_url, job.flow_id, job.flow_type, job.run_id,
            replica_id=job.replica_id, ack_wait=job.ack_wait,
            max_retries=job.max_retries, eos_quiescence_ms=job.eos_quiescence_ms,
            nb_tasks=spec.nb_tasks, partition_by=spec.partition_by, plan=spec.plan,
            payload_store=payload_store,
            blob_reader_ids=list(spec.blob_reader_ids or ()) or None, runtime=runtime,
            replayable=bool(getattr(node, "replayable", False)))
        if job.in_hand_path is not None and spec.parents:
            from videoflow.run.supervision import CrashCounts, InHandSlot

            slot = InHandSlot(job.in_hand_path, spec.parents)
            stack.callback(slot.close)
            messenger.deliveries.watch_crashes(
                slot, None if job.crashes_path is None else CrashCounts(job.crashes_path),
                job.crash_limit)
        context = RuntimeContext(messenger, spec.name, parents=spec.parents,
                                 publishes=spec.publishes, replica_id=job.replica_id,
                                 nb_tasks=spec.nb_tasks, flow_id=job.flow_id,
                                 run_id=job.run_id, broker_url=job.nats_url)

        # What the process imported and set up so far is frozen before the node opens,
        # so the collection after open() walks only what open() made: one collection of
        # everything after open() held a reader's first inputs 20-45 ms (gc_freeze).
        freeze_setup()

        def opened() -> None:
            freeze_setup(young=True)
            if before_start is not None:
                before_start()

        task = task_for(node, messenger, context, progress=progress,
                        progress_every=progress_every, opened=opened)
        with _stop_signals(task, sigint_quiesces, quiesce_signal):
            stats = task.run()
    return stats


@contextmanager
def _stop_signals(task: Task, sigint_quiesces: bool,
                  quiesce_signal: int = signal.SIGTERM) -> Iterator[None]:
    """quiesce_signal (and SIGINT when asked) quiesce the task; SIGINT is otherwise
    ignored, and so is SIGTERM when it is not quiesce_signal. Only the main thread can
    install handlers; elsewhere (tests running a replica on a thread) nothing is
    installed."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def quiesce(_signum: int, _frame: FrameType | None) -> None:
        # The handler runs on the main thread wherever it was: often inside a run of
        # the broker's loop (a receive waiting runs it, LoopRunner), where a quiesce
        # cannot wait on the broker. A thread of its own can: the waiting task's loop
        # serves it, and the task sees the quiesce at its next receive.
        threading.Thread(target=task.quiesce, name="videoflow-quiesce", daemon=True).start()

    previous: dict[int, Any] = {quiesce_signal: signal.signal(quiesce_signal, quiesce)}
    if quiesce_signal != signal.SIGTERM:
        previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    previous[signal.SIGINT] = signal.signal(
        signal.SIGINT, quiesce if sigint_quiesces else signal.SIG_IGN)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


__all__ = ["ReplicaJob", "run_replica"]
