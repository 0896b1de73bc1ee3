"""The live view of a running flow: per node, how much it did and at what rate, what
waits for it, its drops and dead letters, for a time join the parent furthest behind in
event time, and its restarts.

A node's rate is measured between reports: per replica, the change of its count
between two consecutive reports over the change of the replica's own clock ('at' in
its snapshot), summed over the node's replicas. A redraw between two reports shows the
rate last measured; a replica that ended counts 0, and so does one silent for
STALE_SECONDS (it reports every second while its loop turns, so it completed nothing
meanwhile). An unknown pending count is shown as unknown, never as 0.

On a terminal the view is a rich Live table redrawn in place (at most 4 times a
second), laid out for the terminal's width at every draw: the less telling columns go
first when it is narrow, and no row ever wraps. What the run writes goes above it,
line by line, never under it: the engine's prints and logs, and the replicas' stdout
and stderr, which OutputRelay reads from pipes in their file descriptors' place and
prints prefixed by the replica ('[scale/0] '). Otherwise (a log, a pipe, CI) it prints
a plain table every interval in which it changed -- or, when the command logs json,
one JSON line in the logs' shape -- and the replicas write where the engine does.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TextIO

from videoflow.core.report import format_table
from videoflow.logs import in_json, json_line
from videoflow.run.metrics import per_durable

STALE_SECONDS = 3.0
"""How long a running replica may go without a report before it counts 0 in its
node's rate (replicas report every second while their loop turns)."""

RELAY_WAIT_SECONDS = 2.0
"""How long closing the view waits for the replicas' last lines (their pipes' ends)."""

_HEADERS = ("node", "done", "rate/s", "pending", "dropped", "dead-let.", "behind",
            "restarts", "held back", "shm", "clock")
# Which columns go first when the terminal is narrow (the highest first); a column
# with nothing to say (only '0' and '-') goes before any that has.
_DROP_ORDER = {"node": 0, "rate/s": 1, "pending": 1, "behind": 2, "done": 3,
               "restarts": 3, "dropped": 4, "dead-let.": 5, "held back": 2, "shm": 1,
               "clock": 3}
_OPTIONAL = ("held back", "shm", "clock")
"""Columns a flow without a time join holding back, without a payload budget, or
without a parent's clock off, never fills: left out of the table when every row has
'-' there."""
_MB = 1024 * 1024


@dataclass
class _Pace:
    """A replica's last report as the rate sees it."""

    started: Any  # the process's start ('started'): a restarted process is a new one
    at: float  # the replica's clock at that report
    count: int
    heard: float  # the view's clock when it first saw that report
    rate: float | None = None  # per second, between that report and the one before


@dataclass
class NodeProgress:
    """The latest word from each replica of one node, folded.

    Attributes:
        replicas: the latest snapshot per replica key.
        pending: per replica, messages waiting (int) or the reason it is unknown (str).
        restarts: how often one of its processes was started again.
    """

    kind: str
    replicas: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    pending: dict[str, int | str] = field(default_factory=dict)
    restarts: int = 0
    _paces: dict[str, _Pace] = field(default_factory=dict, repr=False)

    def _count(self, stats: Mapping[str, Any]) -> int:
        return int(stats.get("emitted" if self.kind == "producer" else "processed", 0))

    def count(self) -> int:
        return sum(self._count(s) for s in self.replicas.values())

    def total(self, key: str) -> int:
        return sum(int(s.get(key, 0)) for s in self.replicas.values())

    def drops(self) -> int:
        return sum(sum((s.get("drops") or {}).values()) for s in self.replicas.values())

    def pending_count(self, now: float | None = None) -> int | str | None:
        """Messages waiting for the node, or why that is unknown (never 0 for unknown);
        None for a producer, which nothing waits for.

        Arguments:
            now: the view's monotonic clock: a running replica silent for longer than
                STALE_SECONDS (stuck in its node's code, or on a broker that is away)
                makes the count unknown, not the one it last reported. None: as
                reported.
        """
        if self.kind == "producer":
            return None
        if not self.pending:
            return "unread"
        if now is not None:
            silent = [now - pace.heard for key, pace in self._paces.items()
                      if now - pace.heard > STALE_SECONDS
                      and self.replicas.get(key, {}).get("outcome", "running") == "running"
                      and not self.replicas.get(key, {}).get("ended")]
            if silent:
                return f"no word for {max(silent):.0f} s"
        unknown = [v for v in self.pending.values() if isinstance(v, str)]
        if unknown:
            return unknown[0]
        return self._unsettled()

    def _unsettled(self) -> int:
        """The inputs not yet settled, as counted per data durable (metrics.per_durable:
        a durable the replicas share once, not once per replica): available, leased and
        unresolved. What a replica holds (prefetched, in open groups) is leased, so in
        that count already. A replica that ended, or whose report has no per-durable
        counts, gives its own total."""
        total, reading = 0, []
        for key, word in self.pending.items():
            stats = self.replicas.get(key, {})
            if stats.get("ended") is not None or not stats.get("subscriptions"):
                total += int(word)
            else:
                reading.append(stats)
        return total + sum(int(seen["available"]) + int(seen["leased"])
                           + int(seen["unresolved"])
                           for seen in per_durable(reading).values())

    def pending_text(self, now: float | None = None) -> str:
        pending = self.pending_count(now)
        if pending is None:
            return "-"
        return f"unknown ({pending})" if isinstance(pending, str) else str(pending)

    def behind(self) -> tuple[str, float] | None:
        """A time join's parent furthest behind the most advanced one in event time,
        and by how many seconds, as of the latest word of its running replicas (None
        for other nodes, when none is behind, and once every replica ended: the lag
        its last word said is over)."""
        lags: dict[str, float] = {}
        for stats in self.replicas.values():
            if stats.get("outcome", "running") != "running" or stats.get("ended"):
                continue
            for parent, lag in (stats.get("watermark_lag") or {}).items():
                lags[parent] = max(lags.get(parent, 0.0), lag)
        parent = max(lags, key=lambda p: lags[p], default=None)
        if parent is None or lags[parent] <= 0:
            return None
        return parent, lags[parent]

    def waiting_on(self) -> dict[str, str]:
        """The parents a join's oldest incomplete group waits for, each with why
        ('budget', 'silent' or 'behind'), as of the latest word of its replicas."""
        waiting: dict[str, str] = {}
        for stats in self.replicas.values():
            if stats.get("outcome", "running") == "running" and not stats.get("ended"):
                waiting.update(stats.get("waiting_on") or {})
        return waiting

    def behind_text(self) -> str:
        """The parent furthest behind and by how much, with why the join waits for
        it when that is not just its input on its way ('cam2 3000 ms, silent'); a
        parent waited for but not heard from at all, by name and why alone."""
        behind, waiting = self.behind(), self.waiting_on()
        stalled = {p: why for p, why in waiting.items() if why != "behind"}
        if behind is None:
            parent = next(iter(stalled), None)
            return "-" if parent is None else f"{parent} {stalled[parent]}"
        text = f"{behind[0]} {behind[1] * 1000.0:.0f} ms"
        why = stalled.get(behind[0])
        return text if why is None else f"{text}, {why}"

    def clock_advice(self) -> dict[str, str]:
        """A time join's parents whose clocks are off enough to correct, in words
        (videoflow.messaging.clock_estimates), as of the latest word of its replicas."""
        advice: dict[str, str] = {}
        for stats in self.replicas.values():
            advice.update(stats.get("clock_advice") or {})
        return advice

    def clock_text(self) -> str:
        """The parents whose clocks are off enough to correct ('cam2 +19.8 ms'), '-'
        for none."""
        offsets: dict[str, float] = {}
        for stats in self.replicas.values():
            estimates = stats.get("clock_offsets") or {}
            for parent in stats.get("clock_advice") or {}:
                if parent in estimates:
                    offsets[parent] = float(estimates[parent]["offset_s"])
        return ", ".join(f"{p} {o * 1000.0:+.1f} ms" for p, o in offsets.items()) or "-"

    def payload(self) -> tuple[int, int, bool] | None:
        """What the node's replicas hold of a budgeted payload store: (bytes held,
        their shares, whether one of them waits for room); None when none writes
        there."""
        found = [s["payload"] for s in self.replicas.values() if s.get("payload")]
        if not found:
            return None
        return (sum(int(p.get("held_bytes") or 0) for p in found),
                sum(int(p.get("share_bytes") or 0) for p in found),
                any(p.get("waiting_seconds") is not None for p in found))

    def payload_text(self) -> str:
        """'held/share MB', with ' wait' while a replica waits for room; '-' for a
        node that writes no payload there."""
        payload = self.payload()
        if payload is None:
            return "-"
        held, share, waiting = payload
        return f"{held / _MB:.0f}/{share / _MB:.0f} MB" + (" wait" if waiting else "")

    def mark(self, now: float) -> None:
        """Fold the replicas' latest reports into their rates: a report not seen before
        gives its replica the rate since its previous one.

        Arguments:
            now: the view's monotonic clock (when the reports were seen).
        """
        for key, stats in self.replicas.items():
            at = stats.get("at")
            if not isinstance(at, (int, float)):
                continue  # a report without its clock gives no rate
            count, pace = self._count(stats), self._paces.get(key)
            if pace is None or pace.started != stats.get("started") or count < pace.count:
                self._paces[key] = _Pace(stats.get("started"), at, count, now)
            elif at > pace.at:
                pace.rate = (count - pace.count) / (at - pace.at)
                pace.at, pace.count, pace.heard = at, count, now
        for key in self._paces.keys() - self.replicas.keys():
            del self._paces[key]

    def rate(self, now: float) -> float | None:
        """Per second, summed over the replicas, as of the last mark; None while a
        running replica has none yet (before its second report).

        Arguments:
            now: the view's monotonic clock.
        """
        if not self.replicas:
            return None
        rates: list[float | None] = []
        for key, stats in self.replicas.items():
            if stats.get("outcome", "running") != "running" or stats.get("ended"):
                continue  # it ended, or is a process that died: nothing more from it
            pace = self._paces.get(key)
            if pace is not None and now - pace.heard > STALE_SECONDS:
                rates.append(0.0)  # its loop has not turned since: it completed nothing
            else:
                rates.append(None if pace is None else pace.rate)
        if not rates:
            return 0.0  # every replica ended
        if any(r is None for r in rates):
            return None  # a sum without one of them would be too low
        return sum(r for r in rates if r is not None)


def held_back(nodes: Mapping[str, NodeProgress]) -> dict[str, tuple[float, bool]]:
    """Per node, how long the time joins reading it held it back by event-time
    alignment (the most any join did) and whether one holds it back now: a row of
    its own in the view, read from its children's words."""
    held: dict[str, tuple[float, bool]] = {}
    for progress in nodes.values():
        for stats in progress.replicas.values():
            now = stats.get("held_back_now") or {}
            for parent, seconds in (stats.get("held_back") or {}).items():
                most, holding = held.get(parent, (0.0, False))
                running = stats.get("outcome", "running") == "running"
                held[parent] = (max(most, float(seconds)),
                                holding or (running and parent in now))
    return {parent: value for parent, value in held.items() if value[0] > 0 or value[1]}


def held_text(held: tuple[float, bool] | None) -> str:
    """'12.3 s', with ' now' while a join holds the node back; '-' for never."""
    if held is None:
        return "-"
    seconds, now = held
    return f"{seconds:.1f} s" + (" now" if now else "")


def progress_document(name: str, progress: NodeProgress, now: float,
                      held: tuple[float, bool] | None = None) -> dict[str, Any]:
    """One node's row of the view as JSON: done, rate_per_second (None while unknown),
    pending (None for a producer; when unknown, None and pending_unknown saying why),
    dropped, dead_lettered, behind ({parent, ms} or None), waiting_on ({parent: why}
    for a join whose oldest group waits), held_back ({seconds, now} when a time join
    held it back), payload ({held_bytes, share_bytes, waiting} when it writes into a
    budgeted store), clock_advice ({parent: words} for a time join's parents whose
    clocks are off) and restarts."""
    pending = progress.pending_count(now)
    behind = progress.behind()
    rate = progress.rate(now)
    document: dict[str, Any] = {
        "node": name, "done": progress.count(),
        "rate_per_second": None if rate is None else round(rate, 3),
        "pending": pending if isinstance(pending, int) else None}
    if isinstance(pending, str):
        document["pending_unknown"] = pending
    document.update(
        dropped=progress.drops(), dead_lettered=progress.total("dead_lettered"),
        behind=None if behind is None else {"parent": behind[0],
                                            "ms": round(behind[1] * 1000.0, 1)},
        restarts=progress.restarts)
    waiting, payload = progress.waiting_on(), progress.payload()
    if waiting:
        document["waiting_on"] = waiting
    if held is not None:
        document["held_back"] = {"seconds": round(held[0], 3), "now": held[1]}
    if payload is not None:
        document["payload"] = {"held_bytes": payload[0], "share_bytes": payload[1],
                               "waiting": payload[2]}
    advice = progress.clock_advice()
    if advice:
        document["clock_advice"] = advice
    return document


def rate_text(rate: float | None) -> str:
    """A rate as the view shows it: '-' while unknown, one decimal under 10."""
    if rate is None:
        return "-"
    return f"{rate:.1f}" if 0 < rate < 10 else f"{rate:.0f}"


class OutputRelay:
    """The replicas' stdout and stderr, read from pipes and handed over line by line.

    A replica process writes to its own file descriptors (print, a C extension, a
    traceback), which no redirection of the engine's sys.stdout reaches: the process
    puts a pipe in their place (RelayEnd.adopt), and a thread here reads it to its end.

    Arguments:
        write: called with a replica's prefix and a batch of its complete lines.
        fds: which of the replicas' descriptors go through the relay (1, 2).
    """

    def __init__(self, write: Callable[[str, list[str]], None],
                 fds: tuple[int, ...] = (1, 2)) -> None:
        self._write, self.fds = write, fds
        self._threads: list[threading.Thread] = []

    def open(self, prefix: str) -> RelayEnd:
        """A pipe for one process, read from now on; its lines are prefixed by prefix.

        Returns:
            the process's end, to hand to it and to close here once it started.
        """
        import multiprocessing

        reader, writer = multiprocessing.Pipe(duplex=False)
        thread = threading.Thread(target=self._pump, args=(reader, prefix), daemon=True,
                                  name=f"videoflow output {prefix.strip()}")
        self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()
        return RelayEnd(writer, self.fds)

    def wait(self, timeout: float) -> bool:
        """Wait for every pipe's end (its processes' exit), at most timeout seconds.

        Returns:
            whether every pipe ended.
        """
        deadline = time.monotonic() + timeout
        for thread in list(self._threads):
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self._threads)

    def _pump(self, reader: Any, prefix: str) -> None:
        held = b""
        try:
            while True:
                try:
                    chunk = os.read(reader.fileno(), 65536)
                except OSError:
                    break
                if not chunk:
                    break
                *lines, held = (held + chunk).split(b"\n")
                if len(held) > 65536:  # a line that never ends is shown in pieces
                    lines, held = [*lines, held], b""
                if lines:
                    self._write(prefix, [_decode(line) for line in lines])
            if held:
                self._write(prefix, [_decode(held)])
        finally:
            reader.close()


@dataclass
class RelayEnd:
    """A replica process's end of its OutputRelay pipe (it pickles to the spawned
    process with the descriptor)."""

    pipe: Any  # a multiprocessing Connection, write end
    fds: tuple[int, ...]

    def adopt(self) -> None:
        """In the replica process: the pipe in place of its stdout and stderr."""
        for fd in self.fds:
            os.dup2(self.pipe.fileno(), fd)
        self.pipe.close()
        # Line by line, as on the terminal these descriptors were when Python started.
        for stream in (sys.stdout, sys.stderr):
            reconfigure = getattr(stream, "reconfigure", None)
            if reconfigure is not None:
                reconfigure(line_buffering=True)

    def close(self) -> None:
        """In the engine, once the process started: its copy is the only writer."""
        self.pipe.close()


def _decode(line: bytes) -> str:
    return line.decode("utf-8", errors="replace").rstrip("\r")


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # None, or a closed stream
        return False


class LiveView:
    """Renders NodeProgress rows.

    Arguments:
        stream: where to write (stderr by default).
        interval: seconds between plain-line reports (redraws on a terminal follow
            every update, at most 4 per second).
        tty: force terminal (True) or plain (False) rendering; None asks the stream.
        width: on a terminal, draw for this many columns (None: the terminal's width,
            read at every draw).
        clock: the view's monotonic clock (when it saw a report, how long ago).
        json_lines: off a terminal, report as one JSON object per line in the json
            logs' shape (logger videoflow.run.progress, the nodes' figures under
            'nodes': progress_document) instead of a plain table; None: when the
            videoflow command logs json (--log-format json), so its stderr stays JSON
            lines throughout.
    """

    def __init__(self, stream: TextIO | None = None, interval: float = 2.0,
                 tty: bool | None = None, width: int | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 json_lines: bool | None = None) -> None:
        self.stream = stream or sys.stderr
        self.tty = _is_terminal(self.stream) if tty is None else tty
        self.json_lines = in_json() if json_lines is None else json_lines
        self.interval = interval if not self.tty else 0.25
        self.width, self.clock = width, clock
        self._next = 0.0
        self._lock = threading.RLock()
        self._live: Any = None  # a rich Live, while the view is drawn on a terminal
        self._board: _Board | None = None
        self._relay: OutputRelay | None = None
        self._handlers: list[tuple[logging.StreamHandler[Any], Any]] = []
        self._printed: Any = None  # off a terminal, the figures last printed

    def relay(self) -> OutputRelay | None:
        """On a terminal, the relay whose lines go above the view: the replicas'
        descriptors that would reach the terminal (stdout, stderr) go through it.
        None otherwise (and off POSIX, whose descriptors RelayEnd.adopt replaces):
        the replicas write where the engine does."""
        if not self.tty or os.name != "posix":
            return None
        if self._relay is None:
            fds = tuple(fd for fd in (1, 2) if os.isatty(fd))
            if not fds:
                return None
            self._relay = OutputRelay(self.print_lines, fds)
        return self._relay

    def update(self, title: str, nodes: Mapping[str, NodeProgress],
               extra: str = "", force: bool = False) -> None:
        now = self.clock()
        if not force and now < self._next:
            return
        self._next = now + self.interval
        for progress in nodes.values():
            progress.mark(now)
        heading = title + (f"  {extra}" if extra else "")
        held = held_back(nodes)
        if not self.tty and self.json_lines:
            documents = [progress_document(name, p, now, held.get(name))
                         for name, p in nodes.items()]
            if self._repeats((heading, documents)):
                return
            self.stream.write(json_line(__name__, heading, nodes=documents) + "\n")
            self.stream.flush()
            return
        table: list[tuple[str, ...]] = [
            (name, str(p.count()), rate_text(p.rate(now)), p.pending_text(now),
             str(p.drops()), str(p.total("dead_lettered")), p.behind_text(),
             str(p.restarts), held_text(held.get(name)), p.payload_text(), p.clock_text())
            for name, p in nodes.items()]
        headers, table = _without_empty_optional(table)
        if not self.tty:
            rows = [tuple(h for h in headers if h != "restarts"),
                    *(tuple(c for h, c in zip(headers, r, strict=True) if h != "restarts")
                      for r in table)]
            lines = [heading, *format_table(rows)]
            if self._repeats(lines):
                return
            self.stream.write("".join(f"{line}\n" for line in lines))
            self.stream.flush()
            return
        board = _Board(heading, table, headers)
        with self._lock:
            self._board = board
            if self._live is None:
                self._start(board)
            else:
                self._live.update(board, refresh=True)

    def _repeats(self, figures: Any) -> bool:
        """Off a terminal, whether figures are the ones printed last: a view that did
        not change is not printed again (the final one, forced as the run ends, after
        the last interval's showed every node done; a flow waiting to start)."""
        if figures == self._printed:
            return True
        self._printed = figures
        return False

    def print_lines(self, prefix: str, lines: list[str]) -> None:
        """Lines a replica wrote, above the view (plain once the view is closed)."""
        with self._lock:
            if self._live is None:
                self.stream.write("".join(f"{prefix}{line}\n" for line in lines))
                self.stream.flush()
                return
            from rich.text import Text

            text = Text("\n").join(Text(prefix, style="dim") + Text.from_ansi(line)
                                   for line in lines)
            # soft_wrap: a long line is wrapped by the terminal, not cut by rich.
            self._live.console.print(text, soft_wrap=True)

    def close(self) -> None:
        """End the drawing, once the replicas' last lines are printed (the table, as
        last drawn, stays on the screen). Lines that come later are printed plain."""
        if self._relay is not None:
            self._relay.wait(RELAY_WAIT_SECONDS)
        with self._lock:
            live, self._live = self._live, None
            if live is None:
                return
            try:
                live.stop()
            finally:
                for handler, stream in self._handlers:
                    handler.setStream(stream)
                self._handlers = []

    def _start(self, board: _Board) -> None:
        from rich.console import Console
        from rich.live import Live

        console = Console(file=self.stream, width=self.width, force_terminal=True,
                          force_interactive=True, highlight=False)
        # The engine's stdout goes above the view only when it is a terminal too:
        # redirected to a file, it stays there.
        live = Live(board, console=console, auto_refresh=False, transient=False,
                    redirect_stderr=True, redirect_stdout=_is_terminal(sys.stdout),
                    vertical_overflow="crop")
        originals = (sys.stderr, sys.stdout)
        live.start(refresh=True)
        self._live = live
        # A log handler holds the stream it was made with, not sys.stderr's proxy: its
        # records would be written under the table, and overwritten.
        for handler in logging.getLogger().handlers:
            if (isinstance(handler, logging.StreamHandler)
                    and not isinstance(handler, logging.FileHandler)
                    and handler.stream in originals):
                proxy = sys.stderr if handler.stream is originals[0] else sys.stdout
                if proxy is not handler.stream:
                    self._handlers.append((handler, handler.setStream(proxy)))


def _without_empty_optional(rows: list[tuple[str, ...]],
                            ) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    """The headers and rows without the optional columns no row fills (_OPTIONAL)."""
    keep = [i for i, h in enumerate(_HEADERS)
            if h not in _OPTIONAL or any(r[i] != "-" for r in rows)]
    return (tuple(_HEADERS[i] for i in keep),
            [tuple(r[i] for i in keep) for r in rows])


class _Board:
    """The terminal view as of one update: a title and the table, laid out for the
    width it is drawn at."""

    def __init__(self, title: str, rows: list[tuple[str, ...]],
                 headers: tuple[str, ...] = _HEADERS) -> None:
        self.title, self.rows, self.headers = title, rows, headers

    def __rich_console__(self, console: Any, options: Any) -> Any:
        from rich.text import Text

        yield Text(self.title, no_wrap=True, overflow="ellipsis")
        yield self.table(options.max_width)

    def layout(self, width: int) -> tuple[list[int], int, list[tuple[str, ...]]]:
        """How the table is drawn at width: the columns shown, the node column's most
        width, and the rows as shown. When not all fits, long node names are cut and
        an unknown pending count loses its reason ('unknown') first, then columns go
        in _DROP_ORDER, one with nothing to say (only '0' and '-') before any other;
        drops and dead letters, when there are any, stay (the report keeps them too)."""
        rows, cap, headers = self.rows, width, self.headers

        def need(shown: list[int]) -> int:  # two columns of padding between columns
            widths = [max(len(headers[i]), *(len(r[i]) for r in rows)) if rows
                      else len(headers[i]) for i in shown]
            widths[0] = min(widths[0], cap)
            return sum(widths) + 2 * (len(shown) - 1)

        shown = list(range(len(headers)))
        if need(shown) > width:
            # Narrow: long node names are cut, and unknown pending counts lose their
            # reason, before any column goes.
            cap = max(8, width // 3)
            rows = [(*r[:3], r[3].split(" (")[0], *r[4:]) for r in rows]
        silent = {i for i in range(4, len(headers))
                  if all(r[i] in ("0", "-") for r in rows)}
        # What went wrong stays, as in the report: drops and dead letters, when any.
        kept = {i for i in (4, 5) if i not in silent}
        by_drop = sorted((i for i in shown[1:] if i not in kept),
                         key=lambda i: (i in silent, _DROP_ORDER[headers[i]], i),
                         reverse=True)
        while by_drop and need(shown) > width:
            shown.remove(by_drop.pop(0))
        return shown, cap, rows

    def table(self, width: int) -> Any:
        from rich import box
        from rich.table import Table

        shown, cap, rows = self.layout(width)
        headers = self.headers
        # No row wraps: a cell too long for what is left of the width is cut ('…').
        table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False,
                      padding=(0, 1), collapse_padding=True)
        for i in shown:
            table.add_column(headers[i], no_wrap=True, overflow="ellipsis",
                             justify="left" if i in (0, 3, 6) else "right",
                             min_width=4 if i == 0 else None,
                             max_width=cap if i == 0 else None)
        for row in rows:
            table.add_row(*(row[i] for i in shown))
        return table


__all__ = ["RELAY_WAIT_SECONDS", "STALE_SECONDS", "LiveView", "NodeProgress", "OutputRelay",
           "RelayEnd", "rate_text"]
