"""Input-group assembly for multi-parent (join) nodes.

Two strategies, testable without a broker:

- ``TraceGroupAssembler`` groups by exact trace_id: inputs that descend from the
  same originating message of one upstream producer (diamond topologies).
- ``TimeGroupAssembler`` groups by event time: inputs whose event_ts fall within a
  tolerance of each other, regardless of lineage, with optional quorum emission
  and per-parent collect windows for high-rate sensors joined many-to-one.

An assembler is fed decoded envelope entries paired with their broker ack handles.
It owns the pending buffers and resolves the handles of anything it discards
(evicted, expired, late, flushed) and supersedes (retired locally, no broker
settlement), through the one resolver it is given: ``resolver(released)``, with
the (handle, reason) pairs a call let go of, reason SUPERSEDED or the discard's. The
default, resolve_handles, calls each handle's own ``supersede()`` or
``discard(reason)`` (ResolvableHandle); the messenger's only queues them, and the
messenger settles the queue after its receive batch. Handles are resolved at the end
of the call that let them go (add, pop_ready, sweep, flush), in the order they were
let go, never in the middle of the assembler's work.
Handles of everything it emits travel out unresolved inside the ReadyGroup for the
task loop to ack/fail after processing.

The bookkeeping lives in a core with two implementations behind one interface:
the compiled ``_grouping_core`` (csrc/) and the pure-Python reference
``_grouping_ref`` whose docstring states every rule both keep (timeouts, quorum,
eviction, redelivery, and when a collect sample's handle is released).
``VIDEOFLOW_PURE_PYTHON=1`` selects the reference; otherwise the compiled core is
required and its absence is an ImportError, never a silent slow fallback. The core
holds entries and handles as opaque objects next to its numeric tables: a
Python-side slot table would cost more per message than the whole compiled path.
It never calls a handle, it only does arithmetic: what it lets go of goes on a list,
and a call that left pairs there ends by handing the list to the resolver, so a call
that lets nothing go costs no Python call for it, and one that does costs one call
for all it let go (the messenger's resolver is a list's extend: no Python frame).

Clocks: ``now`` arguments and the optional ``clock`` are monotonic seconds
(``time.monotonic`` by default): they time the timeouts and the silence backstop
(oldest_wait_seconds, sweep, heard, pop_ready, flush), which a step of the wall
clock must not move. Event times are epoch seconds, as producers stamp them; a
message without an event_ts falls back to its arrival on ``epoch`` (``time.time``
by default). All methods are called from the single task thread; no locking is
needed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, cast

import msgspec

from videoflow.core.policies import JoinPolicy
from videoflow.messaging.grouping_core import (
    GroupingCore,
    GroupingCoreModule,
    TimeGroupingCore,
)
from videoflow.native import PURE_PYTHON, not_built


def _load_core() -> GroupingCoreModule:
    if PURE_PYTHON:
        from videoflow.messaging import _grouping_ref

        return cast(GroupingCoreModule, _grouping_ref)
    try:
        from videoflow.messaging import _grouping_core
    except ImportError as exc:
        raise not_built("grouping core", "run the slow pure-Python reference") from exc
    return cast(GroupingCoreModule, _grouping_core)


_core: GroupingCoreModule = _load_core()
CORE_KIND: str = _core.CORE_KIND
"""Which core this process loaded, 'compiled' or 'reference'."""
SUPERSEDED: str = _core.SUPERSEDED
"""The reason a resolver is given for a held delivery its redelivery replaced."""

Resolver = Callable[[list[tuple[Any, str]]], object]
"""How an assembler resolves the handles it lets go of, called as
``resolver(released)`` at the end of each add, pop_ready, sweep or flush that let any
go, with the call's (handle, reason) pairs in the order they were let go, reason
SUPERSEDED or the discard's ('evicted', 'expired', 'late' or 'flushed'). The list is
the core's, emptied once the resolver returns: a resolver that keeps pairs copies
them (list.extend does). It must not call back into the assembler; an exception it
raises leaves that call, the assembler's state whole, the pairs handed over."""


class ResolvableHandle(Protocol):
    """The handle protocol of the default resolver, resolve_handles."""

    def discard(self, reason: str) -> None:
        """The assembler gave this input up: reason 'evicted', 'expired', 'late' or
        'flushed'."""

    def supersede(self) -> None:
        """A redelivery of this input replaced it: retire it locally, with no broker
        settlement (the redelivery holds the attempt)."""


def resolve_handles(released: list[tuple[ResolvableHandle, str]]) -> None:
    """The default resolver: for each pair in order, ``handle.supersede()`` for
    SUPERSEDED, else ``handle.discard(reason)``.

    Arguments:
        released (list): (handle, reason) pairs, each handle a ResolvableHandle.

    Raises:
        Exception: the first a handle raised, once every handle was resolved: one
            handle's failure leaves none of the others unresolved.
    """
    error: Exception | None = None
    for handle, reason in released:
        try:
            if reason == SUPERSEDED:
                handle.supersede()
            else:
                handle.discard(reason)
        except Exception as exc:
            error = error or exc
    if error is not None:
        raise error


ENTRY_KEYS: frozenset[str] = frozenset({
    "message", "metadata", "event_ts", "is_stop_signal", "is_abort", "abort_origin",
    "abort_error"})
"""What a node's task reads of an entry by key (entry["message"]), the fields
Messenger.receive_message promises; every entry record carries them."""


class _ByKey:
    """Reads an entry record's ENTRY_KEYS by key, the way receive_message's entries
    are documented (entry["message"], entry["is_stop_signal"]): the task gets the
    record the assembler kept, not a dict rebuilt from it."""

    __slots__ = ()

    def __getitem__(self, key: str) -> Any:
        if key not in ENTRY_KEYS:
            raise KeyError(key)
        return getattr(self, key)


class EnvelopeEntry(msgspec.Struct, _ByKey, frozen=True):
    """One decoded envelope as the messaging layer carries it: the field set
    videoflow.wire.serialization.decode_envelope returns, as attributes.

    Built at the messenger's receive boundary via from_decoded and never mutated
    afterwards — an assembler that supersedes a redelivery swaps the whole entry.
    The same record reaches the node's task, which reads it by key (ENTRY_KEYS; a
    data entry's is_abort is False).

    A frozen msgspec Struct, not a frozen dataclass: one is built per input in every
    reader, and a frozen dataclass's checked setattr per field made that 2.7-2.9 us
    against 0.5-0.6 (measured, Python 3.11).
    """

    is_abort: ClassVar[bool] = False
    abort_origin: ClassVar[None] = None
    abort_error: ClassVar[None] = None

    trace_id: str
    seq: int
    event_ts: float | None
    message: Any
    metadata: dict | None
    is_stop_signal: bool
    type: str = ""
    producer_name: str = ""
    flow_id: str = ""
    run_id: str = ""
    span_id: Any = None
    parent_span_id: Any = None
    replica_id: int = 0
    blob_ref: str | None = None

    @classmethod
    def from_decoded(cls, decoded: dict[str, Any]) -> EnvelopeEntry:
        """Adapts a decode_envelope result to an EnvelopeEntry.

        Arguments:
            decoded (dict): the envelope dict from decode_envelope. Keys the entry
                does not carry (partition_key, abort fields) are ignored.

        Returns:
            The equivalent EnvelopeEntry. Only trace_id and seq are required; other
            fields absent from the dict carry their declared default.

        Raises:
            KeyError: if trace_id or seq is missing — without them a group has no
                identity to assemble on.
        """
        get = decoded.get
        return cls(
            decoded["trace_id"],
            decoded["seq"],
            get("event_ts"),
            get("message"),
            get("metadata"),
            bool(get("is_stop_signal", False)),
            get("type") or "",
            get("producer_name") or "",
            get("flow_id") or "",
            get("run_id") or "",
            get("span_id"),
            get("parent_span_id"),
            get("replica_id") or 0,
            get("blob_ref"),
        )


@dataclass(slots=True)
class CollectEntry(_ByKey):
    """The window of samples a collect parent contributes to one time group: every
    sample within that parent's window of the group's time, oldest first.

    Deliberately not an EnvelopeEntry — message, metadata and event_ts are lists
    here, and the window has no single trace id or seq of its own. Read by key as
    an EnvelopeEntry is (ENTRY_KEYS).
    """

    is_abort: ClassVar[bool] = False
    abort_origin: ClassVar[None] = None
    abort_error: ClassVar[None] = None

    message: list = field(default_factory=list)
    metadata: list = field(default_factory=list)
    event_ts: list = field(default_factory=list)
    is_stop_signal: bool = False


@dataclass(frozen=True, slots=True)
class EndEntry(_ByKey):
    """What receive_message hands the task for a parent that ended: a clean end
    (is_stop_signal), or a death (is_abort, with the origin node and its error
    record). Read by key as an EnvelopeEntry is (ENTRY_KEYS); it has no message.
    """

    is_stop_signal: bool
    is_abort: bool = False
    abort_origin: str | None = None
    abort_error: dict[str, Any] | None = None
    message: ClassVar[None] = None
    metadata: ClassVar[None] = None
    event_ts: ClassVar[None] = None


GroupEntry = EnvelopeEntry | CollectEntry | None
"""What one parent contributes to a ReadyGroup — a normal entry, a collected window,
or None for a parent missing from a quorum emission."""


@dataclass(slots=True)
class ReadyGroup:
    """A fully assembled input group, ready to hand to the node.

    Attributes:
        trace_id: identity the node's output carries forward: the parents' trace id
            for trace groups; for time groups an id minted from the member set
            ('tg-' + 16 hex digits), the same for the same members in any order.
        seq: deterministic representative sequence number, the smallest member seq
            (stable across redelivery of the same group, for output dedup).
        event_ts: the group's event time: min over its sync members' event_ts
            (collect samples are attachments, not members); None for a trace group
            whose members carry no event time.
        entries: {parent_name: entry}: an EnvelopeEntry, None for a parent missing
            from a quorum emission, or a CollectEntry for a collect parent's window.
        handles: every unresolved ack handle backing this group, in no particular
            order (members, plus collect samples this group is the last to use).
    """

    trace_id: str
    seq: int
    event_ts: float | None
    entries: dict[str, EnvelopeEntry | CollectEntry | None]
    handles: list


class GroupAssembler:
    """Base interface: feed entries with add, expire with sweep, drain with pop_ready.

    Arguments:
        node_name (str): the join node, for messages.
        parent_names (list[str]): the node's parents.
        policy (JoinPolicy): validated against parent_names.
        clock (callable): monotonic seconds for timeouts and the silence backstop,
            ``time.monotonic`` by default; tests pass a fake one.
        epoch (callable): epoch seconds, the event time of a message that carries
            none (time mode), ``time.time`` by default.
        core (module): the core implementation, the process-wide one (CORE_KIND)
            by default; tests pass each in turn.
        resolver (callable): resolves every handle the assembler discards or
            supersedes (Resolver); resolve_handles, the handles' own methods, by
            default.

    Raises:
        ValueError: when the policy does not fit the parents (see JoinPolicy.validate_for).
    """

    def __init__(
        self,
        node_name: str,
        parent_names: list[str],
        policy: JoinPolicy,
        *,
        clock: Callable[[], float] = time.monotonic,
        epoch: Callable[[], float] = time.time,
        core: GroupingCoreModule | None = None,
        resolver: Resolver | None = None,
    ) -> None:
        self.node_name = node_name
        self.parent_names = list(parent_names)
        self.policy = policy
        self.clock, self.epoch = clock, epoch
        self._resolver: Resolver = resolve_handles if resolver is None else resolver
        self.sync_parents = policy.validate_for(self.parent_names)
        quorum = len(self.sync_parents) if policy.quorum is None else policy.quorum
        self._core = self._make_core(_core if core is None else core, quorum)
        # The per-message calls go straight to the core: a Python frame in between
        # would cost about as much as the compiled work itself. The core calls the
        # resolver only when a call let something go.
        self.add = self._core.add  # type: ignore[method-assign]
        self.pop_ready = self._core.pop  # type: ignore[method-assign]

    def _make_core(self, impl: GroupingCoreModule, quorum: int) -> GroupingCore:
        raise NotImplementedError

    def _timeout_s(self) -> float:
        timeout = self.policy.timeout_ms
        return -1.0 if timeout is None else timeout / 1000.0

    def add(self, parent_name: str, entry: EnvelopeEntry, handle: Any) -> None:
        """Feeds one entry and its ack handle; what the add lets go of (a held
        delivery this one supersedes, groups evicted over max_pending or given up by
        the watermark it moved) is resolved before it returns.

        Raises:
            KeyError: if parent_name is not a parent of this node.
            ValueError: in time mode, for a NaN or infinite event_ts.
            OverflowError: for a sync parent's seq outside the signed 64-bit range.
        """
        self._core.add(parent_name, entry, handle)

    @property
    def evictions(self) -> int:
        """Groups discarded (evicted or expired) so far — read by the messenger's
        drop accounting."""
        return int(self._core.evictions)

    def has_pending_from(self, parent_name: str) -> bool:
        """Whether any buffered state still holds a message from this parent (EOS
        drain check)."""
        return bool(self._core.has_pending_from(parent_name))

    def oldest_wait_seconds(self, now: float | None = None) -> float:
        """How long the oldest incomplete group has waited (0 when none)."""
        return float(self._core.oldest_wait(now))

    def pending_count(self) -> int:
        """Incomplete groups held right now."""
        return int(self._core.pending_count())

    def waiting_for(self) -> list[str]:
        """The parents the oldest incomplete group waits for, in parent order ([] when
        none is held). In time mode, a parent whose data has passed the group is not
        waited for (it is given up on), unless the group is held below quorum under
        missing='wait', which takes any member still."""
        waiting: list[str] = self._core.waiting_for()
        return waiting

    def watermarks(self) -> dict[str, float | None]:
        """Each parent's event-time watermark, the greatest event_ts seen from it (None
        before its first message); {} in trace mode, which has none."""
        return {}

    def watermark_lags(self) -> dict[str, float | None]:
        """How far each parent's watermark is behind the most advanced parent's, in
        seconds (0 for the most advanced; None for a parent not heard from yet, or when
        none is): the clock-skew and lag diagnostic of a time join. {} in trace mode."""
        marks = self.watermarks()
        known = [mark for mark in marks.values() if mark is not None]
        lead = max(known) if known else None
        return {name: None if mark is None or lead is None else lead - mark
                for name, mark in marks.items()}

    def pop_ready(self, now: float | None = None) -> ReadyGroup | None:
        """Returns the next ready group, or None. Applies the timeout first (sweep),
        so a caller that only pops still sees quorum emissions and expiries."""
        group: ReadyGroup | None = self._core.pop(now)
        return group

    def flush(self, now: float | None = None) -> list[ReadyGroup]:
        """Ends the input: emits every pending group that holds a quorum (windows
        closed as they stand), discards the rest ('flushed'), and releases every
        buffered collect sample. A sample some group used (a returned one, or one
        popped earlier) travels in the last returned group's handles, or is
        discarded ('flushed') when flush returns no group; an unused sample is
        discarded ('flushed'). The messenger settles 'flushed' handles as done, not
        as failures. Called by the end-of-stream drain so a group pending when its
        parents end is never hung.

        Returns:
            The emitted groups in the order they became ready; the assembler holds
            nothing afterwards.
        """
        groups: list[ReadyGroup] = self._core.flush(now)
        return groups

    def sweep(self, now: float | None = None) -> None:
        """Apply the policy's timeout to pending groups (evict or stage for quorum
        emission)."""
        self._core.sweep(now)

    def heard(self, parent_name: str, now: float | None = None) -> None:
        """parent_name has input waiting that has not been fed yet (parked here, or
        still on the broker): it is not silent as of now (the assembler's clock), so
        the silence backstop gives nothing of it up while the node is merely behind.
        Nothing in trace mode, whose deadlines run from each group's creation.

        Raises:
            KeyError: if parent_name is not a parent of this node (time mode).
        """


class TraceGroupAssembler(GroupAssembler):
    """Groups by exact trace_id. A group is ready when every parent's half with the
    same trace id has arrived; a group that outlives the policy timeout is evicted
    per the missing policy (or emitted with None for missing parents when it holds
    a quorum), and the oldest group is evicted (as drop) beyond max_pending.

    A second message from a parent whose half of that trace is already held (same
    trace id, another seq) starts a second group for the trace rather than
    replacing the first; a redelivery (same seq) supersedes.
    """

    def _make_core(self, impl: GroupingCoreModule, quorum: int) -> GroupingCore:
        if self.policy.collect:
            raise ValueError("collect windows need mode='time'")
        return impl.TraceCore(
            self.parent_names,
            self._timeout_s(),
            quorum,
            self.policy.max_pending,
            self.policy.missing == "wait",
            self.clock,
            ReadyGroup,
            self._resolver,
        )


class TimeGroupAssembler(GroupAssembler):
    """Groups by event time. A message from a synchronized parent joins the pending
    group whose time is nearest to its event_ts (and within tolerance_ms) among
    groups not already holding that parent; otherwise it seeds a new group whose
    time is its event_ts. Messages from collect parents are buffered per parent and
    attached as a CollectEntry at emission time (every sample within that parent's
    window of the group's time).

    Each parent's watermark is the greatest event_ts seen from it, and the policy's
    disorder_ms how far behind it that parent's messages may still come (0: in event
    time order). A group lacking parent p gives p up once p's watermark passes group
    time + tolerance + disorder (its data says the member is not coming, whatever the
    wall clock says), or once p has been silent for the policy timeout (the backstop
    for a parent that stopped) and the group's collect windows could close (while they
    hold it, a late member joins). A group whose missing parents are all given up is
    resolved, oldest first: with at least quorum sync parents it is emitted (missing
    parents as None), below quorum it is evicted per the missing policy. A group with
    its sync parents (or a quorum of them, resolved) waits for every collect window to
    close: once a sample beyond group time + window + disorder arrives from that
    parent, or once it has been silent for the timeout -- never after the window's
    length in wall time, so late samples that exist are in the window. A parent that
    runs ahead, lags or replays loses nothing complete in its data. A message more than
    disorder behind its own parent's watermark that no held group takes (a
    redelivery, a retry) seeds a late group: no watermark can say its
    partners are not coming, so it waits for them until its deadline (created +
    timeout; judged by the watermarks when there is no timeout), holds up no group
    behind it, and is discarded as 'late' if it is still below quorum then. The rules
    are in _grouping_ref's docstring.

    Messages without an event_ts (pre-v3 upstream) fall back to their arrival time.
    """

    _core: TimeGroupingCore

    def heard(self, parent_name: str, now: float | None = None) -> None:
        self._core.heard(parent_name, now)

    def watermarks(self) -> dict[str, float | None]:
        marks: dict[str, float | None] = self._core.watermarks()
        return marks

    def _make_core(self, impl: GroupingCoreModule, quorum: int) -> TimeGroupingCore:
        policy = self.policy
        if policy.tolerance_ms is None:  # pragma: no cover - JoinPolicy enforces it
            raise ValueError("tolerance_ms is required in time mode")
        collect = [p for p in self.parent_names if p in policy.collect]
        return impl.TimeCore(
            self.sync_parents,
            collect,
            [policy.collect[p] / 1000.0 for p in collect],
            policy.tolerance_ms / 1000.0,
            self._timeout_s(),
            quorum,
            policy.max_pending,
            policy.missing == "wait",
            self.clock,
            ReadyGroup,
            CollectEntry,
            self.epoch,
            self._resolver,
            disorder_s=policy.disorder_ms / 1000.0,
        )


def make_assembler(node_name: str, parent_names: list[str], policy: JoinPolicy, *,
                   clock: Callable[[], float] = time.monotonic,
                   epoch: Callable[[], float] = time.time,
                   resolver: Resolver | None = None) -> GroupAssembler:
    """Returns the assembler the policy's mode asks for ('trace' or 'time'), on clock
    (monotonic seconds, for timeouts and the silence backstop) and epoch (the event
    time of a message without one), resolving what it lets go of through resolver
    (resolve_handles by default)."""
    kind = TimeGroupAssembler if policy.mode == "time" else TraceGroupAssembler
    return kind(node_name, parent_names, policy, clock=clock, epoch=epoch, resolver=resolver)
