"""Slow nodes for the settlement and lease tests: each input takes a set time, and each
replica records what it finished, a line per input, before its node returns."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from videoflow.core.node import ConsumerNode, Node, ProcessorNode


def _finish(node: Node, log_dir: str, value: Any) -> None:
    assert node.context is not None
    path = Path(log_dir) / f"{node.context.node_name}.{node.context.replica_id}"
    with path.open("a") as log:
        log.write(f"{value}\n")
        log.flush()
        os.fsync(log.fileno())


class SlowSink(ConsumerNode):
    def __init__(self, log_dir: str, seconds: float, **options: Any) -> None:
        super().__init__(**options)
        self.log_dir, self.seconds = log_dir, seconds

    def consume(self, value: Any) -> None:
        time.sleep(self.seconds)
        _finish(self, self.log_dir, value)


class SlowPass(ProcessorNode):
    def __init__(self, log_dir: str, seconds: float, **options: Any) -> None:
        super().__init__(**options)
        self.log_dir, self.seconds = log_dir, seconds

    def process(self, value: Any) -> Any:
        time.sleep(self.seconds)
        _finish(self, self.log_dir, value)
        return value


def done(log_dir: Path, node: str) -> dict[int, int]:
    """How many inputs each replica of node finished so far, by replica id."""
    return {int(path.suffix[1:]): len(path.read_text().splitlines())
            for path in log_dir.glob(f"{node}.*")}
