"""`videoflow buckets`: the flow-scoped buckets a flow leaves on the broker — its
FlowRuntime ledger (KV ``vf-ledger-{flow}``) and its by-ref payloads (object store
``vf-payloads-{flow}`` with the KV ``vf-payloads-{flow}-obligations`` of their
records) — listed, and removed.

They outlive every run on purpose: each run's teardown purges only that run's ledger
records, and payloads pinned by dead letters are kept as long as the dead letters
(BLOB-14). So they accumulate, run after run, until an operator removes them here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Final, Literal

import nats.js.errors
from nats.aio.client import Client
from nats.js.api import StreamInfo

from videoflow.broker.failures import JSErrorCode
from videoflow.broker.loop import ErrorLog
from videoflow.core.naming import (
    KIND_DLQ,
    LABEL_FLOW_ID,
    LABEL_KIND,
    LABEL_RUN_ID,
    sanitize,
    subject_for,
    subject_owner,
    user_metadata,
)
from videoflow.errors import VideoflowError
from videoflow.ops.broker_calls import (
    API_PREFIX,
    DEFAULT_TIMEOUT_SECONDS,
    Budget,
    Count,
    count_of,
    run_sync,
    unavailable,
)
from videoflow.ops.status import all_streams

BucketKind = Literal["ledger", "payloads", "payload_obligations"]

LEDGER_PREFIX: Final = "vf-ledger-"
PAYLOADS_PREFIX: Final = "vf-payloads-"
OBLIGATIONS_SUFFIX: Final = "-obligations"


def flow_bucket_names(flow_id: str) -> dict[BucketKind, str]:
    """The names of a flow's buckets, by kind (as core.worker names them).

    Raises:
        ValueError: an empty or reserved flow_id.
    """
    from videoflow.core.naming import ledger_bucket, payload_bucket

    subject_for(flow_id, "run", "node")  # validates flow_id
    payloads = payload_bucket(flow_id)
    return {"ledger": ledger_bucket(flow_id), "payloads": payloads,
            "payload_obligations": payloads + OBLIGATIONS_SUFFIX}


def _stream_of(kind: BucketKind, bucket: str) -> str:
    """The stream a bucket lives in: KV_<bucket> or OBJ_<bucket> (NATS_FACTS §9)."""
    return f"OBJ_{bucket}" if kind == "payloads" else f"KV_{bucket}"


def _bucket_of(stream: str) -> tuple[BucketKind, str, str] | None:
    """(kind, bucket, flow token) of a flow bucket's stream, None for any other stream."""
    if stream.startswith(f"OBJ_{PAYLOADS_PREFIX}"):
        bucket = stream.removeprefix("OBJ_")
        return "payloads", bucket, bucket.removeprefix(PAYLOADS_PREFIX)
    if stream.startswith(f"KV_{LEDGER_PREFIX}"):
        bucket = stream.removeprefix("KV_")
        return "ledger", bucket, bucket.removeprefix(LEDGER_PREFIX)
    if stream.startswith(f"KV_{PAYLOADS_PREFIX}") and stream.endswith(OBLIGATIONS_SUFFIX):
        bucket = stream.removeprefix("KV_")
        flow = bucket.removeprefix(PAYLOADS_PREFIX).removesuffix(OBLIGATIONS_SUFFIX)
        return "payload_obligations", bucket, flow
    return None


@dataclass(frozen=True, slots=True)
class FlowBucket:
    """One flow-scoped bucket on the broker.

    Attributes:
        name: the bucket's name, e.g. ``vf-ledger-squares``.
        kind: 'ledger' (KV of the runs' FlowRuntime records), 'payloads' (object store
            of by-ref payloads) or 'payload_obligations' (KV of their records).
        flow: the flow's token in the name (the flow id as naming.sanitize writes it).
        stream: the JetStream stream holding it (KV_<name> or OBJ_<name>).
        messages / bytes: what it holds (records and chunks, their history included).
    """

    name: str
    kind: BucketKind
    flow: str
    stream: str
    messages: Count
    bytes: Count


class BucketsInUse(VideoflowError):
    """A removal refused because runs that need the buckets still have streams.

    Attributes:
        flow_id: the flow.
        runs: the runs (ids, as their streams name them) that still have streams.
    """

    def __init__(self, flow_id: str, runs: tuple[str, ...]) -> None:
        teardowns = "; ".join(f"videoflow teardown --flow {flow_id} --run {run}"
                              for run in runs)
        super().__init__(
            f"flow {flow_id!r} still has streams of run(s) {', '.join(runs)}, whose "
            f"workers use these buckets; once they have ended, tear them down first: "
            f"{teardowns}")
        self.flow_id = flow_id
        self.runs = runs


@dataclass(frozen=True, slots=True)
class BucketRemoval:
    """What buckets_remove did.

    Attributes:
        flow_id: the flow.
        run_id: the run whose ledger records were purged, None for the whole flow.
        removed: the buckets deleted (the whole flow's; none for a run).
        purged_records: ledger records of the run purged (0 for the whole flow).
    """

    flow_id: str
    run_id: str | None
    removed: tuple[str, ...]
    purged_records: int


def _bucket(info: StreamInfo) -> FlowBucket | None:
    stream = info.config.name or ""
    found = _bucket_of(stream)
    if found is None:
        return None
    kind, name, flow = found
    state = info.state
    return FlowBucket(name, kind, flow, stream,
                      count_of(getattr(state, "messages", None), "messages"),
                      count_of(getattr(state, "bytes", None), "bytes"))


def _runs_with_streams(infos: list[StreamInfo], flow_id: str) -> set[str]:
    """The runs of flow_id that own a stream: by owner labels, else (streams that
    predate them) by their data subjects. The flow's dead-letter stream is no run's."""
    token = sanitize(flow_id)
    runs: set[str] = set()
    for info in infos:
        labels = user_metadata(info.config.metadata)
        if labels:
            if labels.get(LABEL_FLOW_ID) == flow_id and labels.get(LABEL_RUN_ID) and \
                    labels.get(LABEL_KIND) != KIND_DLQ:
                runs.add(labels[LABEL_RUN_ID])
            continue
        for subject in info.config.subjects or ():
            owner = subject_owner(subject)
            if owner is not None and owner[0] == token:
                runs.add(owner[1])
    return runs


def buckets_list(
    nats_url: str, flow_id: str | None = None, *, timeout: float = DEFAULT_TIMEOUT_SECONDS,
) -> list[FlowBucket]:
    """The flow-scoped buckets on the broker, of one flow or of every flow, sorted by
    name.

    Arguments:
        nats_url: the broker.
        flow_id: only this flow's buckets; None for every flow's.
        timeout: overall bound in seconds, connect included.

    Returns:
        one FlowBucket per bucket found (a flow that never kept a ledger or a by-ref
        payload has none).

    Raises:
        BrokerUnavailable: the broker could not be reached, or the streams could not be
            listed within timeout.
        ValueError: an empty or reserved flow_id, or a bad timeout.
    """
    wanted = None if flow_id is None else set(flow_bucket_names(flow_id).values())

    async def work(nc: Client, budget: Budget, errors: ErrorLog) -> list[FlowBucket]:
        try:
            infos = await all_streams(nc.jsm(), budget)
        except Exception as error:
            raise unavailable("listing the streams", error, errors) from error
        found = [b for b in map(_bucket, infos) if b is not None]
        return sorted((b for b in found if wanted is None or b.name in wanted),
                      key=lambda b: b.name)

    return run_sync(nats_url, timeout, work)


async def _purge_run_records(nc: Client, bucket: str, flow_id: str, run_id: str,
                             budget: Budget, errors: ErrorLog) -> int:
    from videoflow.core.runtime_records import run_key_filter

    stream = f"KV_{bucket}"
    # STREAM.PURGE answers {"success", "purged"}; nats-py's purge_stream keeps only
    # success, so the request is made here to report the count.
    request = {"filter": f"$KV.{bucket}.{run_key_filter(flow_id, run_id)}"}
    try:
        reply = await budget.run(nc.request(f"{API_PREFIX}.STREAM.PURGE.{stream}",
                                            json.dumps(request).encode(),
                                            timeout=budget.left()))
        answer = json.loads(reply.data)
    except Exception as error:
        raise unavailable(f"purging {stream}", error, errors) from error
    if not isinstance(answer, dict):
        raise unavailable(f"purging {stream}", ValueError(f"answer {answer!r}"), errors)
    failure = answer.get("error")
    if isinstance(failure, dict) and failure.get("err_code") == JSErrorCode.STREAM_NOT_FOUND:
        return 0  # no ledger bucket: nothing of the run's to purge
    purged = answer.get("purged", 0)
    if failure is not None or not answer.get("success") or not isinstance(purged, int):
        raise unavailable(f"purging {stream}", ValueError(f"answer {answer!r}"), errors)
    return purged


def buckets_remove(
    nats_url: str, flow_id: str, *, run_id: str | None = None,
    timeout: float = DEFAULT_TIMEOUT_SECONDS,
) -> BucketRemoval:
    """Remove a flow's buckets, or one run's records from its ledger.

    For the whole flow (run_id None), its ledger, payload store and payload-records
    buckets are deleted — refused while any run of the flow still has streams, whose
    workers may be using them. Dead letters of the flow that carry a payload ref can
    no longer be replayed afterwards: their payload is gone with the store (the
    dead-letter stream itself is never touched). For one run, only that run's records
    in the flow's ledger are purged (as its teardown does) — refused while that run has
    streams; payloads belong to no run by name, so they stay until the flow's removal.

    Arguments:
        nats_url: the broker.
        flow_id: the flow.
        run_id: only this run's ledger records.
        timeout: overall bound in seconds, connect included.

    Returns:
        BucketRemoval: what was deleted or purged (a bucket already gone is not named).

    Raises:
        BucketsInUse: runs that need the buckets still have streams; nothing removed.
        BrokerUnavailable: the broker could not be reached, or a request failed or was
            not answered within timeout (re-running is safe).
        ValueError: an empty or reserved flow_id or run_id, or a bad timeout.
    """
    names = flow_bucket_names(flow_id)
    if run_id is not None:
        subject_for(flow_id, run_id, "node")

    async def work(nc: Client, budget: Budget, errors: ErrorLog) -> BucketRemoval:
        jsm = nc.jsm()
        try:
            infos = await all_streams(jsm, budget)
        except Exception as error:
            raise unavailable("listing the streams", error, errors) from error
        live = _runs_with_streams(infos, flow_id)
        if run_id is not None:
            if run_id in live or sanitize(run_id) in live:
                raise BucketsInUse(flow_id, (run_id,))
            purged = await _purge_run_records(nc, names["ledger"], flow_id, run_id,
                                              budget, errors)
            return BucketRemoval(flow_id, run_id, (), purged)
        if live:
            raise BucketsInUse(flow_id, tuple(sorted(live)))
        present = {info.config.name for info in infos}
        removed = []
        for kind, bucket in names.items():
            stream = _stream_of(kind, bucket)
            if stream not in present:
                continue
            try:
                await budget.run(jsm.delete_stream(stream))
            except nats.js.errors.NotFoundError:
                continue  # gone meanwhile: what was asked for
            except Exception as error:
                raise unavailable(f"deleting {stream}", error, errors) from error
            removed.append(bucket)
        return BucketRemoval(flow_id, None, tuple(removed), 0)

    return run_sync(nats_url, timeout, work)
