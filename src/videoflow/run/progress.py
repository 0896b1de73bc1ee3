"""The live view of a running flow: per node, its rate, what waits for it, its drops,
and for a time join the parent furthest behind in event time.

On a terminal the view redraws in place; otherwise (a log, a pipe, CI) it prints a
plain line per node every interval. An unknown pending count is shown as unknown,
never as 0.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TextIO

from videoflow.core.report import format_table


@dataclass
class NodeProgress:
    """The latest word from each replica of one node, folded.

    Attributes:
        replicas: the latest snapshot per replica key.
        pending: per replica, messages waiting (int) or the reason it is unknown (str).
    """

    kind: str
    replicas: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    pending: dict[str, int | str] = field(default_factory=dict)
    _last: tuple[float, int] | None = None
    rate: float = 0.0

    def count(self) -> int:
        key = "emitted" if self.kind == "producer" else "processed"
        return sum(int(s.get(key, 0)) for s in self.replicas.values())

    def total(self, key: str) -> int:
        return sum(int(s.get(key, 0)) for s in self.replicas.values())

    def drops(self) -> int:
        return sum(sum((s.get("drops") or {}).values()) for s in self.replicas.values())

    def pending_text(self) -> str:
        if self.kind == "producer":
            return "-"
        if not self.pending:
            return "unknown (unread)"
        unknown = [v for v in self.pending.values() if isinstance(v, str)]
        if unknown:
            return f"unknown ({unknown[0]})"
        return str(sum(v for v in self.pending.values() if isinstance(v, int)))

    def behind_text(self) -> str:
        """A time join's parent furthest behind the most advanced one in event time,
        and by how much, as of the latest word ('-' for other nodes, and when none is
        behind)."""
        lags: dict[str, float] = {}
        for stats in self.replicas.values():
            for parent, lag in (stats.get("watermark_lag") or {}).items():
                lags[parent] = max(lags.get(parent, 0.0), lag)
        parent = max(lags, key=lambda p: lags[p], default=None)
        if parent is None or lags[parent] <= 0:
            return "-"
        return f"{parent} {lags[parent] * 1000.0:.0f} ms"

    def mark(self, now: float) -> None:
        """Update the rate from the count since the last mark."""
        count = self.count()
        if self._last is not None and now > self._last[0]:
            self.rate = (count - self._last[1]) / (now - self._last[0])
        self._last = (now, count)


class LiveView:
    """Renders NodeProgress rows.

    Arguments:
        stream: where to write (stderr by default).
        interval: seconds between plain-line reports (redraws on a terminal follow
            every update, at most 4 per second).
        tty: force terminal (True) or plain (False) rendering; None asks the stream.
    """

    def __init__(self, stream: TextIO | None = None, interval: float = 2.0,
                 tty: bool | None = None) -> None:
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.interval = interval if not self.tty else 0.25
        self._drawn = 0
        self._next = 0.0

    def update(self, title: str, nodes: Mapping[str, NodeProgress],
               extra: str = "", force: bool = False) -> None:
        now = time.monotonic()
        if not force and now < self._next:
            return
        self._next = now + self.interval
        for progress in nodes.values():
            progress.mark(now)
        rows = [("node", "done", "rate/s", "pending", "dropped", "dead-let.", "behind")]
        for name, p in nodes.items():
            rows.append((name, str(p.count()), f"{p.rate:.0f}", p.pending_text(),
                         str(p.drops()), str(p.total("dead_lettered")), p.behind_text()))
        lines = [title + (f"  {extra}" if extra else ""), *format_table(rows)]
        if self.tty:
            if self._drawn:
                self.stream.write(f"\x1b[{self._drawn}F")  # back to the view's first line
            self.stream.write("".join(f"{line}\x1b[K\n" for line in lines))
            self._drawn = len(lines)
        else:
            self.stream.write("".join(f"{line}\n" for line in lines))
        self.stream.flush()


__all__ = ["LiveView", "NodeProgress"]
