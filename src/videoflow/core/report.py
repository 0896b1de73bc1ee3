"""RunReport: what a run did, per node, summed over its replicas."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0-100) by nearest rank; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, math.ceil(q / 100.0 * len(ordered)) - 1))
    return ordered[rank]


@dataclass
class ProcessDeath:
    """One replica process that died without its final report.

    Attributes:
        replica: the replica's key ('<node>[<i>]').
        pid: the process's id.
        how: how it ended: 'killed by SIGKILL', 'exit code 1'.
        at_seconds: when the engine saw it dead, in seconds from the run's start.
        in_hand: the deliveries its node was processing, as '<parent>:<stream_seq>'
            (each counted one death towards its crash_limit).
        restarted: whether the replica was started again (False: given up on).
    """

    replica: str
    pid: int | None
    how: str
    at_seconds: float
    in_hand: list[str] = field(default_factory=list)
    restarted: bool = True

    def describe(self) -> str:
        """One line: which process, how, when, what it held, what followed."""
        held = f", processing {', '.join(self.in_hand)}" if self.in_hand else ""
        then = "started again" if self.restarted else "not started again"
        return (f"process {self.pid} {self.how} {self.at_seconds:.1f} s into the run"
                f"{held}; {then}")


def _codec_line(codec: str, counts: Mapping[str, float]) -> str:
    """What one codec did at a node, in words: encoded (bytes before and after, ms per
    array) and decoded (ms per array)."""
    parts = []
    encoded, decoded = int(counts.get("encoded", 0)), int(counts.get("decoded", 0))
    if encoded:
        raw, coded = counts.get("raw_bytes", 0), counts.get("coded_bytes", 0)
        share = f" ({coded / raw:.1%})" if raw else ""
        parts.append(f"encoded {encoded} arrays, {raw / 1e6:,.1f} MB -> {coded / 1e6:,.1f} MB"
                     f"{share}, {1e3 * counts.get('encode_seconds', 0.0) / encoded:.2f} ms each")
    if decoded:
        parts.append(f"decoded {decoded}, "
                     f"{1e3 * counts.get('decode_seconds', 0.0) / decoded:.2f} ms each")
    return f"codec {codec}: " + ("; ".join(parts) or "nothing yet")


@dataclass
class NodeReport:
    """One node over all its replicas.

    Attributes:
        kind: producer, processor or consumer.
        replicas: how many ran (restarts not counted).
        processed / emitted / failed / dead_lettered: summed over replicas.
        dropped: drops by reason, summed. 'superseded' (REALTIME): outputs of a parent
            this node never worked on: replaced on the stream by newer ones before it
            read them (the parents' emitted less this node's first deliveries), or
            read and skipped for a newer one waiting (videoflow.messaging.freshness).
        received: first deliveries per parent, summed.
        seconds: from the first replica's start to the last one's end.
        throughput: processed per second (emitted per second for a producer), over its
            active span: from its first output or processed group to its last, so
            the time it took to start, or waited for its first input, is not counted
            (a camera at 30 fps reads 30). 0.0 when it did nothing; None (unknown)
            when it did one thing only, or its replicas did not say when.
        join_latency_p50_ms / join_latency_p99_ms: over every group's wait at the
            node, from its first member's arrival to the node taking the group: the
            wait for a join's other members, and time queued behind earlier groups
            (the report's 'wait' columns); None for a producer, or when no group was
            received.
        watermark_lag_max_ms: a time join's parents, the most each one's event-time
            watermark fell behind the most advanced parent's, over every replica (the
            clock-skew and lag diagnostic); {} for other nodes.
        outcomes: per replica, how it ended ('ended', 'quiesced', 'aborted',
            'failed', 'lost' when its process died without a word and was not started
            again); per dead process of a restarted replica ('<replica>~<n>'),
            'restarted'. The counts include what those processes last reported.
        errors: per replica that failed, was lost or relayed an abort, why: the error
            its final report gave, or for a lost one 'lost after N restarts' and how
            its last process ended.
        publications: the outcomes of what it published, its end markers included,
            summed: accepted, duplicate, unknown (no receipt came: on the broker's
            stream or not), dropped, rejected.
        redelivered_done: a join's inputs that came again after it had acknowledged
            them (the ack lost on its way: a failover), acknowledged again and not
            grouped again, summed over its processes.
        unconfirmed: outputs handed to the broker whose outcome never came, by the
            final reports of its replicas (a process that failed with outputs in
            flight, its broker lost): on the broker's stream or not. What a process
            that died without a word had in flight is not known, so not counted.
        held_back_seconds: a time join's parents, how long its event-time alignment
            held each back (left it on the broker while it ran ahead), the most any
            replica did; {} for other nodes.
        waiting_on: the parents a join's oldest incomplete group waited for as its
            replicas last reported, each with why ('budget', 'silent', 'behind'):
            what a run that stalled or was stopped waited for; {} when nothing did.
        clock_offsets_ms: a time join's parents, each one's clock offset as its
            replicas last estimated it (positive: its event times read ahead of the
            other parents'), ms; {} for other nodes and parents not estimated.
        clock_advice: per parent whose offset is worth correcting, in words, with the
            clock_offsets setting that corrects it.
        clock_corrections_ms: a time join's corrections of its parents' event times
            at its end, ms (clock_offsets, moved by a running correction).
        clock_changes: how many times a running correction moved each.
        clock_learning: per replica whose running correction learned before its
            first group, how that ended, in words.
        payload_waited_seconds: how long its replicas waited for room in their shares
            of the shared-memory payload budget, in all; None when it wrote none there.
        payload_share_bytes: their shares of that budget, summed, as last reported
            (None as above).
        codecs: what each codec did in its replicas, summed (wire.codecs'
            counts): arrays encoded, their raw and coded bytes, encode seconds; arrays
            decoded, decode seconds. {} when no codec ran.
        restarts: replica processes started again after dying.
        deaths: every process that died without its final report, in order: which,
            how, when, what it had in hand, whether it was started again.
        cpu_seconds: the CPU time its replica processes spent, every thread of each,
            from its start (node open() included, the process's own startup not) to
            its end, summed; None (unknown) when a process did not say: one that died
            or was restarted, one run by a worker elsewhere, or a run in one process.
    """

    kind: str
    replicas: int = 0
    processed: int = 0
    emitted: int = 0
    failed: int = 0
    dead_lettered: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    received: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    throughput: float | None = 0.0
    join_latency_p50_ms: float | None = None
    join_latency_p99_ms: float | None = None
    watermark_lag_max_ms: dict[str, float] = field(default_factory=dict)
    outcomes: dict[str, str] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    publications: dict[str, int] = field(default_factory=dict)
    unconfirmed: int = 0
    redelivered_done: int = 0
    held_back_seconds: dict[str, float] = field(default_factory=dict)
    waiting_on: dict[str, str] = field(default_factory=dict)
    clock_offsets_ms: dict[str, float] = field(default_factory=dict)
    clock_advice: dict[str, str] = field(default_factory=dict)
    clock_corrections_ms: dict[str, float] = field(default_factory=dict)
    clock_changes: dict[str, int] = field(default_factory=dict)
    clock_learning: list[str] = field(default_factory=list)
    payload_waited_seconds: float | None = None
    payload_share_bytes: int | None = None
    codecs: dict[str, dict[str, float]] = field(default_factory=dict)
    restarts: int = 0
    deaths: list[ProcessDeath] = field(default_factory=list)
    cpu_seconds: float | None = None

    @property
    def dropped_total(self) -> int:
        return sum(self.dropped.values())

    @classmethod
    def from_replicas(cls, kind: str, replicas: Mapping[str, Mapping[str, Any]],
                      restarts: int = 0, deaths: Sequence[ProcessDeath] = ()) -> NodeReport:
        """Sum replica stats (TaskStats.snapshot() plus 'join_latencies'; 'error' says
        why a replica failed or was lost), with the processes that died."""
        # A key '<replica>~<n>' is a process of that replica that died and was started
        # again (its counts as last reported), not another replica.
        report = cls(kind=kind, replicas=sum("~" not in key for key in replicas),
                     restarts=restarts, deaths=list(deaths))
        starts: list[float] = []
        ends: list[float] = []
        firsts: list[float] = []
        lasts: list[float] = []
        latencies: list[float] = []
        cpu: list[float | None] = []
        for key, stats in replicas.items():
            report.processed += stats.get("processed", 0)
            report.emitted += stats.get("emitted", 0)
            report.failed += stats.get("failed", 0)
            report.dead_lettered += stats.get("dead_lettered", 0)
            report.redelivered_done += int(stats.get("redelivered_done", 0))
            for reason, n in (stats.get("drops") or {}).items():
                report.dropped[reason] = report.dropped.get(reason, 0) + n
            for parent, n in (stats.get("received") or {}).items():
                report.received[parent] = report.received.get(parent, 0) + n
            outcomes = stats.get("publications") or {}
            for outcome, n in outcomes.items():
                report.publications[outcome] = report.publications.get(outcome, 0) + n
            if "~" not in key and stats.get("outcome") in _FINAL:
                # Its end marker, when it published one, is an outcome with no output.
                report.unconfirmed += max(0, int(stats.get("emitted", 0))
                                          - sum(int(n) for n in outcomes.values()))
            report.outcomes[key] = stats.get("outcome", "lost")
            if stats.get("error"):
                report.errors[key] = stats["error"]
            if stats.get("started") is not None:
                starts.append(stats["started"])
            if stats.get("ended") is not None:
                ends.append(stats["ended"])
            if stats.get("first") is not None and stats.get("last") is not None:
                firsts.append(stats["first"])
                lasts.append(stats["last"])
            latencies += stats.get("join_latencies") or []
            cpu.append(stats.get("cpu_seconds"))
            for parent, lag in (stats.get("watermark_lag_max") or {}).items():
                most = report.watermark_lag_max_ms
                most[parent] = max(most.get(parent, 0.0), lag * 1000.0)
            for parent, seconds in (stats.get("held_back") or {}).items():
                held = report.held_back_seconds
                held[parent] = max(held.get(parent, 0.0), float(seconds))
            if "~" not in key:
                report.waiting_on.update(stats.get("waiting_on") or {})
                for parent, estimate in (stats.get("clock_offsets") or {}).items():
                    report.clock_offsets_ms[parent] = 1000.0 * float(estimate["offset_s"])
                report.clock_advice.update(stats.get("clock_advice") or {})
                for parent, seconds in (stats.get("clock_corrections") or {}).items():
                    report.clock_corrections_ms[parent] = 1000.0 * float(seconds)
                report.clock_changes.update(stats.get("clock_changes") or {})
                if stats.get("clock_learning"):
                    report.clock_learning.append(str(stats["clock_learning"]))
            for name, counts in (stats.get("codecs") or {}).items():
                into = report.codecs.setdefault(name, {})
                for field_name, value in counts.items():
                    into[field_name] = into.get(field_name, 0) + value
            payload = stats.get("payload")
            if payload:
                report.payload_waited_seconds = (report.payload_waited_seconds or 0.0) + float(
                    payload.get("waited_seconds") or 0.0)
                if "~" not in key:
                    report.payload_share_bytes = (report.payload_share_bytes or 0) + int(
                        payload.get("share_bytes") or 0)
        if starts and ends:
            report.seconds = max(0.0, max(ends) - min(starts))
        known = [float(seconds) for seconds in cpu if seconds is not None]
        if cpu and len(known) == len(cpu):  # one process unknown: the sum is too
            report.cpu_seconds = sum(known)
        count = report.emitted if kind == "producer" else report.processed
        report.throughput = _rate(count, firsts, lasts)
        p50, p99 = percentile(latencies, 50), percentile(latencies, 99)
        report.join_latency_p50_ms = None if p50 is None else p50 * 1000.0
        report.join_latency_p99_ms = None if p99 is None else p99 * 1000.0
        return report


@dataclass
class RunReport:
    """A finished run.

    Attributes:
        flow_id / run_id / flow_type / nats_url: which run, where.
        outcome: 'completed' (every node reached its end of stream), 'stopped' (a
            stop was requested and the flow wound down), or 'failed' (a node died,
            or a replica could not be kept running).
        seconds: wall-clock duration.
        nodes: NodeReport by node name, in the flow's order.
        torn_down: whether the run's streams were deleted (never the DLQ).
        kept: when they were not: what was kept and how to resume the run or delete
            it ('' when torn down, or when teardown was not asked for).
        stopped_by: what asked the run to stop: 'SIGINT' or 'SIGTERM' (the first
            signal the engine counted: Ctrl-C, `kill`, `docker stop`), 'stop_after';
            None when nothing did (its producers ended, or it failed).
        left_over: the run was kept with work left over (RunTeardown.left_over): not
            done, whatever its outcome says; a resume takes it up.
        dead_letters: when its nodes dead-lettered inputs, how many, and the command
            that lists them ('' when none did): the report's last line.
    """

    flow_id: str
    run_id: str
    flow_type: str
    nats_url: str
    outcome: str = "completed"
    seconds: float = 0.0
    nodes: dict[str, NodeReport] = field(default_factory=dict)
    torn_down: bool = False
    kept: str = ""
    stopped_by: str | None = None
    left_over: bool = False
    dead_letters: str = ""

    @property
    def ok(self) -> bool:
        return self.outcome != "failed"

    @property
    def dead_lettered(self) -> int:
        """Inputs its nodes dead-lettered, summed (as their replicas last reported)."""
        return sum(n.dead_lettered for n in self.nodes.values())

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def format(self, width: int | None = None) -> str:
        """A plain-text table, one line per node; then each parent's lag behind, each
        process death (restarted or not) and each replica's failure, with its reason.

        Arguments:
            width: the columns the table must fit in (a terminal's), or None for all
                of it. Columns go as fit_columns says, and a heading too long for it
                is wrapped at its words; the lines after the table are prose, wrapped
                by the terminal.
        """
        restarts = sum(n.restarts for n in self.nodes.values())
        by = "" if self.stopped_by is None else (
            " by stop_after" if self.stopped_by == "stop_after" else f" by {self.stopped_by}")
        head = (f"run {self.run_id} of flow {self.flow_id!r} ({self.flow_type}): "
                f"{self.outcome}{by} in {self.seconds:.1f} s"
                + (f", {restarts} restart{'s' if restarts != 1 else ''}" if restarts else "")
                # Stopped or even 'completed', it is not done: never read as a success.
                + (", unfinished: work left over, kept" if self.left_over else ""))
        rows: list[tuple[str, ...]] = [
            ("node", "kind", "processed", "emitted", "rate/s", "dropped", "dead-let.",
             "wait p50 ms", "wait p99 ms")]
        for name, n in self.nodes.items():
            rows.append((name, n.kind, str(n.processed), str(n.emitted),
                         _tenths(n.throughput), _drops(n.dropped), str(n.dead_lettered),
                         _tenths(n.join_latency_p50_ms), _tenths(n.join_latency_p99_ms)))
        if width is not None:
            rows = fit_columns(rows, width)
        heading = [head] if width is None else textwrap.wrap(
            head, width, subsequent_indent="  ", break_long_words=False,
            break_on_hyphens=False)
        lines = [*heading, *format_table(rows, left=2 if rows[0][1] == "kind" else 1)]
        for name, n in self.nodes.items():
            if any(n.watermark_lag_max_ms.values()):
                lags = sorted(n.watermark_lag_max_ms.items(), key=lambda kv: -kv[1])
                lines.append(f"  {name}: parents' event time behind the most advanced, at "
                             "most: " + ", ".join(f"{p} {lag:.1f} ms" for p, lag in lags))
            lines += [f"  {name}: {advice}" for advice in n.clock_advice.values()]
            lines += [f"  {name}: {learned}" for learned in n.clock_learning]
            if any(n.clock_corrections_ms.values()):
                lines.append(f"  {name}: clock corrections at the end: " + ", ".join(
                    f"{p} {ms:+.1f} ms" + (f" ({n.clock_changes[p]} running moves)"
                                           if n.clock_changes.get(p) else "")
                    for p, ms in n.clock_corrections_ms.items() if ms))
        for name, n in self.nodes.items():
            held = sorted(((p, s) for p, s in n.held_back_seconds.items() if s >= 0.05),
                          key=lambda kv: -kv[1])
            if held:
                lines.append(f"  {name}: held back by event-time alignment (ahead of the "
                             "slowest parent): " + ", ".join(f"{p} {s:.1f} s" for p, s in held))
            if n.waiting_on:
                lines.append(f"  {name}: its oldest group waited for " + ", ".join(
                    f"{p} ({why})" for p, why in n.waiting_on.items()))
            if n.payload_waited_seconds:
                share = ("" if not n.payload_share_bytes
                         else f" of {n.payload_share_bytes / 2**20:.0f} MB")
                lines.append(f"  {name}: waited {n.payload_waited_seconds:.1f} s for room in "
                             f"its shared-memory payload share{share}")
            for codec, c in sorted(n.codecs.items()):
                lines.append(f"  {name}: {_codec_line(codec, c)}")
        for n in self.nodes.values():
            # A replica lost at its last death: its 'lost' line below tells that death.
            last = {death.replica: death for death in n.deaths}
            told = {id(last[key]) for key, outcome in n.outcomes.items()
                    if outcome == "lost" and key in last}
            for death in n.deaths:
                if id(death) not in told:
                    lines.append(f"  {death.replica} died: {death.describe()}")
        if any(n.deaths for n in self.nodes.values()):
            # A report a second: what a killed process did after its last is unknown.
            lines.append("  the counts hold what each process that died last reported "
                         "(once a second): what it did after that is not in them")
        for name, n in self.nodes.items():
            if n.redelivered_done:
                lines.append(f"  {name}: {n.redelivered_done} inputs came again after it had "
                             "acknowledged them (the acks lost on their way): acknowledged "
                             "again, not grouped again")
            unsure = n.unconfirmed + n.publications.get("unknown", 0)
            if unsure:
                lines.append(f"  {name}: {unsure} of its {n.emitted} outputs unconfirmed: "
                             "the broker never said whether it kept them")
        for n in self.nodes.values():
            for key, error in n.errors.items():
                lines.append(f"  {key} {n.outcomes.get(key, '')}: {error}")
        if self.kept:
            lines.append(f"  {self.kept}")
        if self.dead_letters:
            lines.append(f"  {self.dead_letters}")
        return "\n".join(lines)


def _rate(count: int, firsts: Sequence[float], lasts: Sequence[float]) -> float | None:
    """count things a second over the span from the first to the last: count - 1
    intervals (the first thing starts it). 0.0 for none; None (unknown) for a single
    one, or without a span."""
    if count == 0:
        return 0.0
    span = max(lasts) - min(firsts) if firsts else 0.0
    return (count - 1) / span if count > 1 and span > 0 else None


_FINAL = ("ended", "failed", "aborted", "quiesced")
"""The outcomes of a replica's final report (its counts as it ended)."""


def _tenths(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _drops(dropped: Mapping[str, int]) -> str:
    total = sum(dropped.values())
    if not total:
        return "0"
    return f"{total} (" + ", ".join(f"{k} {v}" for k, v in dropped.items() if v) + ")"


_FIT_ORDER = ("wait p99 ms", "wait p50 ms", "kind", "rate/s", "processed")
_SAID_IF_ANY = ("dropped", "dead-let.")


def fit_columns(rows: list[tuple[str, ...]], width: int) -> list[tuple[str, ...]]:
    """The report's rows with columns left out until format_table's lines fit in
    width: first a drop or dead-letter column with nothing in it (all '0'), then the
    waits, the kind and the rate; then processed and emitted become one
    'done' column (what a node processed, or a producer, which processes nothing,
    emitted), as the live view shows it. The node, what it did, and any drops or dead
    letters stay, whatever the width."""
    header = rows[0]
    order = [c for c in _SAID_IF_ANY
             if c in header and all(r[header.index(c)] == "0" for r in rows[1:])]
    order += [c for c in _FIT_ORDER if c in header]

    def too_wide(kept: list[tuple[str, ...]]) -> bool:
        return max(len(line) for line in format_table(kept)) > width

    for column in order:
        if not too_wide(rows):
            break
        i = rows[0].index(column)
        if column == "processed" and "emitted" in rows[0]:
            j = rows[0].index("emitted")
            done = [("done",)] + [(r[i] if r[i] != "0" else r[j],) for r in rows[1:]]
            rows = [r[:i] + d + r[i + 1:j] + r[j + 1:] for r, d in zip(rows, done,
                                                                       strict=True)]
            continue
        rows = [r[:i] + r[i + 1:] for r in rows]
    return rows


def format_table(rows: Iterable[tuple[str, ...]], left: int = 1) -> list[str]:
    """Rows as indented, aligned lines: the first `left` columns left-aligned, the
    rest (numbers) right-aligned."""
    rows = list(rows)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(c.ljust(w) if i < left else c.rjust(w)
                             for i, (c, w) in enumerate(zip(r, widths, strict=True)))
            for r in rows]


__all__ = ["NodeReport", "ProcessDeath", "RunReport", "fit_columns", "format_table",
           "percentile"]
