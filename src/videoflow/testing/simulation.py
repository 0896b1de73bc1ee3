"""The simulation: a flow run in this process, on the memory adapter and a simulated clock.

The flow's processors and consumers run unchanged -- the same classes, open() and
close() included, each replica a copy of its node as a worker process would get it --
on the messenger and task every run uses; only the broker is the in-process one and
time is simulated (videoflow.testing.scheduler). Producers given inputs are played
from them; a producer given none runs its own next().

A join's timeouts run by the simulated clock: a 300 ms timeout takes no wall time, and
the same inputs give the same groups on every run.

What differs from a run on JetStream: payloads travel inside their envelopes (no
payload store), the runtime ledger is each replica's own (in memory), and no time
passes while a node works (its process() takes no simulated time).
"""

from __future__ import annotations

import copy
import pickle
from collections.abc import Iterable, Mapping, Sequence
from types import SimpleNamespace
from typing import Any

from videoflow import clock
from videoflow.backends.memory import MemoryBroker, MemoryMessagingBackend
from videoflow.backends.messaging import (
    LIVE_LATEST,
    RELIABLE_WORK,
    Accepted,
    ChannelId,
    ChannelSpec,
    Envelope,
    Rejected,
    SubscriptionId,
)
from videoflow.core.compiler import CompiledFlow, NodeSpec, compile_flow
from videoflow.core.constants import BATCH, REALTIME
from videoflow.core.context import RuntimeContext
from videoflow.core.credit import realtime_buffer_for
from videoflow.core.node import ConsumerNode, Node, ProcessorNode, ProducerNode
from videoflow.core.report import NodeReport, ProcessDeath, RunReport
from videoflow.core.task import Task, task_for
from videoflow.flow import Flow
from videoflow.messaging.dead_letters import decode_dead_letter
from videoflow.messaging.grouping import CollectEntry
from videoflow.messaging.nats_messenger import NATSMessenger
from videoflow.testing.scheduler import Scheduler, SimCondition, VirtualTime
from videoflow.testing.script import (
    Crash,
    Drop,
    Group,
    Input,
    Output,
    Silent,
    SimulationResult,
)
from videoflow.wire.serialization import decode_envelope

RUN_ID = "sim"
EPOCH_AT_ZERO = 1_700_000_000.0
"""The epoch simulated time 0 stands for when no input carries an event time."""
MAX_PAYLOAD = 1 << 30
"""Envelopes carry their payloads in a simulation: no frame is refused for its size."""
WIND_DOWN_SECONDS = 60.0
"""Simulated seconds a run stopped at ``until`` has to wind down before what is left
is ended where it stands."""
LIMIT_ACK_WAITS = 10
"""Without an until, a run that has not ended ack_wait times this many simulated
seconds after its last scripted input is stopped there (a join told to wait for ever
for a frame never sent, say): a test that would hang fails with a report instead."""

Inputs = Mapping[str, Iterable["Input | Silent"]]


def simulate(flow: Any, inputs: Inputs | None = None, *, crashes: Sequence[Crash] = (),
             until: float | None = None, ack_wait: float = 30.0, max_retries: int = 3,
             eos_quiescence_ms: int = 500, restart_after: float = 0.5) -> SimulationResult:
    """Run flow in this process on simulated time, and return what it did.

    Arguments:
        flow: a videoflow Flow.
        inputs: per producer name, the Inputs it sends, in order (a Silent last makes
            it go quiet without ending its stream). A producer not named runs its own
            next().
        crashes: node replicas that die while processing a group (Crash).
        until: simulated seconds after which the run is stopped (its nodes quiesce,
            as on Ctrl-C); None runs it to its end, or stops it LIMIT_ACK_WAITS
            ack_waits after its last scripted input. A flow with a Silent producer
            never ends by itself: it needs one.
        ack_wait: seconds a delivery stays leased before it is delivered again.
        max_retries / eos_quiescence_ms: as Flow.run.
        restart_after: simulated seconds between a replica's crash and its restart.

    Returns:
        SimulationResult.

    Raises:
        ValueError: inputs for a node that is not a producer of the flow, a crash of
            a node without inputs, a Silent not last, or a Silent without until.
        SimulationStuck: a node blocked outside the simulation.
    """
    compiled = compile_flow(flow, max_retries)
    scripts = _checked(compiled, inputs or {}, crashes, until)
    stamped = [i.event_ts for items in scripts.values() for i in items
               if isinstance(i, Input) and i.event_ts is not None]
    time = VirtualTime(min(stamped) if stamped else EPOCH_AT_ZERO)
    scheduler = Scheduler(time)
    run = _Run(compiled, scheduler, ack_wait, max_retries, eos_quiescence_ms,
               {(c.node, c.replica): c for c in crashes}, restart_after)
    with clock.simulated(time.monotonic, time.wall):
        try:
            for spec in compiled.specs:
                for replica in range(spec.nb_tasks):
                    items = scripts.get(spec.name) if replica == 0 else None
                    if spec.kind == "producer" and spec.name in scripts and replica:
                        continue  # a script is one producer's stream, played once
                    run.start(spec, replica, items)
            limit, run.stopped_by = until, "until"
            if until is None:
                limit = _last_input(scripts, time.epoch_at_zero) + LIMIT_ACK_WAITS * ack_wait
                run.stopped_by = (f"the simulation's limit: not ended {limit:.0f} s in, "
                                  f"{LIMIT_ACK_WAITS} ack_waits after its last input")
            scheduler.run(limit)
            if run.live():
                run.stopping = True
                for replica_run in run.replicas:
                    replica_run.stop()
                scheduler.changed()  # a silent producer waits for nothing else
                scheduler.run(time.now + WIND_DOWN_SECONDS)
        finally:
            scheduler.end()
            for backend in run.backends:
                backend.shutdown(hand_back=False)
    return run.result()


def simulate_node(node: Node, inputs: Inputs, *, flow_type: str = BATCH,
                  **options: Any) -> SimulationResult:
    """Run one node on given inputs: simulate over a flow of a scripted producer per
    input (named by its key, wired in that order) -> node (-> a consumer that keeps
    nothing, for a processor, whose outputs are then result.outputs[node.name]).

    Arguments:
        node: a ProcessorNode or ConsumerNode, not yet wired to parents.
        inputs: per parent name, the Inputs it sends, in the order node's inputs
            are presented.
        flow_type: BATCH or REALTIME.
        options: as simulate.

    Raises:
        TypeError: node is a producer.
        ValueError: node is already wired, or as simulate.
    """
    if not isinstance(node, (ProcessorNode, ConsumerNode)):
        raise TypeError(f"{node!r}: simulate_node runs a processor or a consumer; "
                        "a producer's output is its own next()")
    if node.parents:
        raise ValueError(f"{node!r} is already wired to parents: simulate_node wires it "
                         "to its inputs' producers")
    producers = [_Stand(name=name) for name in inputs]
    wired = node(*producers)
    consumers = [wired] if isinstance(node, ConsumerNode) else [
        _Discard(name=f"{node.name}-outputs")(wired)]
    flow = Flow(producers, consumers, flow_type=flow_type, name=f"{node.name}-alone")
    return simulate(flow, inputs, **options)


class _Stand(ProducerNode):
    """A parent simulate_node plays from its inputs (its own next() is never called)."""

    def next(self) -> Any:
        raise StopIteration


class _Discard(ConsumerNode):
    """Reads a processor's outputs so they are published; the result holds them."""

    def consume(self, *inputs: Any) -> None:
        pass


def _last_input(scripts: Mapping[str, list[Input | Silent]], epoch_at_zero: float) -> float:
    """When the last scripted input is sent, in simulated seconds (0 for none)."""
    last = 0.0
    for items in scripts.values():
        for item in items:
            if item.at is not None:
                last = max(last, item.at)
            elif isinstance(item, Input) and item.event_ts is not None:
                last = max(last, item.event_ts - epoch_at_zero)
    return last


def _checked(compiled: CompiledFlow, inputs: Inputs, crashes: Sequence[Crash],
             until: float | None) -> dict[str, list[Input | Silent]]:
    producers = {s.name for s in compiled.specs if s.kind == "producer"}
    scripts: dict[str, list[Input | Silent]] = {}
    for name, items in inputs.items():
        if name not in producers:
            raise ValueError(f"inputs for {name!r}: not a producer of flow "
                             f"{compiled.flow_id!r} (its producers: {sorted(producers)})")
        listed = list(items)
        for index, item in enumerate(listed):
            if not isinstance(item, (Input, Silent)):
                raise ValueError(f"inputs for {name!r}: item {index} is {item!r}, "
                                 "not an Input or a Silent")
            if isinstance(item, Silent) and index != len(listed) - 1:
                raise ValueError(f"inputs for {name!r}: a Silent must be the last item")
            if isinstance(item, Silent) and until is None:
                raise ValueError(f"inputs for {name!r}: a producer that goes silent never "
                                 "ends its stream; give simulate an until")
        scripts[name] = listed
    for crash in crashes:
        spec = compiled.spec(crash.node)
        if not spec.parents:
            raise ValueError(f"crash of {crash.node!r}: a producer's crash is its inputs "
                             "stopping (Silent); crashes are of nodes with inputs")
        if not 0 <= crash.replica < spec.nb_tasks:
            raise ValueError(f"crash of {crash.node!r}: replica {crash.replica} of "
                             f"{spec.nb_tasks}")
    return scripts


class _SimBroker(MemoryBroker):
    """The in-process broker on the scheduler's clock, recording every message stored
    (the run's outputs) and redelivering what the script marks."""

    def __init__(self, scheduler: Scheduler) -> None:
        super().__init__(clock=scheduler.time.monotonic, duplicate_window=120.0,
                         max_payload=MAX_PAYLOAD,
                         condition=lambda lock: SimCondition(lock, scheduler))
        self.time = scheduler.time
        self.outputs: dict[str, list[Output]] = {}
        self.by_lineage: dict[tuple[str, str, int], Output] = {}
        self.by_seq: dict[tuple[str, int], Output] = {}
        self.redeliver_next = False
        self.redelivered: set[tuple[ChannelId, int]] = set()

    def publish(self, envelope: Envelope) -> Accepted | Rejected:
        outcome = super().publish(envelope)
        if (envelope.kind != "data" or not isinstance(outcome, Accepted)
                or outcome.duplicate):
            return outcome
        decoded = decode_envelope(envelope.data)
        node = envelope.channel.node
        output = Output(node, decoded.get("message"), decoded.get("event_ts"),
                        str(decoded["trace_id"]), int(decoded["seq"]), outcome.stream_seq,
                        self.time.now)
        self.outputs.setdefault(node, []).append(output)
        self.by_lineage[(node, output.trace_id, output.seq)] = output
        self.by_seq[(node, outcome.stream_seq)] = output
        if self.redeliver_next:
            self.redeliver_next = False
            self.redelivered.add((envelope.channel, outcome.stream_seq))
        return outcome

    def fetch(self, sub: SubscriptionId) -> tuple[int, int, bytes, str | None] | None:
        fetched = super().fetch(sub)
        if fetched is not None and fetched[1] == 1 and sub.kind == "data" and (
                (sub.channel, fetched[0]) in self.redelivered):
            self.lapse(sub, fetched[0])  # its first lease ends at once: delivered again
        return fetched


class _Played(ProducerNode):
    """A producer that sends its script: each input at its time, stamped with its
    event time."""

    def __init__(self, name: str, items: list[Input | Silent], run: _Run) -> None:
        super().__init__(name=name)
        self.items, self.run = items, run
        self.index, self.repeat, self.previous_at = 0, False, 0.0

    def next(self) -> Any:
        scheduler, run = self.run.scheduler, self.run
        if self.repeat:  # the second send of a duplicate
            item = self.items[self.index - 1]
            assert isinstance(item, Input)
            self.repeat = False
            return self._send(item)
        if self.index >= len(self.items):
            raise StopIteration
        item = self.items[self.index]
        self.index += 1
        if isinstance(item, Silent):
            scheduler.sleep_until(self.previous_at if item.at is None else item.at)
            while not run.stopping:  # no more messages, and no end of stream
                scheduler.wait(None)
            raise StopIteration
        at = item.at
        if at is None:
            at = (self.previous_at if item.event_ts is None
                  else item.event_ts - scheduler.time.epoch_at_zero)
        while scheduler.time.now < at and not run.stopping:
            scheduler.wait(at)
        if run.stopping:
            raise StopIteration
        self.previous_at = max(self.previous_at, at)
        self.repeat = item.duplicate
        return self._send(item)

    def _send(self, item: Input) -> Any:
        if item.event_ts is not None:
            self.context.set_event_timestamp(item.event_ts)
        self.run.broker.redeliver_next = item.redeliver
        return item.message


class _Replica:
    """One replica's current process: its task, messenger and what it did."""

    def __init__(self, run: _Run, spec: NodeSpec, replica: int, task: Task,
                 messenger: _SimMessenger, generation: int) -> None:
        self.run, self.spec, self.replica = run, spec, replica
        self.task, self.messenger, self.generation = task, messenger, generation
        self.crashed_at: float | None = None

    @property
    def key(self) -> str:
        key = f"{self.spec.name}[{self.replica}]"
        return key if self.crashed_at is None else f"{key}~{self.generation + 1}"

    def stop(self) -> None:
        """Quiesce it, as the engine does on Ctrl-C (RUN-030)."""
        if self.crashed_at is None and self.task.stats.outcome == "running":
            self.task.quiesce()


class _SimMessenger(NATSMessenger):
    """The messenger every run uses, noting the groups it hands out and acknowledges,
    and dying where its Crash says."""

    def __init__(self, *args: Any, run: _Run, replica_run: list[_Replica],
                 crash: Crash | None, **options: Any) -> None:
        super().__init__(*args, **options)
        self.run, self.replica_run, self.crash = run, replica_run, crash
        self.handed = 0
        self.current: tuple[dict[str, Any], int, float] | None = None

    def receive_message(self) -> dict[str, Any]:
        entries = super().receive_message()
        if any(e is not None and (e["is_stop_signal"] or e["is_abort"])
               for e in entries.values()):
            return entries
        crash = self.crash
        if crash is not None and self.handed == crash.after:
            self.run.crashed(self.replica_run[0], crash)  # never returns
        self.handed += 1
        outputs = self.run.broker.outputs.get(self.node_name, [])
        self.current = (entries, len(outputs), self.run.scheduler.time.now)
        return entries

    def in_hand(self) -> list[str]:
        """The deliveries of the group being processed, as '<parent>:<stream_seq>'."""
        group = self._group
        return [] if group is None else [f"{h.parent}:{h.delivery.stream_seq}"
                                         for h in group.handles]

    def ack_inputs(self) -> None:
        current, self.current = self.current, None
        super().ack_inputs()
        if current is None:
            return
        entries, first, at = current
        published = self.run.broker.outputs.get(self.node_name, [])[first:]
        inputs = {parent: self.run.given(parent, entry) for parent, entry in entries.items()}
        group = Group(self.node_name, self.replica_id, inputs, list(published), at)
        self.run.groups.setdefault(self.node_name, []).append(group)


class _Run:
    """The simulated run: its broker, replicas and what they did."""

    def __init__(self, compiled: CompiledFlow, scheduler: Scheduler, ack_wait: float,
                 max_retries: int, eos_quiescence_ms: int,
                 crashes: dict[tuple[str, int], Crash], restart_after: float) -> None:
        self.compiled, self.scheduler = compiled, scheduler
        self.ack_wait, self.max_retries = ack_wait, max_retries
        self.eos_quiescence_ms = eos_quiescence_ms
        self.crashes, self.restart_after = crashes, restart_after
        self.broker = _SimBroker(scheduler)
        self.backends: list[MemoryMessagingBackend] = []
        self.replicas: list[_Replica] = []
        self.groups: dict[str, list[Group]] = {}
        self.deaths: dict[str, list[ProcessDeath]] = {}
        self.stopping = False
        self.stopped_by = "until"
        self._provision()

    def _backend(self) -> MemoryMessagingBackend:
        made = MemoryMessagingBackend(self.broker, flow_id=self.compiled.flow_id,
                                      run_id=RUN_ID)
        made.start()
        self.backends.append(made)
        return made

    def _provision(self) -> None:
        """Every stream with the durables its readers need, as provisioning makes
        them before any replica starts."""
        compiled, admin = self.compiled, self._backend()
        admin.ensure_dead_letters("provision")
        profile = LIVE_LATEST if compiled.flow_type == REALTIME else RELIABLE_WORK
        for spec in compiled.specs:
            if not spec.publishes:
                continue
            channel = ChannelId(compiled.flow_id, RUN_ID, spec.name)
            required = [SubscriptionId("eos-anchor", channel, "eos")]
            for child in compiled.specs:
                if spec.name not in child.parents:
                    continue
                replicas: Iterable[int | None] = (
                    range(child.nb_tasks) if child.partitioned else (None,))
                required += [SubscriptionId(child.name, channel, "data", r) for r in replicas]
            # As the flow's provisioning sizes a REALTIME stream.
            buffer = realtime_buffer_for(spec.nb_tasks, [
                len(child.parents) for child in compiled.specs if spec.name in child.parents])
            admin.ensure_channel(ChannelSpec(channel, profile, required=tuple(required),
                                             realtime_buffer=buffer), "provision")

    def start(self, spec: NodeSpec, replica: int, items: list[Input | Silent] | None,
              generation: int = 0) -> None:
        """Start a replica's process (an actor), its node a fresh copy."""
        node: Node = (_Played(spec.name, items, self) if items is not None
                      else _copy(spec.name, self.compiled.nodes[spec.name]))
        slot: list[_Replica] = []
        messenger = _SimMessenger(
            SimpleNamespace(name=spec.name, codecs=getattr(node, "codecs", ()),
                            pack=getattr(node, "pack", False)),
            list(spec.parents), "memory://simulation",
            self.compiled.flow_id, self.compiled.flow_type, RUN_ID, replica_id=replica,
            ack_wait=self.ack_wait, max_retries=self.max_retries,
            eos_quiescence_ms=self.eos_quiescence_ms, nb_tasks=spec.nb_tasks,
            partition_by=spec.partition_by, plan=spec.plan, backend=self._backend(),
            clock=self.scheduler.time.monotonic, epoch=self.scheduler.time.wall,
            run=self, replica_run=slot,
            crash=None if generation else self.crashes.get((spec.name, replica)))
        context = RuntimeContext(messenger, spec.name, parents=spec.parents,
                                 publishes=spec.publishes, replica_id=replica,
                                 nb_tasks=spec.nb_tasks, flow_id=self.compiled.flow_id,
                                 run_id=RUN_ID, broker_url="memory://simulation")
        task = task_for(node, messenger, context)
        replica_run = _Replica(self, spec, replica, task, messenger, generation)
        slot.append(replica_run)
        self.replicas.append(replica_run)
        self.scheduler.spawn(f"{spec.name}[{replica}]", task.run)

    def crashed(self, replica_run: _Replica, crash: Crash) -> None:
        """The replica dies where it stands; its restart is scheduled."""
        now = self.scheduler.time.now
        replica_run.crashed_at = now
        held = replica_run.messenger.in_hand()
        self.deaths.setdefault(replica_run.spec.name, []).append(ProcessDeath(
            f"{replica_run.spec.name}[{replica_run.replica}]", None,
            "crashed (simulated)", now, held, crash.restart))
        if crash.restart:
            spec, replica = replica_run.spec, replica_run.replica
            generation = replica_run.generation + 1
            self.scheduler.spawn(f"{spec.name}[{replica}] restart",
                                 lambda: self._restart(spec, replica, now + self.restart_after,
                                                       generation))
        self.scheduler.freeze()

    def _restart(self, spec: NodeSpec, replica: int, at: float, generation: int) -> None:
        self.scheduler.sleep_until(at)
        if not self.stopping:
            self.start(spec, replica, None, generation)

    def live(self) -> bool:
        return any(a.state not in ("done", "frozen") for a in self.scheduler.actors)

    def given(self, parent: str, entry: Any) -> Output | list[Output] | None:
        """What a group gave its node for parent, as the parent published it."""
        if entry is None:
            return None
        broker = self.broker
        if isinstance(entry, CollectEntry):
            by_time = {o.event_ts: o for o in broker.outputs.get(parent, [])}
            return [by_time.get(t) or Output(parent, m, t, "", 0, 0, 0.0)
                    for m, t in zip(entry.message, entry.event_ts, strict=True)]
        found = broker.by_lineage.get((parent, str(entry.trace_id), int(entry.seq)))
        return found or Output(parent, entry.message, entry.event_ts, str(entry.trace_id),
                               int(entry.seq), 0, 0.0)

    def result(self) -> SimulationResult:
        result = SimulationResult(outputs=dict(self.broker.outputs),
                                  groups=self.groups, seconds=self.scheduler.time.now)
        for actor in self.scheduler.actors:
            if actor.error is not None:
                result.errors[actor.name] = actor.error
        for replica_run in self.replicas:
            messenger, name = replica_run.messenger, replica_run.spec.name
            for entry in messenger.terminal_entries():
                parent, _, seq = str(entry["key"]).rpartition(":")
                result.drops.append(Drop(name, parent, _drop_reason(str(entry["reason"])),
                                         self.broker.by_seq.get((parent, int(seq)))))
            if replica_run.spec.parents and replica_run.crashed_at is None:
                result.join_status[name] = messenger.join_status()
        flow_id = self.compiled.flow_id
        result.dead_letters = [decode_dead_letter(data)
                               for _, data in self.broker.dead_letters(flow_id, RUN_ID)]
        result.report = self._report()
        return result

    def _report(self) -> RunReport:
        compiled = self.compiled
        report = RunReport(compiled.flow_id, RUN_ID, compiled.flow_type,
                           "memory://simulation", seconds=self.scheduler.time.now)
        if self.stopping:
            report.outcome, report.stopped_by = "stopped", self.stopped_by
        for spec in compiled.specs:
            finals: dict[str, dict[str, Any]] = {}
            for replica_run in self.replicas:
                if replica_run.spec.name != spec.name:
                    continue
                stats = replica_run.task.stats
                snapshot = stats.snapshot()
                snapshot["join_latencies"] = list(stats.join_latencies)
                snapshot["cpu_seconds"] = None  # one process holds them all: unknown
                if replica_run.crashed_at is not None:
                    snapshot["outcome"], snapshot["error"] = "lost", "crashed (simulated)"
                finals[replica_run.key] = snapshot
            deaths = self.deaths.get(spec.name, [])
            report.nodes[spec.name] = NodeReport.from_replicas(
                spec.kind, finals, sum(d.restarted for d in deaths), deaths)
        outcomes = [o for key, n in report.nodes.items() for k, o in n.outcomes.items()
                    if "~" not in k]
        if any(o in ("failed", "lost", "aborted", "running") for o in outcomes):
            report.outcome = "failed"
        return report


def _copy(name: str, node: Node) -> Node:
    """The node as a worker process gets it: without its parents, pickled and
    unpickled, so a node that could not travel fails here as it would in a run."""
    alone = copy.copy(node)
    alone.parents = ()
    del alone.context
    try:
        made: Node = pickle.loads(pickle.dumps(alone))
    except (pickle.PicklingError, TypeError, AttributeError) as error:
        raise ValueError(f"node {name!r} cannot be sent to its worker process: {error} "
                         "(its attributes must pickle; open resources in open())") from error
    made._name = name
    return made


def _drop_reason(text: str) -> str:
    """The drop reason (DROP_REASONS) of a terminal-log entry's text."""
    if text.startswith("join late"):
        return "join_late"
    if text.startswith("join "):
        return "join_evicted"
    if text.startswith("undecodable"):
        return "undecodable"
    return "exhausted"


__all__ = ["simulate", "simulate_node"]
