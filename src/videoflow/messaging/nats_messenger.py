"""NATSMessenger: the Messenger a node's task talks to, on the MessagingBackend contract.

The transport (connection, streams, durables, prefetch, leases, settlement, publication
outcomes) is the backend's (videoflow.backends.jetstream.backend by default, the
memory adapter in tests). What is the messenger's to decide lives here -- trace and
sequence bookkeeping, join assembly, message ids, publication, checkpoints -- and in
the parts it holds, below.

The shape of one input group's life: receive_any on every parent's data and EOS
subscriptions (everything ready, in one hand-off) -> each pack expanded into its
members (videoflow.messaging.packs) -> decode_envelope -> EnvelopeEntry
(once, at this boundary) -> the assembler -> a ReadyGroup, whose entries the task gets
as they are -> the node -> its outputs published without waiting, into the window
(videoflow.messaging.messenger_window) -> once every output of the group is accepted,
every handle of the group is settled, while the node is already on its next groups.
The window drains before an end marker, a checkpoint and the task's exit.

What becomes of each delivery -- held, completed, retried, dead-lettered or
terminated (DELIV-15: given up on only against a durable record), counted as a drop --
and each parent's end of stream (its replicas' markers, when it is drained) are
videoflow.messaging.messenger_deliveries' (Deliveries). The assembler, and what becomes
of what it lets go (superseded, a collect sample no group took, a drop), are
videoflow.messaging.messenger_join's (Join). When every parent is drained the assembler
is flushed (groups with a quorum are emitted, the rest discarded per policy) and then
receive_message returns the stop entries.

Payloads over the inline limit travel by ref: the messenger publishes the envelope
carrying the ref and resolves the put by the outcome; putting, reading, releasing
(PAY-004), pinning for a dead letter (BLOB-14) and the periodic obligation
reconciliation (PAY-006) are videoflow.messaging.messenger_payloads'
(MessengerPayloads), over an obligation-keeping PayloadStore or the counter
BlobStore (RFC 0002, BLOB-5).

Partitioned consumption: each replica binds its own durables and keeps, through the
backend's admission filter, only the inputs whose partition key hashes to it
(videoflow.messaging.partitions).

Outputs -- their ids (stable across a redelivery, so the broker's duplicate window
keeps one copy), envelopes, publication inline or by ref, a replayable producer's
source offsets and the end markers -- are videoflow.messaging.messenger_outputs'
(Outputs).

A checkpoint committed with an output is written only once that output's publication
was accepted, so a restored checkpoint's output is already on the broker when its
covered group is acknowledged.

With a durable, shared ledger (NATS KV) the retry budget is counted in the ledger, not
by the broker: the durables are bound with max_deliver -1 (provision with ledger_budget
to match), and a worker-fatal failure never spends an attempt.

Over ~700 lines, as one class: NATSMessenger is the reference's Messenger plus the
observation API a run reads (about thirty public methods and their docstrings). The
work is in its parts; what stays is the receive loop, which moves with the assembler's
state, and each method's wiring to the parts.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from math import ceil, inf, isfinite
from typing import Any, Final

import msgspec

from videoflow import clock
from videoflow.backends.messaging import (
    ChannelId,
    Completed,
    Delivery,
    Envelope,
    Known,
    MessagingBackend,
    SubscriptionId,
    SubscriptionSpec,
    Unknown,
)
from videoflow.backends.payload import PayloadStore
from videoflow.core.compiler import NodePlan, node_plan
from videoflow.core.constants import BATCH, REALTIME
from videoflow.core.context import event_time
from videoflow.core.credit import (
    PRODUCER_WINDOW,
    REALTIME_BURST,
    RECEIVE_PREFETCH,
    WINDOW_GROUPS,
)
from videoflow.core.engine import (
    CLOCK_OFFSETS_METADATA_KEY,
    STOP_CONTROL,
    STOP_QUIESCE,
    Messenger,
)
from videoflow.core.naming import (
    durable_name_for,
    partitioned_durable_name_for,
    subject_for,
)
from videoflow.core.runtime import FlowRuntime
from videoflow.errors import CodecError, PayloadMissing, WireError
from videoflow.messaging.clock_estimates import RunningCorrection
from videoflow.messaging.clock_learning import ClockLearning
from videoflow.messaging.freshness import Freshness
from videoflow.messaging.grouping import (
    EnvelopeEntry,
    ReadyGroup,
)
from videoflow.messaging.join_alignment import Deferred
from videoflow.messaging.messenger_deliveries import (
    DROP_REASONS,
    Deliveries,
    end_entry,
)
from videoflow.messaging.messenger_join import Join
from videoflow.messaging.messenger_outputs import Outputs, require_durable_ledger
from videoflow.messaging.messenger_payloads import MessengerPayloads
from videoflow.messaging.messenger_window import PublicationFailed, PublishWindow
from videoflow.messaging.packs import PackMemberToken
from videoflow.messaging.partitions import Partition
from videoflow.messaging.publication import PublicationStats
from videoflow.messaging.tracing import GroupTrace, NodeTracing, settled
from videoflow.wire.offload import BlobStore
from videoflow.wire.serialization import ENVELOPE_VERSION, decode_envelope

logger = logging.getLogger(__name__)

POLL_SECONDS: Final = 0.05
"""How long one receive waits before the loop looks at timeouts and drains again."""

RECEIVE_BATCH: Final = 256
"""The most deliveries one receive takes: everything ready, in one hand-off."""

WINDOW_POLL_SECONDS: Final = 0.01
"""How long one receive waits while outputs are in flight, so a group's inputs are
gathered for settlement soon after its outputs' receipts arrive (they then linger up to
SETTLE_LINGER_SECONDS for others, and a receive waits no longer than that either).
Polled every 2 ms, and while any settlement was unanswered, a node idling between
inputs woke 500 times a second."""


DEPTH_SECONDS: Final = 0.05
"""How much of the node's work a replica parks ahead: its backend's receive depth
follows the node's time per group, so a slow node holds few inputs a competing replica
could be processing, and a fast one keeps a deep prefetch."""

FIRST_DEPTH: Final = 4
"""The receive depth a replica binds with, before it has timed a group: it leases that
few until it knows how fast its node is. Bound with the full prefetch, a sink taking
0.5 s a message leased all 60 of a stream at once, 30 s of its work that a second
replica could not take."""

SETTLE_WITHIN_SECONDS: Final = 0.1
"""How long a processed input's settlement may wait for the broker, at most, unless
the node is idle (then SETTLE_LINGER_SECONDS): a node whose groups take longer has its
last group's outputs confirmed and its inputs settled before it starts the next. Left
to gather until the batch filled, a sink taking 0.5 s a message settled none for 24 s,
and a crash then would have redone every one."""

CORRECT_SECONDS: Final = 0.25
"""How often a join with clock_correction='running' looks whether to move a correction."""

LEARN_PASSES: Final = 64
"""The most correction steps (each with its regrouping) a learning join takes on one
look: a 20 ms offset at 2 ms a step takes ten; estimates that kept calling for steps
beyond (flipping between two frame periods, say) are left to the next look."""

CONFIRM_SECONDS: Final = 0.02
"""How long such a node waits, before its next group, for its last group's outputs to
be confirmed (a round trip; what is later is settled before the group after)."""

@dataclass(slots=True)
class _Handle:
    """What the assembler holds for one delivery, opaquely: the messenger settles it
    when the assembler lets it go (messenger_join) or the task is done with its
    group."""

    parent: str
    sub: SubscriptionId
    delivery: Delivery
    blob_ref: str | None = None
    arrived: float = 0.0  # clock.monotonic() when it reached the assembler
    event_ts: float | None = None  # as the join reads it (corrected): its clock estimator's
    clock_epoch: int = 0  # the parent's correction epoch it was decoded in (running)
    clock_offset: float = 0.0  # seconds the join added to its event time (clock_offsets)
    entry: Any = None  # the EnvelopeEntry the assembler holds (a learning join adds it again)
    stamp: float | None = None  # its event time as stamped, before any correction


def _saying_corrections(metadata: dict[str, Any] | None, handles: Sequence[_Handle]
                        ) -> dict[str, Any] | None:
    """An output's metadata with the clock corrections applied to its group's members
    under CLOCK_OFFSETS_METADATA_KEY (none said when none was non-zero); the node's own
    dict is not changed."""
    applied = {h.parent: h.clock_offset for h in handles if h.clock_offset}
    if not applied:
        return metadata
    return {**(metadata or {}), CLOCK_OFFSETS_METADATA_KEY: applied}


def _pack_of(handles: Sequence[_Handle]) -> tuple[object, ...] | None:
    """The inbound pack a one-input group came in, as the attempt of its message
    (subscription, stream_seq, attempt, generation); None for an input alone."""
    if len(handles) != 1:
        return None
    token = handles[0].delivery.token
    if not isinstance(token, PackMemberToken):
        return None
    return token.subscription, token.stream_seq, token.attempt, token.generation


def _blob_ref(delivery: Delivery) -> str | None:
    """The payload reference of a delivery's envelope; None when it has none, or its
    bytes do not decode (nothing of it is held then)."""
    try:
        ref = decode_envelope(delivery.data).get("blob_ref")
    except (WireError, CodecError):
        return None
    return ref if isinstance(ref, str) else None


class NATSMessenger(Messenger):
    """A node's messenger: see the module docstring.

    Arguments:
        node: the node (anything with a ``name``).
        parent_names: its real parents, by name; empty for a producer.
        nats_url: the broker, for the default backend.
        flow_id / flow_type / run_id: the run.
        blob_store / blob_readers: the counter store (RFC 0002), used when no
            payload_store is given, and how many reads each payload this node puts
            there is owed (BLOB-5): counted down in the run ledger by each reader once
            its settlement is confirmed, the last deleting it. None: TTL-only. The
            count needs a ledger the readers share (a NATS KV runtime store).
        envelope_version: the wire version written; None or 3 (every version is read).
        replica_id / nb_tasks: this replica and the node's replica count.
        ack_wait / max_retries / delivery_policy: the durables' lease, the deployment's
            retry count and the node's delivery override (a dict).
        join_policy: the node's join override (a dict), over the flow type's default.
        plan: the node's NodePlan as compile_flow derived it (NodeSpec.plan): its join
            and delivery policies, and the credit and delivery cap its durables are
            bound with, as provisioning created them (MSG-017). None derives it here,
            once, from the flow type, max_retries, the two overrides above and whether
            runtime is a durable shared ledger (node_plan); with a plan, the overrides
            must be None.
        partition_by: partitioned consumption: each replica binds its own durables and
            keeps the inputs whose key hashes to it (the envelope's partition_key, else
            this field of a dict message, else the trace id).
        eos_quiescence_ms: how long a parent's data must stay quiet after its last end
            marker before it counts as drained, when the broker cannot say.
        backend: the MessagingBackend; a JetStreamMessagingBackend on nats_url if None.
        payload_store: an obligation-keeping PayloadStore: an output too large to
            travel inline (inline_threshold of the broker's max_payload) is put there
            and travels by blob_ref; an input that arrives by ref is read from it and
            this node's obligation is released once its settlement is confirmed
            (PAY-004, BLOB-14).
        blob_reader_ids: the reader obligations each put of this node's outputs
            acquires: '<child>' per competing child, '<child>/p<i>' per partitioned
            replica (the compiler derives them).
        blob_ttl_seconds: the TTL of those payloads; None for the flow type's default.
        runtime: the node's FlowRuntime ledger; a memory one if None.
        replayable: a producer whose source can replay from an offset: its outputs'
            ids are minted from their source offsets (MSGID-6), so a replay after a
            restart deduplicates at the broker, and the last accepted offset is kept in
            the ledger (resume_offset).
        prefetch_bytes: the default backend's byte budget (RUN-025).
        clock: monotonic seconds for the join's timeouts and silence backstop, which
            a step of the wall clock must not move (tests pass one).
        epoch: epoch seconds, for dead letters' timestamps and the event time of an
            input that carries none.
    """

    def __init__(
        self,
        node: Any,
        parent_names: list[str],
        nats_url: str,
        flow_id: str,
        flow_type: str,
        run_id: str,
        blob_store: BlobStore | None = None,
        replica_id: int = 0,
        ack_wait: int = 60,
        max_retries: int = 3,
        eos_quiescence_ms: int = 500,
        nb_tasks: int = 1,
        partition_by: str | None = None,
        join_policy: dict[str, Any] | None = None,
        envelope_version: int | None = None,
        blob_readers: int | None = None,
        blob_ttl_seconds: int | None = None,
        delivery_policy: dict[str, Any] | None = None,
        backend: MessagingBackend | None = None,
        payload_store: PayloadStore | None = None,
        blob_reader_ids: list[str] | None = None,
        runtime: FlowRuntime | None = None,
        replayable: bool = False,
        prefetch_bytes: int | None = None,
        *,
        plan: NodePlan | None = None,
        clock: Callable[[], float] = time.monotonic,
        epoch: Callable[[], float] = time.time,
    ) -> None:
        if envelope_version not in (None, ENVELOPE_VERSION):
            raise ValueError(f"envelope_version: this messenger writes v{ENVELOPE_VERSION} "
                             f"(every version decodes), got {envelope_version!r}")
        if blob_readers is not None and (isinstance(blob_readers, bool)
                                         or not isinstance(blob_readers, int)
                                         or blob_readers < 1):
            raise ValueError(f"blob_readers must be None or an int >= 1, got {blob_readers!r}")
        self.node_name: str = node.name
        self.parent_names = list(parent_names)
        self.flow_id, self.flow_type, self.run_id = flow_id, flow_type, run_id
        self.replica_id, self.nb_tasks = replica_id, nb_tasks
        self.partition_by = partition_by
        self.eos_quiescence = eos_quiescence_ms / 1000.0
        self.ack_wait = ack_wait
        self.clock, self.epoch = clock, epoch
        if plan is None:
            plan = node_plan(flow_type, self.parent_names, nb_tasks, partition_by is not None,
                             join_policy, delivery_policy, max_retries=max_retries,
                             ledger_budget=runtime is not None and runtime.durable_shared())
        elif join_policy is not None or delivery_policy is not None:
            raise ValueError(f"{self.node_name}: give the node's plan or its policy "
                             "overrides (join_policy, delivery_policy), not both")
        self.plan = plan
        self.delivery_policy = plan.delivery
        self.channel = ChannelId(flow_id, run_id, self.node_name)
        if backend is None:
            from videoflow.backends.jetstream.backend import JetStreamMessagingBackend
            backend = JetStreamMessagingBackend(nats_url, flow_id, run_id, flow_type,
                                                prefetch=RECEIVE_PREFETCH,
                                                byte_budget=prefetch_bytes)
            self._owns_backend = True
        else:
            self._owns_backend = False
        self.backend = backend
        backend.start()
        self.runtime = runtime or FlowRuntime.in_memory(flow_id, run_id, self.node_name,
                                                        replica_id)
        if self.runtime.epoch is None:
            self.runtime.claim_owner()
        self.replayable = replayable
        self.ledger_budget = self.runtime.durable_shared()
        self.payload_store = payload_store
        # The counter store (RFC 0002), used when no payload_store is given.
        self.blob_store = None if payload_store is not None else blob_store
        self.blob_readers = blob_readers
        self.blob_reader_ids = tuple(blob_reader_ids or ())
        self.blob_ttl_seconds = blob_ttl_seconds
        # How this node owes a release on a parent's payload (the id its parents' puts
        # acquired for it).
        self.reader_id = (self.node_name if partition_by is None
                          else f"{self.node_name}/p{replica_id}")
        self.payloads = MessengerPayloads(
            self.node_name, self.parent_names, backend, self.runtime, ack_wait,
            payload_store=payload_store, blob_store=self.blob_store,
            blob_readers=blob_readers, blob_reader_ids=self.blob_reader_ids,
            blob_ttl_seconds=blob_ttl_seconds, reader_id=self.reader_id)
        self._covered: str | None = None  # the group the restored checkpoint covers
        self.publication_stats_counter = PublicationStats()
        self._terminated = False
        self._quiesced = False
        backend.subscribe_control(self._on_stop)
        self._group: ReadyGroup | None = None
        self.last_join_latency: float | None = None  # seconds the last group waited
        # First deliveries per parent: against the parent's outputs, what never reached
        # this node (a REALTIME stream keeps only the newest).
        self.received: dict[str, int] = dict.fromkeys(self.parent_names, 0)
        # A join's redeliveries of inputs it had already acknowledged, acknowledged
        # again and not grouped (Deliveries.completed_before).
        self.redelivered_done = 0
        self._ready: deque[ReadyGroup] = deque()
        self.deliveries = Deliveries(
            self.node_name, flow_id, run_id, self.parent_names, backend, self.runtime,
            self.payloads, delivery_policy=self.delivery_policy,
            ledger_budget=self.ledger_budget, ack_wait=ack_wait,
            eos_quiescence=self.eos_quiescence, clock=epoch)
        self.failed_publications = 0  # input groups failed because an output was not
        # The outputs' traceparent headers, and spans when a tracer is configured.
        self.tracing = NodeTracing(
            self.node_name, replica_id, flow_id, run_id,
            subject_for(flow_id, run_id, self.node_name),
            {p: subject_for(flow_id, run_id, p) for p in self.parent_names})
        self._trace: GroupTrace | None = None  # the trace of the group handed out
        self.window = PublishWindow(
            self.node_name, backend, self.deliveries, self.publication_stats_counter,
            ack_wait, on_failed=self._publication_failed,
            max_groups=WINDOW_GROUPS if self.parent_names else PRODUCER_WINDOW)
        self.outputs = Outputs(
            self.node_name, self.channel, flow_type, replica_id, nb_tasks, backend,
            self.runtime, self.payloads, self.deliveries, self.window,
            self.publication_stats_counter, ack_wait, replayable=replayable,
            payload_store=payload_store, blob_reader_ids=self.blob_reader_ids,
            tracing=self.tracing, codecs=tuple(getattr(node, "codecs", ())),
            packs=bool(getattr(node, "pack", False)))
        # A processor's small outputs go in the packs its inputs came in (PublishWindow).
        self._packs_out = self.outputs.packs and len(self.parent_names) == 1
        self._flushed = False
        # Called between waits for input (the task's progress report): a node waiting
        # on its parents still says what it has done, not what it had at its last input.
        self.on_wait: Callable[[], None] | None = None
        self._data_subs: dict[str, SubscriptionId] = {}
        self._eos_subs: dict[SubscriptionId, str] = {}
        self._all_subs: list[SubscriptionId] = []
        self._idle = True  # the last receive took nothing
        self._handed_at = 0.0  # when the group last returned was handed to the node
        self._group_seconds: float | None = None  # the node's mean time per group
        self._depth = RECEIVE_PREFETCH  # the receive depth last asked of the backend
        self._groups_timed = 0  # groups _timed_group folded into the mean
        self._collected = 0.0  # collect samples handed out, per collect parent
        self.reconciled = 0  # obligations reconciliation cancelled (PAY-006)
        self.join: Join | None = None  # a producer has no inputs to join
        # A one-parent REALTIME node works through a burst only as far as it keeps up
        # (videoflow.messaging.freshness; a join keeps its own bounds), and its receive
        # takes all its parent's stream keeps, the newest among it: a shallower one
        # would be handed the oldest.
        fresh = flow_type == REALTIME and len(self.parent_names) == 1
        self.freshness = Freshness() if fresh else None
        self._least_depth = REALTIME_BURST if fresh else 1
        if self.parent_names:
            self._set_depth(FIRST_DEPTH)  # before the bind: a bound durable fetches at once
            self._bind(partition_by is not None)
            # A store with a budget (shared memory) says whose producers wait for
            # room: such a parent is held back, not silent.
            self.join = Join(self.node_name, self.parent_names, plan.join, backend,
                             self.deliveries, self._data_subs, clock=clock, epoch=epoch,
                             budget_waiting=self.payloads.budget_waiting(),
                             payload_shares=self.payloads.budget_shares())
        # JoinPolicy.clock_offsets: each parent's event times as corrected, from decode on.
        self._clock_offsets: dict[str, float] = (
            dict(plan.join.clock_offsets) if self.parent_names and plan.join is not None
            else {})
        # clock_correction='running': the corrections follow the join's estimate; the
        # applied ones are the dict decode reads.
        self._running: RunningCorrection | None = None
        if self.join is not None and self.join.clocks is not None and (
                plan.join.clock_correction == "running"):
            self._running = RunningCorrection(plan.join.clock_offsets,
                                              plan.join.clock_step_ms / 1000.0,
                                              plan.join.clock_limit_ms / 1000.0)
            self._clock_offsets = self._running.applied
            # Its first groups wait until the corrections have caught up.
            self.join.learning = ClockLearning(max(1, plan.join.max_pending // 2))
        self._corrected_at = -inf
        self.clock_learned = ""  # how a running correction's learning ended (ClockLearning)

    def _bind(self, partitioned: bool) -> None:
        # The plan's credit and delivery cap, as provisioning created the durables
        # (MSG-017). With a durable, shared ledger the retry budget is counted there, so
        # the broker never strands a message and a worker-fatal redelivery never counts
        # (STREAM-15 / D11): max_deliver is -1 then, as provisioning with ledger_budget
        # makes it.
        credit, max_deliver = self.plan.credit, self.plan.max_deliver
        for parent in self.parent_names:
            parent_channel = ChannelId(self.flow_id, self.run_id, parent)
            data = SubscriptionId(self.node_name, parent_channel, "data",
                                  self.replica_id if partitioned else None)
            eos = SubscriptionId(self.node_name, parent_channel, "eos")
            if partitioned:
                # Every replica's durable sees every message; each keeps only its own
                # partition, and the backend acknowledges the rest at once so they never
                # hold its ack window. Set before the bind: a bound subscription starts
                # fetching at once, and what arrived before the filter was kept.
                assert self.partition_by is not None
                share = Partition(self.partition_by, self.nb_tasks, self.replica_id)
                if not self.backend.set_admission(data, share.admits):
                    raise ValueError(f"{self.node_name}: the backend cannot filter a "
                                     "partitioned node's inputs (set_admission)")
            self.backend.ensure_subscription(
                SubscriptionSpec(data, self.ack_wait, max_deliver, credit), "bind")
            self.backend.ensure_subscription(SubscriptionSpec(eos, self.ack_wait, -1, 4), "bind")
            self._data_subs[parent] = data
            self._eos_subs[eos] = parent
        self._all_subs = [*self._data_subs.values(), *self._eos_subs]

    # ------------------------------------------------------------------ termination

    def _on_stop(self) -> None:
        self._terminated = True

    def quiesce(self) -> None:
        """Stop admitting input: what the backend prefetched goes back to the broker at
        once (RUN-030); what the task holds still settles. Idempotent. A quiesced
        process publishes no end of stream: its replacement continues the stream
        (stop_reason is STOP_QUIESCE)."""
        self._quiesced = True
        self.backend.stop_receiving()

    def check_for_termination(self) -> bool:
        # Asked between a producer's next() calls: the outputs just handed over go
        # out now, and a published stop is read, on this thread (catch_up).
        self.backend.catch_up()
        return self._terminated or self._quiesced

    def stop_reason(self) -> str | None:
        """STOP_QUIESCE once quiesced, else STOP_CONTROL once the flow-wide stop was
        published, else None."""
        if self._quiesced:
            return STOP_QUIESCE
        return STOP_CONTROL if self._terminated else None

    # ---------------------------------------------------------------------- health

    def join_status(self) -> dict[str, Any]:
        """What the join is doing (RUN-006): groups waiting for a member, how long the
        oldest has waited, and whether the policy would ever give up on them
        (missing='wait' never does: such a node is waiting, not progressing)."""
        if self.join is None:
            return {"waiting_groups": 0, "oldest_wait_seconds": 0.0, "gives_up": True}
        return self.join.status()

    def alignment_state(self) -> tuple[dict[str, float], dict[str, str], dict[str, str]]:
        """A time join's alignment, for the run's report and view: per parent the
        seconds it was held back so far, the parents held back now with why, and the
        parents the oldest incomplete group waits for with why (Join.waiting_why); all
        empty for a node without a join."""
        join = self.join
        if join is None:
            return {}, {}, {}
        held_now = {} if join.alignment is None else dict(join.alignment.held)
        return (join.held_back_seconds(), held_now,
                join.waiting_why(join.assembler.waiting_for()))

    def clock_estimates(self) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
        """A time join's per-parent clock offsets (ClockEstimator.estimates, as dicts)
        and its advice in words, per parent; both empty for a node without a time
        join."""
        clocks = None if self.join is None else self.join.clocks
        if clocks is None:
            return {}, {}
        estimates = clocks.estimates()
        return {p: e.to_dict() for p, e in estimates.items()}, clocks.advice(estimates)

    def payload_share(self) -> dict[str, Any] | None:
        """This replica's bytes in a budgeted payload store against its share
        (TaskStats.payload), None where it writes none there."""
        return self.payloads.own_share()

    @property
    def watermark_lags(self) -> dict[str, float]:
        """A time join's parents' watermark lags behind the most advanced one, seconds,
        as last sampled, per parent heard from; empty for any other node."""
        return {} if self.join is None else self.join.watermark_lags

    @property
    def watermark_lag_max(self) -> dict[str, float]:
        """The most each parent's watermark lag was seen (watermark_lags)."""
        return {} if self.join is None else self.join.watermark_lag_max

    def subscription_status(self) -> dict[str, Known[Any] | Unknown]:
        """Per parent, the backend's observation of this node's data subscription
        (available, leased, unresolved, dropped), or Unknown when it could not be
        read (MSG-012: unresolved is never 'all done')."""
        parents = list(self._data_subs)
        seen = self.backend.observe_subscriptions([self._data_subs[p] for p in parents])
        return dict(zip(parents, seen, strict=True))

    def durables(self) -> dict[str, str]:
        """Per parent, the name of the data durable this replica reads: the node's
        replicas share one (competing consumers), or each has its own (a partitioned
        node's). What its broker count is a count of."""
        return {parent: durable_name_for(self.node_name, parent) if sub.replica is None
                else partitioned_durable_name_for(self.node_name, parent, sub.replica)
                for parent, sub in self._data_subs.items()}

    def pending_observation(self) -> Known[int] | Unknown:
        """Messages waiting for this node across its parents -- prefetched here, held
        in incomplete groups, or still on the broker (available, leased, unresolved) --
        or Unknown as soon as any parent's broker count is unknown: a total that
        silently omitted one parent is the 'zero pending' that calls a stalled node
        idle."""
        total, unknown = self._pending()
        return unknown if unknown is not None else Known(total)

    def observe_work(self) -> tuple[Known[int] | Unknown, dict[str, Known[Any] | Unknown]]:
        """pending_observation and subscription_status from one read of the broker (a
        progress report that carries both asks once)."""
        seen = self.subscription_status()
        total, unknown = self._pending(seen)
        return (unknown if unknown is not None else Known(total)), seen

    def pending_count(self) -> int:
        """pending_observation's total; a parent whose broker count failed contributes
        only what is held here (use pending_observation where that matters)."""
        return self._pending()[0]

    def _pending(self, seen: dict[str, Known[Any] | Unknown] | None = None,
                 ) -> tuple[int, Unknown | None]:
        """(what is counted -- held here and on the broker for every parent whose
        count was read --, the first parent's Unknown, if any), from seen when given,
        else from a fresh subscription_status."""
        total, unknown = self._local_pending(), None
        for observed in (self.subscription_status() if seen is None else seen).values():
            if isinstance(observed, Known):
                value = observed.value
                total += value.available + value.leased + value.unresolved
            elif unknown is None:
                unknown = observed
        return total, unknown

    def _local_pending(self) -> int:
        parked = sum(self.backend.prefetched(sub) for sub in self._data_subs.values())
        join = self.join
        return parked + (0 if join is None else
                         join.assembler.pending_count() + join.deferred_count())

    # ---------------------------------------------------------------------- outputs

    def set_output_event_timestamp(self, value: float) -> None:
        """The event time (epoch seconds) of the next output.

        Raises:
            ValueError: value is not a finite number (NaN, an infinity, a str, None,
                a bool): no time join downstream could place it.
        """
        self.outputs.event_ts = event_time(value, "set_output_event_timestamp")

    def set_output_source_offset(self, offset: int) -> None:
        """A replayable producer: the source offset (MSGID-6) its next output's id is
        minted from, when the source has its own (a stream's sequence), instead of
        the last one + 1.

        Raises:
            ValueError: an offset below 1, or not a replayable producer.
        """
        if not self.outputs.replayable:
            raise ValueError(f"node {self.node_name!r} is not a replayable producer")
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 1:
            raise ValueError(f"a source offset must be an int >= 1, got {offset!r}")
        self.outputs.given_offset = offset

    def accepted_outputs(self) -> int:
        """A replayable producer's outputs accepted by the broker in this process,
        counted in the order they were published -- every one answered so far: the
        window resolves what it holds answered first (it is otherwise resolved only as
        the next outputs go out, and a source that waits for records while holding as
        many unacknowledged as its durable allows would wait out the broker's ack_wait,
        then be handed them all again).

        Raises:
            PublicationFailed: an earlier output was not published (as publish_message).
        """
        self.window.advance()
        return self.outputs.accepted_outputs

    def set_output_partition_key(self, value: Any) -> None:
        self.outputs.partition_key = value

    def publish_message(self, message: Any, metadata: dict[str, Any] | None = None) -> None:
        """Publish one output without waiting for its receipt: it is in flight in the
        window (messenger_window) and resolved in order while the node goes on; its
        group's inputs are settled once every output of the group is accepted. Its
        trace id and sequence carry its input group's forward (a producer mints them);
        its event time is the one set for it, else the group's; its msg_id is stable
        across a redelivery of the group, so the broker's duplicate window keeps one
        copy (messenger_outputs). An output carrying a checkpoint is waited for:
        everything before it resolves first, and the checkpoint commits once it is
        accepted (RUN-022).

        Raises:
            PublicationFailed: a producer's earlier output, or this checkpointed one,
                was refused for good or still unknown at its deadline.
            DurabilityUnavailable: metadata carries a checkpoint this runtime cannot
                keep (RUN-022): nothing was published.
        """
        group = self._group
        if self._clock_offsets and group is not None:
            metadata = _saying_corrections(metadata, group.handles)
        self.outputs.publish(message, metadata, group, self.last_input_key(), self._trace)

    def publish_external(self, subject: str, data: bytes, headers: dict[str, str],
                         msg_id: str | None = None) -> None:
        """Publish data on a subject outside the flow (one a stream captures) as an
        output of the group last returned: in flight once this returns, with the
        group's trace continued, and the group's inputs settled only once it is
        accepted -- for any node, a consumer included (a sink writing a plain
        subject). A refusal fails the group, as for an output.

        Arguments:
            subject: the subject; headers: sent with it; msg_id: its Nats-Msg-Id,
                stable across a redelivery of the group for the broker to deduplicate.
        """
        self.window.send(Envelope(self.channel, "data", data, msg_id,
                                  self.output_traceparent(), subject=subject,
                                  headers=headers), BATCH)

    def output_traceparent(self) -> str | None:
        """The W3C traceparent of something the node sends itself for the group last
        returned (a sink writing outside videoflow): the group's trace continued with
        a new span id, as an output's header would be; None with tracing off or no
        group."""
        group = self._group
        if group is None:
            return None
        traceparent, span = self.tracing.output(group.trace_id, self._trace, "", False)
        self.tracing.published(span, 0)  # a span (with a tracer) ends at the hand-out
        return traceparent

    def _publication_failed(self, failure: PublicationFailed) -> None:
        self.failed_publications += 1

    def drain(self) -> None:
        """Wait until every output in flight is resolved and every settlement started
        is answered (before an end marker, a checkpoint, and the task's exit).

        Raises:
            PublicationFailed: a producer's output was not published.
        """
        self.window.drain()
        self.outputs.commit_offset(force=True)

    def publish_stop_signal(self) -> None:
        """This replica's end of stream, on the channel's EOS subject, once every output
        before it is resolved: never dropped (published as BATCH publishes, whatever
        the flow type).

        Raises:
            PublicationFailed: an output in flight, or the marker, was not published.
        """
        self.drain()
        self.outputs.publish_end(is_abort=False, error=None)

    def publish_abort(self, error: Any, *, origin: str | None = None) -> None:
        """An abnormal end of stream carrying why this node died, on the same EOS
        subject, so it reaches every downstream replica; its msg_id differs from the
        clean marker's, so an aborted node is never mistaken for a finished one. What
        is in flight resolves first; an output of it that fails does not keep the
        abort from going out.

        Arguments:
            error: the exception, or the error record ({'type', 'message'}) of an
                aborted parent being relayed.
            origin: the node that died first, when relaying a parent's abort; this
                node when None.
        """
        try:
            self.drain()
        except PublicationFailed:
            pass  # the node is dying anyway: its abort says so
        self.outputs.publish_end(is_abort=True, error=error, origin=origin)

    @property
    def publication_stats(self) -> dict[str, int]:
        """Publication outcomes by kind (accepted, duplicate, unknown, dropped, rejected)."""
        return self.publication_stats_counter.as_dict()

    # ------------------------------------------------------------------ checkpoints

    def checkpoint(self, state: bytes) -> None:
        """One ledger write: the node's state and the group it was updated with
        (last_input_key), so a replacement's restored state and the inputs it must
        still see describe the same committed prefix (RUN-022). A redelivery of that
        group to the replacement is acknowledged without reaching the node again. The
        immediate form, for a node whose input produces no output; one with an output
        passes its checkpoint to publish_message (CHECKPOINT_METADATA_KEY).

        Raises:
            DurabilityUnavailable: the ledger dies with the process (RUN-022).
            SupersededOwner: a newer owner of this node replica claimed (RUN-023).
            ValueError: no input group was received to checkpoint with.
        """
        key = self.last_input_key()
        if key is None:
            raise ValueError(f"{self.node_name}: checkpoint needs the input group it "
                             "covers; none was received")
        require_durable_ledger(self.runtime, self.node_name)
        # The groups before this one are settled first: a replacement must not see
        # again what the committed state already holds (RUN-022).
        self.window.drain()
        self.runtime.checkpoint(state, key)

    def resume_offset(self) -> int:
        """For a replayable producer, the last accepted source offset in the ledger, so
        the source resumes from the next one after a restart (MSGID-6); 0 when nothing
        was accepted, or for a live node."""
        return self.runtime.source_offset() if self.replayable else 0

    def restore_checkpoint(self) -> bytes | None:
        """The last checkpointed state, or None; its group is remembered as covered, so
        a redelivery of it is acknowledged, not re-applied."""
        found = self.runtime.restore_checkpoint()
        if found is None:
            return None
        self._covered = found.covered_group
        return found.state

    # ----------------------------------------------------------------------- inputs

    def receive_message(self) -> dict[str, Any]:
        """Block until a complete input group is ready, or every parent ended.

        Returns:
            One entry per parent (see Messenger.receive_message), as
            {parent: entry}: the EnvelopeEntry the assembler kept, a CollectEntry for a
            collect window, None for a parent missing from a quorum emission -- each
            read by key (entry["message"]).
            After every parent ended and everything of theirs was handed out, an
            EndEntry per parent: is_stop_signal True, or is_abort True with
            abort_origin and abort_error for a parent that died.

        Raises:
            ValueError: called on a producer (it has no inputs).
        """
        join = self.join
        if join is None:
            raise ValueError(f"{self.node_name} is a producer: it has no inputs")
        self._group, self.outputs.group_outputs = None, 0
        if self._trace is not None:  # a group neither acknowledged nor failed
            settled(self.tracing.end_group(self._trace, "nak"), "abandoned")
            self._trace = None
        while True:
            if self._quiesced:  # RUN-030: nothing more comes to this process
                return {parent: end_entry(None) for parent in self.parent_names}
            group = self._next_group(join)
            if group is not None:
                if self._packs_out:  # its outputs are held while its pack's members come
                    self.window.pack_inputs(_pack_of(group.handles))
                self._settle_ahead()
                self._group = group
                self.deliveries.hand_out(group.handles)
                self._handed_at = clock.monotonic()
                arrivals = [h.arrived for h in group.handles if h.parent not in join.collect]
                if join.collect:  # the samples its collect parents send per group
                    self._collected += (len(group.handles) - len(arrivals)) / len(join.collect)
                # RunReport's join latency: the group's first member's arrival to now.
                self.last_join_latency = (clock.monotonic() - min(arrivals)) if arrivals else None
                if self._covered is not None and self.last_input_key() == self._covered:
                    self.ack_inputs()  # already applied before the checkpoint: done
                    continue
                self._trace = self.tracing.begin_group(group.trace_id, group.handles)
                join.fused(group)
                return group.entries  # the records the assembler kept, read by key
            if self._flushed:
                return self.deliveries.stop_entries()
            if self.on_wait is not None:
                self.on_wait()
            self._receive_once()

    def _settle_ahead(self) -> None:
        """Before the node starts a group, send the settlements that would otherwise
        wait on it: those due by the time the node is expected back (its mean time per
        group), after waiting briefly for a slow node's last outputs to be confirmed.
        A fast node keeps gathering its settlements into batches."""
        mean = self._group_seconds
        if mean is None:
            return
        if mean >= SETTLE_WITHIN_SECONDS and self.window.in_flight:
            self.window.confirm_within(CONFIRM_SECONDS)
        self.deliveries.send_completed_due(mean)

    def _next_group(self, join: Join) -> ReadyGroup | None:
        if join.learning is not None and self._learning(join):
            return None
        if self._ready:
            return self._ready.popleft()
        group = join.pop_ready()
        self.deliveries.settle_pending()
        if group is not None:
            return group
        if self._packs_out:  # no more members of the pack being held: its outputs go
            self.window.pack_inputs(None)
        # Asking the broker whether a parent is drained costs a round trip: only once
        # a receive came back empty -- while data arrives, it is not. Nor while outputs
        # are in flight: a refusal sends their inputs back to be retried, and a node
        # that had ended would leave them on the broker unprocessed.
        if not self._flushed and self._inputs_ended(join):
            self._ready.extend(join.flush())
            self._flushed = True
            self.deliveries.settle_pending()
            return self._ready.popleft() if self._ready else None
        return None

    def _inputs_ended(self, join: Join) -> bool:
        return self._idle and not self.window.in_flight and not join.deferred and all(
            self.deliveries.drained(p, self._data_subs[p]) for p in self.parent_names)

    def _learning(self, join: Join) -> bool:
        """A learning join (ClockLearning): hold what it forms, step the corrections
        its estimates call for, each step followed by a regrouping of everything held;
        once none is called for (or a bound is reached), end learning, the groups
        formed under the final corrections ready in order. Whether it still learns."""
        learning = join.learning
        assert learning is not None and self._running is not None
        clocks = join.clocks
        assert clocks is not None
        for _ in range(LEARN_PASSES):
            self._hold_ready(join, learning)
            estimates = clocks.estimates()
            changes = self._running.update(clocks, estimates)
            if not changes:
                break
            for change in changes:
                logger.info("%s: %s (learning)", self.node_name, change)
            learning.steps += len(changes)
            held = [h for h in join.regroup() if isinstance(h, _Handle)]  # all of them
            for handle in held:  # under the new corrections
                self._recorrect(handle)
            # Added again in event-time order, its groups taken as they form, as a
            # receive's batches are: all at once, a parent far ahead in the backlog (an
            # IMU's samples) would overflow its buffer before any group took them.
            held.sort(key=lambda h: -inf if h.event_ts is None else h.event_ts)
            for at in range(0, len(held), RECEIVE_BATCH):
                for handle in held[at:at + RECEIVE_BATCH]:
                    join.assembler.add(handle.parent, handle.entry, handle)
                self._hold_ready(join, learning)
            estimates = clocks.estimates()  # what the last step left
        why = ("every parent's clock was estimated" if set(clocks.parents) <= set(estimates)
               else learning.bound_reached(clock.monotonic(), join.assembler.pending_count()))
        if why is None and self._inputs_ended(join):
            why = "its inputs ended"
        if why is None:
            return True
        join.learning = None
        clocks.restart()  # its groups are measured again as they are handed out
        corrected = ", ".join(f"{p} {o * 1000.0:+.1f} ms"
                              for p, o in self._clock_offsets.items() if o)
        took = 0.0 if learning.first is None else clock.monotonic() - learning.first
        self.clock_learned = (
            f"learned its parents' clocks for {took:.2f} s, until {why}: "
            f"{learning.steps} correction step{'' if learning.steps == 1 else 's'} "
            f"({corrected or 'none'}); its first {len(learning.groups)} groups held "
            f"meanwhile")
        logger.info("%s: %s", self.node_name, self.clock_learned)
        self._ready.extend(learning.groups)
        for given_up, reason in learning.discards:  # as the join's rules say, now
            join.dispose(given_up, reason)
        self.deliveries.settle_pending()
        return False

    @staticmethod
    def _hold_ready(join: Join, learning: ClockLearning) -> None:
        """The groups a learning join has formed, held and measured (at their members'
        arrival: the estimator's rate bound goes by when they came)."""
        while (group := join.pop_ready()) is not None:
            learning.groups.append(group)
            join.fused(group, max(getattr(h, "arrived", 0.0) for h in group.handles))

    def _receive_once(self) -> None:
        self.reconciled += self.payloads.reconcile()  # PAY-006, at most once per ack_wait
        window = self.window
        window.advance()
        # The groups resolved since the last wait go out together once the oldest has
        # lingered; the short poll below, while any is unsent, keeps that bound.
        self.deliveries.send_completed_due()
        # A wait ends by the linger's due time; settlement answers need no poll (each
        # wait runs the loop that reads them, and the next collects them).
        poll = WINDOW_POLL_SECONDS if window.in_flight else POLL_SECONDS
        linger = self.deliveries.linger_left()
        if linger is not None:
            poll = min(poll, linger)
        subs, credit = self._all_subs, RECEIVE_BATCH
        join = self.join
        if join is not None and join.alignment is not None:
            held, most = join.align()
            credit = min(credit, most)
            for item in join.due():  # set aside past their bound, which has moved on
                self._join_data(item.sub, item.delivery, item.decoded)
            if held:  # left on the broker until the slowest parent catches up
                subs = [s for s in subs if s.kind == "eos" or s.channel.node not in held]
        called = clock.monotonic()
        received = self.backend.receive_any(subs, credit, 0, called + poll)
        got = self.deliveries.packs.expand(received)
        self._idle = not got
        if self.freshness is not None:
            got = self._freshest(got, called)
        for sub, delivery in got:
            if sub.kind == "eos":
                self._on_end_marker(self._eos_subs[sub], delivery)
            else:
                self._on_data(sub, delivery)
        if self.join is not None:
            if got and self.join.alignment is not None:
                self.join.arrived({sub.channel.node for sub, _ in got if sub.kind == "data"})
            self.join.settle_released()  # what the batch's adds let go of, at once
            if self._running is not None:
                self._correct_clocks()
            learning = self.join.learning
            if learning is not None and learning.started is not None and (
                    0 < credit <= len(received)):  # catching up: its time starts after
                learning.started = clock.monotonic()
        self.deliveries.settle_pending()

    def _correct_clocks(self) -> None:
        """clock_correction='running': at most every CORRECT_SECONDS, move the
        corrections the join's estimates call for (RunningCorrection), each change
        logged."""
        now = clock.monotonic()
        if now - self._corrected_at < CORRECT_SECONDS or (
                self.join is not None and self.join.learning is not None):
            return  # a learning join steps as it regroups (_learning)
        self._corrected_at = now
        assert self._running is not None and self.join is not None
        assert self.join.clocks is not None
        for change in self._running.update(self.join.clocks):
            logger.info("%s: %s", self.node_name, change)

    def _running_epoch(self, parent: str) -> int:
        join = self.join
        return 0 if join is None or join.clocks is None else join.clocks.epoch(parent)

    def clock_corrections(self) -> tuple[dict[str, float], dict[str, int]]:
        """The corrections a time join applies to its parents' event times, seconds
        (clock_offsets, and with clock_correction='running' what it moved them to), and
        how many times each moved; both empty for a node without a time join."""
        if self._running is not None:
            return dict(self._running.applied), dict(self._running.changes)
        return dict(self._clock_offsets), {}

    def _freshest(self, got: list[tuple[SubscriptionId, Delivery]], called: float
                  ) -> list[tuple[SubscriptionId, Delivery]]:
        """What of a receive a one-parent REALTIME node works through: its data less
        the inputs a newer one supersedes (Freshness.stale), which are received,
        acknowledged (a payload by ref released once that is confirmed) and counted as
        'superseded' drops. What the stream evicted before any receive is the run's to
        count (run/local.py)."""
        freshness = self.freshness
        assert freshness is not None
        data = [item for item in got if item[0].kind != "eos"]
        beyond = 0
        if data:  # parked past the receive, or left on the broker (no round trip)
            waiting = self.backend.backlog(data[0][0])
            beyond = waiting.value if isinstance(waiting, Known) else 0
        stale = freshness.stale(len(data), beyond, called, clock.monotonic())
        if not stale:
            return got
        data.sort(key=lambda item: item[1].token.stream_seq)
        superseded = {id(delivery) for _, delivery in data[:stale]}
        for sub, delivery in data[:stale]:
            parent = sub.channel.node
            self.deliveries.data_arrived(parent)
            if delivery.num_delivered == 1:
                self.received[parent] += 1
            self.deliveries.drops["superseded"] += 1
            ref = _blob_ref(delivery)
            if ref is None:
                self.deliveries.settle_later(delivery, Completed())
            else:  # its payload is let go once the ack is confirmed (PAY-004)
                self.deliveries.complete_later(
                    [_Handle(parent, sub, delivery, ref)],
                    f"superseded:{parent}:{delivery.token.stream_seq}")
        return [item for item in got if id(item[1]) not in superseded]

    def _on_data(self, sub: SubscriptionId, delivery: Delivery) -> None:
        parent = sub.channel.node
        self.deliveries.data_arrived(parent)
        if delivery.num_delivered == 1:
            self.received[parent] += 1
        elif self.deliveries.completed_before(parent, delivery):
            # Its group went out and was acknowledged here; the ack did not reach the
            # broker. Acknowledged again, not grouped again.
            self.deliveries.settle_later(delivery, Completed())
            self.redelivered_done += 1
            return
        try:
            decoded = decode_envelope(delivery.data)
            if decoded["is_stop_signal"] or decoded["is_abort"]:
                # End markers travel on the end-marker subject only: one on the data
                # subject (a foreign writer's) would end a one-parent node's input
                # while its parent's data still comes.
                raise WireError("an end marker on the data subject")
            event_ts = decoded["event_ts"]  # a float or None: the wire types it
            if event_ts is not None and (self._clock_offsets or self._running is not None):
                offset = self._clock_offsets.get(parent, 0.0)
                decoded["stamp"] = event_ts  # as its producer stamped it
                event_ts += offset
                decoded["event_ts"] = event_ts  # what everything after reads
                decoded["clock_offset"] = offset  # said with the group's outputs
                if self._running is not None:  # the correction it was decoded with
                    decoded["clock_epoch"] = self._running_epoch(parent)
        except CodecError as error:
            # Whole bytes an installed codec (or one installed later) may read:
            # kept, to be replayed.
            self.deliveries.drops["undecodable"] += 1
            self.deliveries.dead_letter(_Handle(parent, sub, delivery), error,
                                        "undecodable: codec", "undecodable")
            return
        except (WireError, KeyError) as error:
            self.deliveries.drops["undecodable"] += 1
            self.deliveries.terminate(parent, delivery, f"undecodable: {error!r}")
            return
        if event_ts is not None and not isfinite(event_ts):
            # A writer that is not videoflow, or an older one: no join can place it
            # (the time core refuses it), and no retry makes it finite.
            self._poison_event_time(parent, sub, delivery, decoded.get("blob_ref"), event_ts)
            return
        join = self.join
        assert join is not None  # data arrives only at a node with parents
        if event_ts is not None and join.defers(parent, event_ts):
            # Past its parent's drift bound: set aside, its payload unread, until the
            # slowest parent catches up (held by this messenger meanwhile).
            self.deliveries.hold(parent, delivery.token)
            join.defer(parent, Deferred(event_ts, sub, delivery, decoded))
            return
        self._join_data(sub, delivery, decoded)

    def _join_data(self, sub: SubscriptionId, delivery: Delivery,
                   decoded: dict[str, Any]) -> None:
        """Read a decoded input's payload, if it came by ref, and hand the entry to the
        join's assembler."""
        parent = sub.channel.node
        try:
            ref = decoded.get("blob_ref")
            if ref is not None:  # restored before the entry is built: one entry per input
                decoded["message"] = self.payloads.restore(ref)
            entry = EnvelopeEntry.from_decoded(decoded)
        except (PayloadMissing, CodecError) as error:
            # The envelope is whole, its payload gone (reclaimed, deleted from shared
            # memory) or not readable here (a codec): dead-lettered, so the envelope
            # and the reason are kept.
            self.deliveries.drops["undecodable"] += 1
            self.deliveries.let_go(delivery)  # held while it was set aside
            what = "codec" if isinstance(error, CodecError) else "payload missing"
            self.deliveries.dead_letter(_Handle(parent, sub, delivery), error,
                                        f"undecodable: {what}", "undecodable")
            return
        except (WireError, KeyError) as error:
            self.deliveries.drops["undecodable"] += 1
            self.deliveries.let_go(delivery)
            self.deliveries.terminate(parent, delivery, f"undecodable: {error!r}")
            return
        handle = _Handle(parent, sub, delivery, entry.blob_ref, clock.monotonic(),
                         entry.event_ts, decoded.get("clock_epoch", 0),
                         decoded.get("clock_offset", 0.0), entry, decoded.get("stamp"))
        if self._running is not None:
            # Set aside (deferred) under an earlier correction: under the current one.
            self._recorrect(handle)
            learning = self.join.learning if self.join is not None else None
            if learning is not None and learning.first is None:
                learning.first = learning.started = handle.arrived
        if delivery.num_delivered > 1 and self.deliveries.crash_looped(handle):
            self.deliveries.let_go(delivery)
            return  # it was in hand at each of crash_limit process deaths: dead-lettered
        self.deliveries.hold(parent, delivery.token)
        assert self.join is not None  # data arrives only at a node with parents
        self.join.assembler.add(parent, handle.entry, handle)

    def _recorrect(self, handle: _Handle) -> None:
        """A held input as the current running correction would have decoded it: its
        event time moved by the change of its parent's correction since, its epoch the
        current one."""
        parent = handle.parent
        offset = self._clock_offsets.get(parent, 0.0)
        if handle.stamp is not None and offset != handle.clock_offset:
            event_ts = handle.stamp + offset  # as decode adds it
            handle.entry = msgspec.structs.replace(handle.entry, event_ts=event_ts)
            handle.event_ts, handle.clock_offset = event_ts, offset
        handle.clock_epoch = self._running_epoch(parent)

    def _poison_event_time(self, parent: str, sub: SubscriptionId, delivery: Delivery,
                           ref: str | None, event_ts: float) -> None:
        """An input whose event time is not finite is poison: dead-lettered at once,
        envelope and reason kept (its payload, by ref, pinned with it), never handed
        to the assembler; the inputs after it go on."""
        self.deliveries.drops["undecodable"] += 1
        error = WireError(f"envelope field 'event_ts' is {event_ts!r}, not a finite time")
        self.deliveries.dead_letter(_Handle(parent, sub, delivery, ref), error,
                                    f"poison: event time {event_ts!r} is not finite",
                                    "poison")

    def _on_end_marker(self, parent: str, delivery: Delivery) -> None:
        try:
            marker = decode_envelope(delivery.data)
        except WireError as error:
            self.deliveries.drops["undecodable"] += 1
            self.deliveries.terminate(parent, delivery, f"undecodable end marker: {error}")
            return
        self.deliveries.on_marker(parent, marker)
        self.runtime.record_eos(parent, marker["replica_id"], aborted=bool(marker["is_abort"]))
        self.deliveries.settle_later(delivery, Completed())

    def last_input_key(self) -> str | None:
        """A stable identity of the group last returned: its trace id and seq, the
        same across a redelivery or a restart."""
        group = self._group
        return None if group is None else f"{group.trace_id}:{group.seq}"

    def last_input_info(self) -> dict[str, dict[str, Any] | None] | None:
        """Per parent: event_ts (as the join read it, corrected), metadata, trace_id,
        seq, and clock_offset (the seconds added to its event time, 0.0 for none) of
        the group last returned; None for a parent missing from a quorum emission;
        None for a producer."""
        group = self._group
        if group is None:
            return None
        info: dict[str, dict[str, Any] | None] = {}
        offsets = {h.parent: h.clock_offset for h in group.handles} if (
            self._clock_offsets) else {}
        for parent, entry in group.entries.items():
            if isinstance(entry, EnvelopeEntry):
                info[parent] = {"event_ts": entry.event_ts, "metadata": entry.metadata,
                                "trace_id": entry.trace_id, "seq": entry.seq,
                                "clock_offset": offsets.get(parent, 0.0)}
            elif entry is None:
                info[parent] = None
            else:  # a collect window: lists over its samples
                info[parent] = {"event_ts": entry.event_ts, "metadata": entry.metadata,
                                "trace_id": None, "seq": None,
                                "clock_offset": offsets.get(parent, 0.0)}
        return info

    # ------------------------------------------------------------------ settlement

    def ack_inputs(self) -> None:
        """Settle every handle of the group last returned Completed, in one batch.
        An unconfirmed settlement leaves its delivery to be redelivered (PAY-004)."""
        group, self._group = self._group, None
        trace, self._trace = self._trace, None
        if group is not None:
            self.deliveries.hand_back()
            self._timed_group()
            if trace is not None and self.tracing.enabled:
                self.deliveries.trace_settlement(group.handles,
                                                 self.tracing.end_group(trace, "ack"))
            self.window.close_group(group.handles, f"{group.trace_id}:{group.seq}")

    def fail_inputs(self, exc: BaseException) -> None:
        """Execute the delivery policy's verdict for exc on the group last returned:
        retry after the backoff, hand back without counting (worker-fatal),
        dead-letter then terminate (poison, or the retry budget spent), or terminate
        against the terminal log and count it (best effort)."""
        group, self._group = self._group, None
        trace, self._trace = self._trace, None
        self.window.abandon_group()
        if group is not None:
            self.deliveries.hand_back()
            self._timed_group()
            settle = None if trace is None else self.tracing.end_group(trace, "nak")
            if self.deliveries.fail(group.handles, exc):
                self.window.pack_retried()  # the pack comes again, its outputs with it
            settled(settle, "sent")

    def _timed_group(self) -> None:
        """Fold the node's time on the group just done into its mean, and set the
        backend's receive depth to about DEPTH_SECONDS of such groups."""
        seconds = clock.monotonic() - self._handed_at
        mean = self._group_seconds
        mean = seconds if mean is None else 0.9 * mean + 0.1 * seconds
        self._group_seconds = mean
        self._groups_timed += 1
        # A collect parent (a sensor's window) sends several inputs per group: its depth
        # is that many per group the node gets through. (What was received would count
        # what is parked ahead too, and grow the depth it measures.)
        per_group = max(1.0, self._collected / self._groups_timed)
        depth = RECEIVE_PREFETCH if mean <= 0 else int(DEPTH_SECONDS / mean * per_group)
        self._set_depth(max(ceil(per_group), depth))

    def _set_depth(self, depth: int) -> None:
        """Ask the backend to park at most depth deliveries per subscription (within
        _least_depth..RECEIVE_PREFETCH), if it parks any."""
        depth = max(self._least_depth, min(RECEIVE_PREFETCH, depth))
        if depth != self._depth:
            self.backend.set_receive_depth(depth)
            self._depth = depth

    @property
    def dead_lettered(self) -> int:
        """Inputs this process dead-lettered (records accepted)."""
        return self.deliveries.dead_lettered

    @property
    def budget_waits(self) -> int:
        """Times receiving paused because the byte budget was full (0 for a backend
        that keeps no budget)."""
        return self.backend.budget_waits()

    @property
    def unconfirmed_acks(self) -> int:
        """Acks the broker did not confirm (redelivered later)."""
        return self.deliveries.unconfirmed_acks

    def count_drop(self, reason: str) -> None:
        """Count one input the node itself gave up on (a source's undecodable record),
        as the messenger counts its own: reported with the node's drops.

        Raises:
            ValueError: a reason that is not one of DROP_REASONS.
        """
        if reason not in self.deliveries.drops:
            raise ValueError(f"a drop's reason must be one of {sorted(self.deliveries.drops)}, "
                             f"got {reason!r}")
        self.deliveries.drops[reason] += 1

    def take_drops(self) -> dict[str, int]:
        """Inputs given up on since the last call, by reason (DROP_REASONS)."""
        return self.deliveries.take_drops()

    def dropped(self) -> dict[str, int]:
        """Inputs given up on so far, by reason (DROP_REASONS)."""
        return self.deliveries.dropped()

    def terminal_entries(self) -> list[dict[str, Any]]:
        """The node's terminal log (DELIV-15): every delivery it ended without a dead
        letter."""
        return [{"key": e.key, "record_ref": e.record_ref, "reason": e.reason}
                for e in self.runtime.terminal_entries()]

    def close(self) -> None:
        """Resolve what is in flight (drain), then shut the backend down if this
        messenger made it: what is still held is handed back (RUN-030)."""
        try:
            self.drain()
        finally:
            if self._owns_backend:
                self.backend.shutdown()


__all__ = ["DROP_REASONS", "NATSMessenger", "PublicationFailed"]
