"""The task loops: a node replica's life over its Messenger.

One task per node replica. It never touches a broker: it asks its messenger for the
next input group, hands it to the node, publishes what the node returned, and only
then acknowledges the inputs (ack after process, and after the output is confirmed);
an exception from the node goes to fail_inputs, whose delivery policy decides between
retry, dead letter and hand-back. When every parent ended the task publishes the
node's own end of stream; when a parent died it relays the abort instead, so the
failure reaches every descendant rather than leaving it waiting. A quiesced task
(SIGTERM) stops taking input and publishes no end of stream: a replacement continues.
A node that dies (open(), next() or a messenger failure raising) publishes an abort
before the error propagates.

An exception raised by process() or consume() (not a publication's failure, which
the report counts) is logged with its traceback on this module's logger
(videoflow.logs.NODE_FAILURES): the first of each type a replica meets at WARNING,
every later one at INFO, so a run shows where each kind of failure comes from without
a line per input, and `-v` shows them all.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from videoflow import clock
from videoflow.core.context import RuntimeContext
from videoflow.core.engine import STOP_QUIESCE, Messenger
from videoflow.core.histogram import Histogram
from videoflow.core.node import ConsumerNode, Node, ProcessorNode, ProducerNode
from videoflow.errors import LedgerError
from videoflow.wire.codecs import counts_snapshot as codec_counts

logger = logging.getLogger(__name__)

LATENCY_SAMPLES = 100_000
"""The most join latencies a task keeps (every one until then, then every other one:
percentiles stay representative and memory bounded)."""


@dataclass
class TaskStats:
    """What one task did, for the RunReport and the live view.

    Attributes:
        processed: input groups the node completed and acknowledged (a producer: 0).
        emitted: outputs published.
        failed: input groups the node raised on (each went to the delivery policy).
        dead_lettered: inputs dead-lettered by this replica.
        drops: inputs dropped, by reason (the messenger's take_drops).
        received: first deliveries per parent.
        join_latencies: seconds from a group's first member arriving to the node
            receiving the group (sampled, see LATENCY_SAMPLES).
        watermark_lag / watermark_lag_max: a time join's parents, how far each one's
            event-time watermark is behind the most advanced parent's, in seconds:
            the latest sample, and the most seen (parents not heard from are absent).
        join_latency: every join latency, as a histogram (the metrics endpoint's).
        hop_latency: seconds from a group's first member arriving to the node done
            with it (its output handed to the broker, its inputs' ack asked for): the
            time this node adds to a message's way, join wait included.
        publications: the messenger's publication outcomes by kind (accepted,
            duplicate, unknown, dropped, rejected).
        budget_waits: times receiving paused because the byte budget was full.
        redelivered_done: a join's redeliveries of inputs it had already acknowledged
            (the ack lost on its way), acknowledged again and not grouped again.
        codecs: what each codec did in this replica's process (wire.codecs'
            counts_snapshot): arrays encoded, their raw and coded bytes and the seconds
            it took; arrays decoded and the seconds it took.
        held_back: a time join's parents, the seconds its event-time alignment has held
            each back (left its input on the broker while it ran ahead).
        held_back_now: the parents it holds back now, each with why ('drift' or
            'pending', videoflow.messaging.join_alignment).
        waiting_on: the parents the join's oldest incomplete group waits for, each with
            why ('budget': its producer waits for payload room; 'silent': nothing came
            from it for a second or more; 'behind': its input is on its way).
        clock_offsets: a time join's parents, each one's estimated clock offset
            (videoflow.messaging.clock_estimates, OffsetEstimate.to_dict).
        clock_advice: those offsets worth correcting, in words, per parent.
        clock_corrections / clock_changes: a time join's corrections of its parents'
            event times, seconds, and how many times a running correction moved each.
        clock_learning: how a running correction's learning ended, in words ('' for
            none: videoflow.messaging.clock_learning).
        payload: a replica writing payloads into a budgeted store (shared memory), its
            bytes held against its share: held_bytes, share_bytes (None until it
            writes), waiting_seconds (its current wait for room, None when it is not
            waiting) and waited_seconds (in all); None for any other.
        started / ended: wall-clock seconds.
        first / last: wall-clock seconds of its first and its latest output (a
            producer) or processed group (any other node): its active span, over which
            its rate is counted (None until it has one).
        snapshot()'s 'at': the process's monotonic clock when the snapshot was made, so
            a rate is the count's change between two snapshots over the change in 'at'.
        outcome: 'running', 'ended' (its stream ended), 'quiesced', 'aborted' (a
            parent died; relayed) or 'failed' (this node died).
        error: the failure's 'Type: message' when outcome is 'failed' or 'aborted'.
    """

    processed: int = 0
    emitted: int = 0
    failed: int = 0
    dead_lettered: int = 0
    drops: dict[str, int] = field(default_factory=dict)
    received: dict[str, int] = field(default_factory=dict)
    join_latencies: list[float] = field(default_factory=list)
    watermark_lag: dict[str, float] = field(default_factory=dict)
    watermark_lag_max: dict[str, float] = field(default_factory=dict)
    join_latency: Histogram = field(default_factory=Histogram)
    hop_latency: Histogram = field(default_factory=Histogram)
    publications: dict[str, int] = field(default_factory=dict)
    budget_waits: int = 0
    redelivered_done: int = 0
    codecs: dict[str, dict[str, float]] = field(default_factory=dict)
    held_back: dict[str, float] = field(default_factory=dict)
    held_back_now: dict[str, str] = field(default_factory=dict)
    waiting_on: dict[str, str] = field(default_factory=dict)
    clock_offsets: dict[str, dict[str, Any]] = field(default_factory=dict)
    clock_advice: dict[str, str] = field(default_factory=dict)
    clock_corrections: dict[str, float] = field(default_factory=dict)
    clock_changes: dict[str, int] = field(default_factory=dict)
    clock_learning: str = ""
    payload: dict[str, Any] | None = None
    started: float = field(default_factory=lambda: clock.wall())
    ended: float | None = None
    first: float | None = None
    last: float | None = None
    outcome: str = "running"
    error: str | None = None
    _stride: int = 1
    _skipped: int = 0

    def add_latency(self, seconds: float) -> None:
        self.join_latency.observe(seconds)
        self._skipped += 1
        if self._skipped < self._stride:
            return
        self._skipped = 0
        self.join_latencies.append(seconds)
        if len(self.join_latencies) >= LATENCY_SAMPLES:  # keep every other one
            del self.join_latencies[::2]
            self._stride *= 2

    def did_one(self) -> None:
        """Count the time of an output (a producer) or a processed group (any other
        node) into its active span (first, last)."""
        self.last = clock.wall()
        if self.first is None:
            self.first = self.last

    def snapshot(self) -> dict[str, Any]:
        """A plain dict (no latencies) for progress reports."""
        return {"processed": self.processed, "emitted": self.emitted, "failed": self.failed,
                "dead_lettered": self.dead_lettered, "drops": dict(self.drops),
                "received": dict(self.received),
                "watermark_lag": dict(self.watermark_lag),
                "watermark_lag_max": dict(self.watermark_lag_max),
                "join_latency": self.join_latency.as_dict(),
                "hop_latency": self.hop_latency.as_dict(),
                "publications": dict(self.publications),
                "budget_waits": self.budget_waits,
                "redelivered_done": self.redelivered_done,
                "codecs": {name: dict(c) for name, c in self.codecs.items()},
                "held_back": dict(self.held_back),
                "held_back_now": dict(self.held_back_now),
                "waiting_on": dict(self.waiting_on),
                "clock_offsets": {p: dict(e) for p, e in self.clock_offsets.items()},
                "clock_advice": dict(self.clock_advice),
                "clock_corrections": dict(self.clock_corrections),
                "clock_changes": dict(self.clock_changes),
                "clock_learning": self.clock_learning,
                "payload": None if self.payload is None else dict(self.payload),
                "started": self.started, "ended": self.ended, "first": self.first,
                "last": self.last, "outcome": self.outcome,
                "error": self.error, "at": clock.monotonic()}


Progress = Callable[["Task"], None]


class Task:
    """The common loop of the three kinds.

    Arguments:
        node: the node, opened and closed by the task.
        messenger: the node replica's messenger; closed by the task.
        context: the RuntimeContext set on node.context.
        progress: called with the task every progress_every seconds (and at the end).
        progress_every: seconds between progress calls.
        opened: called once the node is open, before its first input (a replica
            process freezes what it set up then: videoflow.run.gc_freeze).
    """

    def __init__(self, node: Node, messenger: Messenger, context: RuntimeContext, *,
                 progress: Progress | None = None, progress_every: float = 1.0,
                 opened: Callable[[], Any] | None = None) -> None:
        self.node, self.messenger, self.context = node, messenger, context
        self._opened = opened
        self.stats = TaskStats()
        self._failed_publications = 0  # the messenger's count, as last folded in
        self._progress, self._every = progress, progress_every
        self._next_progress = clock.monotonic() + progress_every
        self._arrived = 0.0  # when the group being processed first arrived (monotonic)
        self._raised: set[type[BaseException]] = set()  # what the node raised so far
        if progress is not None and hasattr(messenger, "on_wait"):
            messenger.on_wait = self._tick  # reports while it waits for input too

    def quiesce(self) -> None:
        """Stop taking input (SIGTERM): held work settles, prefetched work goes back to
        the broker at once (RUN-030), and no end of stream is published."""
        self.messenger.quiesce()  # type: ignore[attr-defined]

    def run(self) -> TaskStats:
        """Open the node, run the loop to the node's end, close both.

        Returns:
            the task's stats (outcome set).

        Raises:
            Exception: whatever killed the node, after its abort was published.
        """
        node = self.node
        node.context = self.context
        try:
            node.open()
            if self._opened is not None:
                self._opened()
            try:
                self._loop()
                drain = getattr(self.messenger, "drain", None)
                if drain is not None:  # outputs in flight resolve while the node lives
                    drain()
            finally:
                node.close()
        except BaseException as error:  # SystemExit from a node too: descendants must know
            self.stats.outcome, self.stats.error = "failed", _describe(error)
            self._abort(error)
            raise
        finally:
            self._collect()
            self.stats.ended = clock.wall()
            if self._progress is not None:
                self._progress(self)
            self.messenger.close()
        return self.stats

    def _loop(self) -> None:
        raise NotImplementedError

    def _abort(self, error: BaseException) -> None:
        publish_abort = getattr(self.messenger, "publish_abort", None)
        if publish_abort is None or self.node.kind == "consumer":
            return
        try:
            publish_abort(error)
        except Exception as second:  # the node is dying anyway; say both
            self.stats.error = (f"{self.stats.error} (and its abort could not be "
                                f"published: {_describe(second)})")

    def _collect(self) -> None:
        """Fold the messenger's counters into the stats."""
        take = getattr(self.messenger, "take_drops", None)
        if take is not None:
            for reason, n in take().items():
                self.stats.drops[reason] = self.stats.drops.get(reason, 0) + n
        self.stats.dead_lettered = getattr(self.messenger, "dead_lettered", 0)
        failed = getattr(self.messenger, "failed_publications", 0)
        self.stats.failed += failed - self._failed_publications
        self._failed_publications = failed
        self.stats.received = dict(getattr(self.messenger, "received", {}))
        self.stats.watermark_lag = dict(getattr(self.messenger, "watermark_lags", {}))
        self.stats.watermark_lag_max = dict(getattr(self.messenger, "watermark_lag_max", {}))
        self.stats.publications = dict(getattr(self.messenger, "publication_stats", {}))
        self.stats.budget_waits = int(getattr(self.messenger, "budget_waits", 0))
        self.stats.redelivered_done = int(getattr(self.messenger, "redelivered_done", 0))
        self.stats.codecs = codec_counts()
        alignment = getattr(self.messenger, "alignment_state", None)
        if alignment is not None:
            stats = self.stats
            stats.held_back, stats.held_back_now, stats.waiting_on = alignment()
        clocks = getattr(self.messenger, "clock_estimates", None)
        if clocks is not None:
            self.stats.clock_offsets, self.stats.clock_advice = clocks()
        corrections = getattr(self.messenger, "clock_corrections", None)
        if corrections is not None:
            self.stats.clock_corrections, self.stats.clock_changes = corrections()
        self.stats.clock_learning = getattr(self.messenger, "clock_learned", "")
        payload = getattr(self.messenger, "payload_share", None)
        if payload is not None:
            self.stats.payload = payload()

    def _tick(self) -> None:
        if self._progress is not None and clock.monotonic() >= self._next_progress:
            self._collect()
            self._progress(self)
            self._next_progress = clock.monotonic() + self._every

    def _end(self, entries: dict[str, Any]) -> bool:
        """Whether entries say every parent ended; if so, relay an abort or (unless
        quiesced) publish this node's end of stream."""
        if not all(e is not None and (e["is_stop_signal"] or e["is_abort"])
                   for e in entries.values()):
            return False
        aborted = next((e for e in entries.values() if e["is_abort"]), None)
        if self.messenger.stop_reason() == STOP_QUIESCE:
            self.stats.outcome = "quiesced"
        elif aborted is not None:
            self.stats.outcome = "aborted"
            error = aborted["abort_error"] or {}
            self.stats.error = (f"{aborted['abort_origin']} died: {error.get('type', '?')}: "
                                f"{error.get('message', '')}")
            if self.node.kind != "consumer":
                self.messenger.publish_abort(  # type: ignore[attr-defined]
                    aborted["abort_error"], origin=aborted["abort_origin"])
        else:
            self.stats.outcome = "ended"
            if self.node.kind != "consumer":
                self.messenger.publish_stop_signal()
        return True

    def _inputs(self, entries: dict[str, Any]) -> list[Any]:
        """One input per parent, in wiring order: the message, None for a parent
        missing from a quorum group, a list for a collect window."""
        latency = getattr(self.messenger, "last_join_latency", None)
        self._arrived = clock.monotonic()
        if latency is not None:
            self.stats.add_latency(latency)
            self._arrived -= latency
        order = self.context.parents or tuple(entries)
        return [None if entries[p] is None else entries[p]["message"] for p in order]

    def _consume_inputs(self, apply: Callable[..., Any]) -> None:
        while True:
            self._tick()
            entries = self.messenger.receive_message()
            if self._end(entries):
                return
            in_node = True
            try:
                output = apply(*self._inputs(entries))
                in_node = False
                if self.node.kind == "processor":
                    # In flight once this returns; an output carrying a checkpoint is
                    # waited for, and its failure is the group's (PublicationFailed).
                    self.messenger.publish_message(output, self.context.take_metadata())
                    self.stats.emitted += 1
            except LedgerError:
                raise  # a refused checkpoint or a superseded owner: this process must stop
            except Exception as error:  # every failure of the node goes to the policy
                self.stats.failed += 1
                if in_node:  # its own code's: a publication's failure is the report's
                    self._log_failure(error)
                self.messenger.fail_inputs(error)
                continue
            self.messenger.ack_inputs()
            self.stats.processed += 1
            self.stats.did_one()
            self.stats.hop_latency.observe(clock.monotonic() - self._arrived)


    def _log_failure(self, error: Exception) -> None:
        """Log what the node raised, with its traceback: the first of its type in this
        task at WARNING, the others at INFO (module docstring)."""
        kind = type(error)
        first = kind not in self._raised
        self._raised.add(kind)
        info = self.context.input_info or {}
        inputs = ", ".join(f"{parent} {one['trace_id']}:{one['seq']}"
                           for parent, one in info.items()
                           if one is not None and one.get("trace_id") is not None)
        logger.log(logging.WARNING if first else logging.INFO,
                   "%s raised on its input%s: %s; its delivery policy retries or gives it "
                   "up%s", self.context.node_name, f" ({inputs})" if inputs else "",
                   _describe(error),
                   f" (the first {kind.__name__} here: the next ones at INFO, shown with -v)"
                   if first else "", exc_info=error)


class ProducerTask(Task):
    """next() until StopIteration or a stop; each output published (confirmed)."""

    node: ProducerNode

    def _loop(self) -> None:
        node = self.node
        if node.replayable:
            offset = self.messenger.resume_offset()  # type: ignore[attr-defined]
            if offset:
                node.resume(offset)
        while not self.messenger.check_for_termination():
            self._tick()
            try:
                output = node.next()
            except StopIteration:
                break
            self.messenger.publish_message(output, self.context.take_metadata())
            self.stats.emitted += 1
            self.stats.did_one()
        if self.messenger.stop_reason() == STOP_QUIESCE:
            self.stats.outcome = "quiesced"
        else:
            self.messenger.publish_stop_signal()
            self.stats.outcome = "ended"


class ProcessorTask(Task):
    """process(*inputs) per group; its output published before the inputs are acked."""

    node: ProcessorNode

    def _loop(self) -> None:
        self._consume_inputs(self.node.process)


class ConsumerTask(Task):
    """consume(*inputs) per group; the inputs acked after it returns."""

    node: ConsumerNode

    def _loop(self) -> None:
        self._consume_inputs(self.node.consume)


def task_for(node: Node, messenger: Messenger, context: RuntimeContext,
             **options: Any) -> Task:
    """The task of the node's kind.

    Raises:
        TypeError: node is none of ProducerNode, ProcessorNode, ConsumerNode.
    """
    for kind, task in ((ProducerNode, ProducerTask), (ProcessorNode, ProcessorTask),
                       (ConsumerNode, ConsumerTask)):
        if isinstance(node, kind):
            return task(node, messenger, context, **options)
    raise TypeError(f"{node!r} is not a ProducerNode, ProcessorNode or ConsumerNode")


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


__all__ = ["ConsumerTask", "ProcessorTask", "ProducerTask", "RuntimeContext", "Task",
           "TaskStats", "task_for"]
