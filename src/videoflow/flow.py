"""Flow: the producers and consumers of a graph of nodes, and how to run it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from videoflow.core.constants import BATCH, FLOW_TYPES

if TYPE_CHECKING:
    from videoflow.core.compiler import CompiledFlow
    from videoflow.core.node import Node
    from videoflow.run.local import RunReport


class Flow:
    """A graph of nodes, named by its ends: every node between the producers and the
    consumers takes part.

    Arguments:
        producers: the flow's sources.
        consumers: its sinks; the graph is found by walking back from them.
        flow_type: BATCH (the default: nothing published is lost, every input is
            processed) or REALTIME (freshness first: a busy reader sees the newest
            input, older ones are dropped and counted).
        name: the flow id: names its streams, subjects and dead-letter stream, so
            two flows on one broker need different names.

    Raises:
        ValueError: an unknown flow type or a bad name (the graph itself is checked
            by compile()).
    """

    def __init__(self, producers: Sequence[Node], consumers: Sequence[Node],
                 flow_type: str = BATCH, name: str = "flow") -> None:
        if flow_type not in FLOW_TYPES:
            raise ValueError(f"flow_type must be one of {FLOW_TYPES}, got {flow_type!r}")
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"a flow's name must be a non-empty str, got {name!r}")
        self.producers = list(producers)
        self.consumers = list(consumers)
        self.flow_type = flow_type
        self.flow_id = name

    def compile(self) -> CompiledFlow:
        """The flow's NodeSpecs, checked (videoflow.core.compiler.compile_flow)."""
        from videoflow.core.compiler import compile_flow

        return compile_flow(self)

    def run(self, nats_url: str | None = None, **options: Any) -> RunReport:
        """Run the flow to its end on this machine: each node replica in its own
        process, against the embedded nats-server unless a URL is given (or set in
        VIDEOFLOW_NATS_URL). See videoflow.run.local.run_flow for the options.

        Returns:
            the RunReport.
        """
        from videoflow.run.local import run_flow

        return run_flow(self, nats_url=nats_url, **options)


__all__ = ["Flow"]
