"""Latency histograms a task keeps for the metrics endpoint: fixed bucket bounds, so
the histograms of several replicas (and of a replica's earlier processes) add up
bucket by bucket, as Prometheus adds them."""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Any, Final

LATENCY_BOUNDS: Final = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                         1.0, 2.5, 5.0, 10.0, 30.0)
"""Upper bounds in seconds (an implicit +Inf bucket follows): half a millisecond, a
local hop, to half a minute, a join waiting on a stalled camera."""


@dataclass
class Histogram:
    """Observations counted per bucket (not cumulative: counts[i] holds those at most
    LATENCY_BOUNDS[i] and above the bound before; the last counts those above every
    bound), with their sum.

    Attributes:
        counts: one per bound, and one for +Inf.
        total: the sum of every observation, in seconds.
    """

    counts: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BOUNDS) + 1))
    total: float = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(LATENCY_BOUNDS, seconds)] += 1
        self.total += seconds

    @property
    def count(self) -> int:
        return sum(self.counts)

    def as_dict(self) -> dict[str, Any]:
        """A plain form for progress reports (it pickles and survives JSON)."""
        return {"counts": list(self.counts), "sum": self.total}

    def add(self, other: dict[str, Any]) -> None:
        """Add a histogram in as_dict's form (another replica's, an earlier process's)."""
        for i, n in enumerate(other["counts"]):
            self.counts[i] += int(n)
        self.total += float(other["sum"])

    def cumulative(self) -> list[tuple[str, int]]:
        """(le, count of observations at most le) per bucket, +Inf last, as the
        Prometheus exposition wants them."""
        running, out = 0, []
        for bound, n in zip((*map(repr, LATENCY_BOUNDS), "+Inf"), self.counts, strict=True):
            running += n
            out.append((bound, running))
        return out


__all__ = ["LATENCY_BOUNDS", "Histogram"]
