"""A run's id: a fresh one (new_run_id), or the one a new run takes (take_run_id).

A new run never takes an id a run holds: its streams are on the broker (started afresh
it would take a running run's durables over, or mix a kept one's messages into its
own), or its record has not ended. Checking is not holding: two runs given one id at
once both pass a check. So the run then claims the id with its record
(videoflow.ops.run_records.claim_run), one conditional write on the broker that only
one of them wins; the other gets RunExists.
"""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING

from videoflow.backends.messaging import Known
from videoflow.errors import RunExists

if TYPE_CHECKING:
    from videoflow.ops.run_records import RunRecord

RESUME_COMMAND = "videoflow run MODULE:ATTR"
"""How a kept run's resume hint names the command (the videoflow command puts the
flow it ran in its place)."""


def new_run_id() -> str:
    """A run id that sorts by start time: 'r' + UTC timestamp + 6 random hex digits."""
    return "r" + time.strftime("%Y%m%d%H%M%S", time.gmtime()) + uuid.uuid4().hex[:6]


def take_run_id(url: str, flow_id: str, run_id: str, *, chosen: bool, replicas: int,
                timeout: float) -> tuple[RunRecord, int]:
    """Take run_id for a new run of flow_id, before anything of the run is made.

    Arguments:
        url: the broker.
        flow_id / run_id: the run.
        chosen: run_id was given, not made by new_run_id: a run may hold it already.
        replicas: the copies a clustered broker keeps of the ledger bucket, if made here.
        timeout: the bound of the check and of the claim, each.

    Returns:
        the run's record ('running') and its revision, which its end is written over.

    Raises:
        RunExists: a run holds the id: its streams are on the broker, or its record
            has not ended, or another run claimed it at the same moment.
        BrokerUnavailable: the streams could not be listed, or the claim not made.
    """
    from videoflow.ops.run_records import claim_run, started_record

    if chosen:
        _unused(url, flow_id, run_id, timeout)
    record = started_record(flow_id, run_id)
    return record, claim_run(url, record, replicas=replicas, timeout=timeout)


def _unused(url: str, flow_id: str, run_id: str, timeout: float) -> None:
    """Check that the broker holds no stream of run_id.

    Raises:
        RunExists: it does.
        BrokerUnavailable: the streams could not be listed.
    """
    from videoflow.ops.runs import run_state

    state = run_state(url, flow_id, run_id, timeout=timeout)
    if state is None:
        return
    how = state.value if isinstance(state, Known) else "state unknown"
    raise RunExists(
        f"run {run_id!r} of flow {flow_id!r} is already on this broker ({how}): a new run "
        f"needs an id of its own; `{RESUME_COMMAND} --resume {run_id}` continues that one, "
        f"`videoflow teardown --flow {flow_id} --run {run_id}` removes it")


__all__ = ["RESUME_COMMAND", "new_run_id", "take_run_id"]
