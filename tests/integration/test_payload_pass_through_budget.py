"""A pass-through processor in a flow whose shared-memory budget holds fewer than two
frames: its output is a second name for its input's bytes, which the budget counts
once (the store's own rules are in tests/unit/test_shm_pass_through_budget.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from flow_nodes import FrameCheck, Frames, frames_seen  # e2e's, in tests/e2e/helpers

from videoflow.broker import server as embedded
from videoflow.core.constants import BATCH
from videoflow.core.node import ProcessorNode
from videoflow.flow import Flow

pytestmark = pytest.mark.timeout(120)

FRAME_BYTES = 310_000  # a VGA frame of Frames, encoded, rounded up


class PassThrough(ProcessorNode):
    """Returns each message as it read it: published as a second name for its bytes."""

    def process(self, message: Any) -> Any:
        return message


def test_frames_passed_through_unchanged_fit_a_budget_of_less_than_two_frames(
    nats_server: embedded.EmbeddedServer, tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    frames = Frames(4)
    passed = PassThrough(name="pass")(frames)
    sink = FrameCheck(str(out), name="sink")(passed)
    report = Flow([frames], [sink], BATCH, name="passbudget").run(
        nats_server.url, view=False, payload_budget=3 * FRAME_BYTES // 2)
    assert report.outcome == "completed", report.format()
    seen = frames_seen(out)
    assert sorted(i for i, *_ in seen) == list(range(4))
    assert all(whole and mapped for _, whole, _writeable, mapped in seen)
