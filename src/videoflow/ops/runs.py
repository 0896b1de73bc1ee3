"""`videoflow ls`: the flows and runs on a broker, and what state each run is in.

A run is found by its streams' owner labels (STREAM-14), or, for a stream that predates
them, by its data subject (naming.subject_owner); a flow by any of its runs or by its
dead-letter stream. A run is 'running' while a replica is pulling from one of its
durables (a pull request waits on it), and 'idle' when its streams are there but
nothing reads them: a run kept after it ended (`run --resume` continues it), or one
whose engine died. A run whose streams are gone is found by the record it left in its
flow's ledger bucket (videoflow.ops.run_records), and is 'ended'. What could not be
read is Unknown, never 0 (MSG-012).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from nats.aio.client import Client
from nats.js.api import StreamInfo

from videoflow.backends.messaging import Known, Unknown
from videoflow.broker.failures import unknown_from
from videoflow.broker.loop import ErrorLog
from videoflow.core.naming import (
    KIND_DLQ,
    KIND_STREAM,
    LABEL_FLOW_ID,
    LABEL_KIND,
    LABEL_NODE,
    LABEL_RUN_ID,
    ledger_bucket,
    subject_owner,
    user_metadata,
)
from videoflow.ops.broker_calls import (
    DEFAULT_TIMEOUT_SECONDS,
    Budget,
    run_sync,
    unavailable,
)
from videoflow.ops.buckets import LEDGER_PREFIX
from videoflow.ops.run_records import RunRecord, read_run_records
from videoflow.ops.status import all_streams

RunState = Literal["running", "idle", "ended"]


@dataclass(frozen=True, slots=True)
class RunSummary:
    """One run on the broker.

    Attributes:
        flow_id / run_id: the run.
        streams: how many streams it owns.
        messages: the messages they hold together.
        state: 'running' (a replica pulls from one of its durables) or 'idle', or
            Unknown when its durables could not be read; 'ended' when its streams are
            gone and its record is there.
        record: the record the run left (run_records), None when it left none (a run
            of an older videoflow, or one whose broker did not take it).
    """

    flow_id: str
    run_id: str
    streams: int
    messages: int
    state: Known[RunState] | Unknown
    record: RunRecord | None = None


@dataclass(frozen=True, slots=True)
class FlowSummary:
    """One flow on the broker: its runs, and its dead letters (None: no dead-letter
    stream)."""

    flow_id: str
    runs: tuple[RunSummary, ...]
    dead_letters: int | None = None


def stream_owner(info: StreamInfo) -> tuple[str, str | None, str | None] | None:
    """(flow, run, node) a stream belongs to, by its owner labels (STREAM-14), else (a
    stream older than them) its data subject: run and node None for a flow's
    dead-letter stream, node None for a run's stream that is no node's data; None for
    a stream of no flow."""
    labels = user_metadata(info.config.metadata)
    flow = labels.get(LABEL_FLOW_ID)
    if flow:
        if labels.get(LABEL_KIND) == KIND_DLQ:
            return flow, None, None
        run = labels.get(LABEL_RUN_ID)
        node = labels.get(LABEL_NODE) if labels.get(LABEL_KIND) == KIND_STREAM else None
        return (flow, run, node or None) if run else None
    for subject in info.config.subjects or ():
        owner = subject_owner(subject)
        if owner is not None:
            return owner
    return None


def _owner(info: StreamInfo) -> tuple[str, str | None] | None:
    """(flow, run) a stream belongs to, run None for a flow's dead-letter stream."""
    owner = stream_owner(info)
    return None if owner is None else (owner[0], owner[1])


async def _state(nc: Client, streams: list[StreamInfo], budget: Budget,
                 errors: ErrorLog) -> Known[RunState] | Unknown:
    jsm = nc.jsm()
    for info in streams:
        try:
            consumers = await budget.run(jsm.consumers_info(info.config.name or ""))
        except Exception as error:  # every failure is reported, never inferred
            return unknown_from(error, errors.texts())
        if any((c.num_waiting or 0) > 0 for c in consumers):
            return Known("running")
    return Known("idle")


def list_flows(nats_url: str, *, flow_id: str | None = None,
               timeout: float = DEFAULT_TIMEOUT_SECONDS) -> list[FlowSummary]:
    """The flows on the broker, each with its runs (oldest name first: run ids sort by
    their start) and dead letters: the runs whose streams are there, and those that
    ended, by the records they left (run_records).

    Arguments:
        flow_id: only this flow.
        timeout: overall bound in seconds, connect included.

    Raises:
        BrokerUnavailable: the broker could not be reached, or did not list its
            streams, within timeout.
    """

    async def work(nc: Client, budget: Budget, errors: ErrorLog) -> list[FlowSummary]:
        try:
            infos = await all_streams(nc.jsm(), budget)
        except Exception as error:
            raise unavailable("listing streams", error, errors) from error
        runs: dict[tuple[str, str], list[StreamInfo]] = {}
        dead: dict[str, int] = {}
        records: dict[tuple[str, str], RunRecord] = {}
        for info in infos:
            name = info.config.name or ""
            if name.startswith(f"KV_{LEDGER_PREFIX}"):
                if flow_id is not None and name != f"KV_{ledger_bucket(flow_id)}":
                    continue  # another flow's ledger: not read
                try:
                    kept = await read_run_records(nc, budget, name.removeprefix("KV_"))
                except Exception as error:
                    raise unavailable("reading run records", error, errors) from error
                records.update({(r.flow_id, r.run_id): r for r in kept
                                if flow_id is None or r.flow_id == flow_id})
                continue
            owner = _owner(info)
            if owner is None or (flow_id is not None and owner[0] != flow_id):
                continue
            flow, run = owner
            if run is None:
                dead[flow] = int(info.state.messages or 0)
            else:
                runs.setdefault((flow, run), []).append(info)
        summaries: dict[str, list[RunSummary]] = {flow: [] for flow in dead}
        for flow, run in sorted(runs.keys() | records.keys()):
            streams = runs.get((flow, run), [])
            messages = sum(int(i.state.messages or 0) for i in streams)
            ended: Known[RunState] = Known("ended")
            state = await _state(nc, streams, budget, errors) if streams else ended
            summaries.setdefault(flow, []).append(
                RunSummary(flow, run, len(streams), messages, state, records.get((flow, run))))
        return [FlowSummary(flow, tuple(summaries[flow]), dead.get(flow))
                for flow in sorted(summaries)]

    return run_sync(nats_url, timeout, work)


def latest_run(nats_url: str, flow_id: str, *,
               timeout: float = DEFAULT_TIMEOUT_SECONDS) -> str | None:
    """The id of flow_id's run that started last, by the records runs leave, else (runs
    that left none) the last by id, as ids sort by their start; None when the broker
    holds no run of it (list_flows).

    Raises:
        BrokerUnavailable: as list_flows.
    """
    runs = [r for f in list_flows(nats_url, flow_id=flow_id, timeout=timeout) for r in f.runs]
    recorded = [(r.record.started_at, r.run_id) for r in runs if r.record is not None]
    if recorded:
        return max(recorded)[1]
    return runs[-1].run_id if runs else None


def run_state(nats_url: str, flow_id: str, run_id: str, *,
              timeout: float = DEFAULT_TIMEOUT_SECONDS) -> Known[RunState] | Unknown | None:
    """One run's state, as list_flows tells it, reading that run's durables only.

    Returns:
        Known('running' or 'idle'), Unknown when its durables could not be read, or
        None when the broker holds no stream of it.

    Raises:
        BrokerUnavailable: the broker could not be reached, or did not list its
            streams, within timeout.
    """

    async def work(nc: Client, budget: Budget,
                   errors: ErrorLog) -> Known[RunState] | Unknown | None:
        try:
            infos = await all_streams(nc.jsm(), budget)
        except Exception as error:
            raise unavailable("listing streams", error, errors) from error
        streams = [i for i in infos if _owner(i) == (flow_id, run_id)]
        return await _state(nc, streams, budget, errors) if streams else None

    return run_sync(nats_url, timeout, work)


__all__ = ["FlowSummary", "RunState", "RunSummary", "latest_run", "list_flows", "run_state",
           "stream_owner"]
