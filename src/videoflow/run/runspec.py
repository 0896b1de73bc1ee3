"""RunSpec: a provisioned run as workers on other hosts load it.

``videoflow provision`` writes one (JSON): which flow (``module:attribute``), the
run's ids and type, the options every replica must agree on, and the compiled
NodeSpecs provisioning created resources for. ``videoflow worker`` reads it, loads
the flow from its own copy of the code, compiles it and refuses to start when the
result differs from the file: a worker built from other code than the provisioned
run would bind durables with other settings, or read a node that does not exist.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from videoflow.backends.shm_runs import run_store_dir, store_mark
from videoflow.core.compiler import CompiledFlow, NodeSpec, compile_flow
from videoflow.core.node import Node
from videoflow.errors import PayloadsElsewhere
from videoflow.run.worker import ReplicaJob

FORMAT = 1


@dataclass(frozen=True)
class RunSpec:
    """Attributes:
        flow: 'module:attribute' of the Flow.
        flow_id / run_id / flow_type: the run.
        nodes: the compiled NodeSpecs, as dicts, without their plans: a worker's
            compile derives each again from the same overrides and this spec's
            max_retries and ledger.
        ledger / payloads / ack_wait / max_retries / eos_quiescence_ms / replicas: as
            ReplicaJob (replicas: the copies a clustered broker keeps of the run's
            streams and the flow's buckets).
        shared_memory: the mark of the shared-memory store (on the host that
            provisioned the run) its payloads go through; None: the flow's NATS object
            store, which workers on any host read (videoflow.backends.shm_runs).
    """

    flow: str
    flow_id: str
    run_id: str
    flow_type: str
    nodes: tuple[dict[str, Any], ...] = field(default=())
    ledger: str = "kv"
    payloads: bool = True
    ack_wait: int = 30
    max_retries: int = 3
    eos_quiescence_ms: int = 500
    replicas: int = 1
    shared_memory: str | None = None

    @classmethod
    def for_flow(cls, reference: str, flow: Any, run_id: str, **options: Any) -> RunSpec:
        """The spec of a new run of flow (compiled here)."""
        made = cls(reference, flow.flow_id, run_id, flow.flow_type, **options)
        compiled = compile_flow(flow, made.max_retries, ledger_budget=made.ledger == "kv")
        return replace(made, nodes=tuple(_spec_dict(s) for s in compiled.specs))

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT, **asdict(self)}, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> RunSpec:
        """Raises:
            ValueError: not a run spec this version reads.
        """
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"the run spec is not JSON: {error}") from error
        if not isinstance(data, dict) or data.pop("format", None) != FORMAT:
            raise ValueError(f"not a videoflow run spec (format {FORMAT})")
        try:
            data["nodes"] = tuple(data.get("nodes") or ())
            return cls(**data)
        except TypeError as error:
            raise ValueError(f"the run spec has unknown or missing fields: {error}") from error

    def compiled(self, flow: Any) -> CompiledFlow:
        """Compile flow and check it is the flow this spec was provisioned for.

        Raises:
            ValueError: another flow id or type, or any node that differs (naming it).
        """
        if (flow.flow_id, flow.flow_type) != (self.flow_id, self.flow_type):
            raise ValueError(f"{self.flow} is flow {flow.flow_id!r} ({flow.flow_type}); the "
                             f"run spec is for {self.flow_id!r} ({self.flow_type})")
        compiled = compile_flow(flow, self.max_retries, ledger_budget=self.ledger == "kv")
        if not self.nodes:
            return compiled
        ours = {s["name"]: s for s in self.nodes}
        theirs = {s.name: _spec_dict(s) for s in compiled.specs}
        for name in sorted(set(ours) | set(theirs)):
            if ours.get(name) != theirs.get(name):
                raise ValueError(f"node {name!r} differs from the provisioned run: the spec "
                                 f"says {ours.get(name)}, the code {theirs.get(name)}")
        return compiled

    def replica(self, flow: Any, node: str, replica: int,
                nats_url: str) -> tuple[ReplicaJob, Node]:
        """The job and node object of one replica.

        Raises:
            ValueError: the flow differs from the spec, or replica is out of range.
            KeyError: no such node.
            PayloadsElsewhere: the run's payloads are in shared memory this process
                does not see (another host's).
        """
        payload_dir = self._payload_dir()
        compiled = self.compiled(flow)
        spec = compiled.spec(node)
        if not 0 <= replica < spec.nb_tasks:
            raise ValueError(f"node {node!r} has {spec.nb_tasks} replica(s), 0 to "
                             f"{spec.nb_tasks - 1}; got {replica}")
        job = ReplicaJob(self.flow_id, self.run_id, self.flow_type, spec, replica, nats_url,
                         self.ack_wait, self.max_retries, self.eos_quiescence_ms,
                         self.ledger, self.payloads, payload_dir=payload_dir,
                         replicas=self.replicas)
        return job, compiled.nodes[node]

    def _payload_dir(self) -> str | None:
        """The run's shared-memory store folder, checked to be the one its mark names;
        None for a run whose payloads go through the object store."""
        if self.shared_memory is None:
            return None
        directory = run_store_dir(self.flow_id, self.run_id)
        found = store_mark(directory)
        if found != self.shared_memory:
            seen = "holds another store" if found else "does not exist"
            raise PayloadsElsewhere(
                f"run {self.run_id} keeps its payloads in shared memory on the host that "
                f"provisioned it, which this process does not see ({directory} {seen} "
                "here): start this worker on that host, or provision the run with "
                "`--payloads object_store` (the default) for workers on several hosts")
        return str(directory)


def _spec_dict(spec: NodeSpec) -> dict[str, Any]:
    """A NodeSpec as JSON-safe data (tuples as lists, so a round trip compares equal),
    its plan left out: derived from the rest, and absent from the files written before
    it existed, which still read."""
    return json.loads(json.dumps({f.name: getattr(spec, f.name) for f in fields(spec)
                                  if f.name != "plan"}))


__all__ = ["RunSpec"]
