"""Flows the CLI tests name as module:attribute. Each reads its size and output
directory from the environment, so `videoflow provision`, every `videoflow worker` and
`videoflow run` build the same flow in their own processes."""

from __future__ import annotations

import os
from typing import Any

from flow_nodes import (
    NoModel,
    Numbers,
    Picky,
    PrintingScale,
    RawPrintingScale,
    Record,
    RejectMultiplesOf,
    Scale,
    WarningScale,
)

from videoflow.flow import Flow


def _env() -> tuple[int, float, str, float]:
    return (int(os.environ.get("VF_TEST_COUNT", "100")),
            float(os.environ.get("VF_TEST_PACE", "0")),
            os.environ.get("VF_TEST_OUT", "."),
            float(os.environ.get("VF_TEST_SINK_PACE", "0")))


def chain() -> Flow:
    """numbers -> scale(x2) -> record, the sink with VF_TEST_SINK_REPLICAS replicas."""
    count, pace, out, sink_pace = _env()
    numbers = Numbers(count, pace=pace)
    replicas = int(os.environ.get("VF_TEST_SINK_REPLICAS", "1"))
    sink = Record(out, pace=sink_pace, nb_tasks=replicas)(Scale(2)(numbers))
    return Flow([numbers], [sink], name="cli")


def _through(middle: Any, name: str) -> Flow:
    """numbers -> middle -> record, sized by the environment."""
    count, pace, out, _ = _env()
    numbers = Numbers(count, pace=pace)
    return Flow([numbers], [Record(out)(middle(numbers))], name=name)


def poison() -> Flow:
    """numbers -> reject multiples of 7 (poison) -> record."""
    return _through(RejectMultiplesOf(7), "clipoison")


def picky() -> Flow:
    """numbers -> picky (poison on 7, 17, ...; a RuntimeError on 3, 13, ..., retried
    once, 10 ms later) -> record."""
    return _through(Picky(name="picky", delivery={"max_retries": 1,
                                                   "backoff": {"base_ms": 10, "max_ms": 10}}),
                    "clipicky")


def warning_chain() -> Flow:
    """numbers -> scale(x2), which logs a warning -> record."""
    return _through(WarningScale(2), "cliwarn")


def printing_chain() -> Flow:
    """numbers -> scale(x2), which prints each value -> record."""
    return _through(PrintingScale(2), "cliprint")


def raw_printing_chain() -> Flow:
    """numbers -> scale(x2), which writes each value to fd 1 itself -> record."""
    return _through(RawPrintingScale(2), "cliraw")


def no_model() -> Flow:
    """numbers -> scale(x2), whose open() fails -> record."""
    return _through(NoModel(2, name="scale"), "clinomodel")


not_a_flow = 42
