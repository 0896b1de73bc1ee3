"""Frames through a whole flow on one host: by ref through the shared-memory store (the
local engine's default), read in place, bounded by its budget, and a payload that
vanished from shared memory dead-lettered while the flow goes on."""

from __future__ import annotations

from pathlib import Path

import pytest
from flow_nodes import FrameCheck, Frames, frames_seen

from videoflow.backends.shm_payload import shm_root
from videoflow.broker import server as embedded
from videoflow.core.constants import BATCH
from videoflow.core.naming import sanitize
from videoflow.flow import Flow
from videoflow.ops import dlq_list

pytestmark = pytest.mark.timeout(120)


def test_frames_arrive_whole_as_read_only_views_of_shared_memory_which_is_freed_after(
    nats_server: embedded.EmbeddedServer, out: Path,
) -> None:
    frames = Frames(60)
    sink = FrameCheck(str(out), name="sink")(frames)
    report = Flow([frames], [sink], BATCH, name="frames").run(nats_server.url, view=False)
    assert report.outcome == "completed", report.format()
    seen = frames_seen(out)
    assert sorted(i for i, *_ in seen) == list(range(60))
    assert all(whole and not writeable and mapped for _, whole, writeable, mapped in seen)
    assert not (shm_root() / sanitize("frames")).exists()  # the run's folder and the flow's


def test_a_budget_smaller_than_the_stream_holds_the_producer_back_and_loses_nothing(
    nats_server: embedded.EmbeddedServer, out: Path,
) -> None:
    # Room for 3 frames; the sink takes 20 ms each: the producer waits on the budget.
    frames = Frames(40)
    sink = FrameCheck(str(out), pace=0.02, name="sink")(frames)
    report = Flow([frames], [sink], BATCH, name="budget").run(
        nats_server.url, view=False, payload_budget=3 * 310_000)
    assert report.outcome == "completed", report.format()
    assert sorted(i for i, *_ in frames_seen(out)) == list(range(40))
    assert report.nodes["sink"].dropped_total == 0


def test_frames_gone_from_shared_memory_are_dead_lettered_and_the_flow_goes_on(
    nats_server: embedded.EmbeddedServer, out: Path, tmp_path: Path,
) -> None:
    marker = str(tmp_path / "vanished")
    frames = Frames(25, vanish_after=20, marker=marker)
    sink = FrameCheck(str(out), hold=marker, name="sink")(frames)
    report = Flow([frames], [sink], BATCH, name="vanish").run(nats_server.url, view=False)
    assert report.outcome == "completed", report.format()
    assert sorted(i for i, *_ in frames_seen(out)) == list(range(20, 25))
    node = report.nodes["sink"]
    assert (node.dead_lettered, node.dropped["undecodable"]) == (20, 20)
    letters = dlq_list(nats_server.url, "vanish", run_id=report.run_id)
    assert len(letters) == 20
    assert all(entry.record.reason == "undecodable"
               and entry.record.error_type.endswith("PayloadMissing") for entry in letters)
