"""Flow: the producers and consumers of a graph of nodes, and how to run it."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from videoflow.core.constants import BATCH, FLOW_TYPES
from videoflow.wire.codecs import parse_codecs

if TYPE_CHECKING:
    from videoflow.core.compiler import CompiledFlow
    from videoflow.core.node import Node
    from videoflow.run.local import RunReport
    from videoflow.run.progress import LiveView


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
        codec: the codecs of every node that names none (Node's codec); None: raw.

    Raises:
        ValueError: an unknown flow type, a bad name or codec (the graph itself is
            checked by compile()).
        MissingDependency: a codec whose library is not installed, naming the extra.
    """

    def __init__(self, producers: Sequence[Node], consumers: Sequence[Node],
                 flow_type: str = BATCH, name: str = "flow", codec: Any = None) -> None:
        if flow_type not in FLOW_TYPES:
            raise ValueError(f"flow_type must be one of {FLOW_TYPES}, got {flow_type!r}")
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"a flow's name must be a non-empty str, got {name!r}")
        self.producers = list(producers)
        self.consumers = list(consumers)
        self.flow_type = flow_type
        self.flow_id = name
        self.codec = parse_codecs(codec, "flow: codec")

    def compile(self) -> CompiledFlow:
        """The flow's NodeSpecs, checked (videoflow.core.compiler.compile_flow)."""
        from videoflow.core.compiler import compile_flow

        return compile_flow(self)

    # The options are run_flow's, spelled out so an editor and mypy show them; the
    # defaults are written here rather than imported, so that importing videoflow
    # does not load the engine (tests/unit/test_flow_run_options.py keeps them equal).
    def run(
        self,
        nats_url: str | None = None,
        *,
        run_id: str | None = None,
        store_dir: str | os.PathLike[str] | None = None,
        ephemeral: bool = False,
        provision_timeout: float = 30.0,
        ack_wait: int = 30,
        max_retries: int = 3,
        eos_quiescence_ms: int = 500,
        stop_after: float | None = None,
        max_restarts: int = 3,
        crash_limit: int | None = 2,
        ledger: str = "kv",
        payloads: bool | str = "shm",
        payload_budget: int | None = None,
        teardown: bool = True,
        view: LiveView | None | bool = None,
        replicas: int = 1,
        outage_budget: float | None = None,
        resume: bool = False,
        metrics_port: int | None = None,
    ) -> RunReport:
        """Run the flow to its end on this machine: each node replica in its own
        process, against the embedded nats-server unless a URL is given (or set in
        VIDEOFLOW_NATS_URL). videoflow.run.local.run_flow documents each option in
        full.

        Arguments:
            nats_url: the broker; None takes VIDEOFLOW_NATS_URL, else starts the
                embedded nats-server for the run.
            run_id: the run's id; a fresh one when None.
            store_dir: the embedded server's store, kept after the run (its dead
                letters stay listable); None takes VIDEOFLOW_STORE_DIR, else the
                per-user default.
            ephemeral: a throwaway store instead, removed when the run ends.
            provision_timeout: seconds provisioning (connect included) may take.
            ack_wait: seconds the broker waits for an input's settlement before it
                delivers the input again.
            max_retries: redeliveries of an input whose processing raised, after the
                first delivery, for at-least-once nodes (a node's delivery policy
                overrides it).
            eos_quiescence_ms: the end-of-stream fallback (ms) when a node's drain
                cannot be observed.
            stop_after: seconds after which the flow is asked to stop (as a first
                Ctrl-C); None runs until the producers end.
            max_restarts: per replica, how often a process that died is started again.
            crash_limit: process deaths of a node an input may have been in hand at
                before it is dead-lettered as 'crashed_worker'; None never.
            ledger: where the replicas keep their state: 'kv' (the broker's key-value
                store: durable and shared, a restarted replica resumes from it) or
                'memory' (dies with the process).
            payloads: how large outputs travel: 'shm' (shared memory on this host),
                'object_store' or True (the flow's NATS object store), False (they
                fail).
            payload_budget: the shared-memory store's bound in bytes (1 GiB when None).
            teardown: delete the run's streams at the end (a BATCH run with work left
                keeps them, to be resumed).
            view: a LiveView; None shows one on a terminal, False none, True always.
            replicas: the copies a clustered broker keeps of each stream and bucket.
            outage_budget: seconds the run waits for a broker that went away; None
                takes VIDEOFLOW_OUTAGE_BUDGET, else 60.
            resume: run_id names a kept run: take it up where it stopped.
            metrics_port: serve Prometheus metrics on this port while the run lasts
                (0: any free port); None takes VIDEOFLOW_METRICS_PORT, else none.

        Returns:
            the RunReport.

        Raises:
            ValueError, BrokerUnavailable, RunNotKept, RunExists, EmbeddedServerError:
                as run_flow, among others (StoreBusy, an EmbeddedServerError, when
                another embedded server holds store_dir).
        """
        from videoflow.run.local import run_flow

        return run_flow(
            self, nats_url=nats_url, run_id=run_id, store_dir=store_dir,
            ephemeral=ephemeral, provision_timeout=provision_timeout, ack_wait=ack_wait,
            max_retries=max_retries, eos_quiescence_ms=eos_quiescence_ms,
            stop_after=stop_after, max_restarts=max_restarts, crash_limit=crash_limit,
            ledger=ledger, payloads=payloads, payload_budget=payload_budget,
            teardown=teardown, view=view, replicas=replicas, outage_budget=outage_budget,
            resume=resume, metrics_port=metrics_port)


__all__ = ["Flow"]
