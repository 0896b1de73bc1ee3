"""Whole flows run against one broker, each run under a run id of its own.

The pytest plugin's ``videoflow_run`` fixture is a FlowRunner on the session's
embedded nats-server (videoflow.testing.plugin), and the flow benchmark runs its
rounds through one (videoflow.testing.bench). Every run is the real thing:
run_flow (videoflow.run.local), each node replica a process, its streams provisioned
on the broker and torn down at its end. Runs of one flow on one broker never share a
stream: each gets a fresh run id, named for the test that asked for it, so the
streams, dead letters and run records of a run say which test made them.

Usage::

    runner = FlowRunner(server.url, label="test_squares")
    report = runner(flow)
    assert report.outcome == "completed"
"""

from __future__ import annotations

import itertools
import re
import uuid
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from videoflow.core.report import RunReport
    from videoflow.flow import Flow

LABEL_CHARACTERS = 40
"""How much of the label a run id keeps (the rest of the id keeps it unique)."""

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")


class FlowRunner:
    """Runs whole flows to their end against one broker, as Flow.run does.

    Arguments:
        nats_url: the broker every run uses.
        label: what its run ids start with (a test's name, say); anything outside
            ``[A-Za-z0-9_-]`` becomes '_', and it is cut to LABEL_CHARACTERS.

    Attributes:
        nats_url: as given.
        reports: the RunReport of each run so far, in order.
    """

    def __init__(self, nats_url: str, label: str = "run") -> None:
        self.nats_url = nats_url
        self.label = _UNSAFE.sub("_", label)[:LABEL_CHARACTERS].strip("_-") or "run"
        self.reports: list[RunReport] = []
        self._count = itertools.count(1)

    def next_run_id(self) -> str:
        """A run id no other run has: the label, this runner's count of runs and six
        random hex digits (runners of two sessions on one broker do not meet)."""
        return f"{self.label}-{next(self._count)}-{uuid.uuid4().hex[:6]}"

    def __call__(self, flow: Flow, **options: Any) -> RunReport:
        """Runs flow to its end on this runner's broker, each node replica a process.

        Arguments:
            flow: the flow; its nodes go to their processes as Flow.run sends them, so
                one Flow object can be run again and again.
            **options: Flow.run's (videoflow.run.local.run_flow documents each), but
                for nats_url, which is the runner's. view is False unless given (no
                live view in a test's output); run_id a fresh one (next_run_id) unless
                given.

        Returns:
            the run's RunReport, also appended to reports. A run that failed is
            returned too, as Flow.run returns it: check ``report.ok``.

        Raises:
            TypeError: options name nats_url.
            ValueError / BrokerUnavailable / ...: as Flow.run.
        """
        from videoflow.run.local import run_flow

        if "nats_url" in options:
            raise TypeError("a FlowRunner runs every flow on its own broker "
                            f"({self.nats_url}); nats_url cannot be given")
        options.setdefault("view", False)
        if options.get("run_id") is None:
            options["run_id"] = self.next_run_id()
        report = run_flow(flow, self.nats_url, **options)
        self.reports.append(report)
        return report


__all__ = ["LABEL_CHARACTERS", "FlowRunner"]
