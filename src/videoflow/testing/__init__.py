"""Testing and benchmarking flows.

- ``simulate``: a flow run in this process on the memory adapter and simulated time,
  from scripted inputs (``Input``, ``Silent``) and faults (``Crash``), returning a
  ``SimulationResult`` (outputs, groups, drops, dead letters, join status, report);
  ``simulate_node``: one node on given inputs, the same way.
- ``videoflow.testing.plugin``: the pytest plugin's fixtures.
- ``videoflow.testing.bench``: timing a flow under pytest-benchmark.

Names are imported when first used: the pytest plugin loads this package in every
test session of anyone who installs videoflow, and must cost nothing there.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from videoflow.testing.script import (
        Crash,
        Drop,
        Group,
        Input,
        Output,
        Silent,
        SimulationResult,
    )
    from videoflow.testing.simulation import simulate, simulate_node

_WHERE = {"simulate": "videoflow.testing.simulation",
          "simulate_node": "videoflow.testing.simulation",
          **{name: "videoflow.testing.script" for name in (
              "Crash", "Drop", "Group", "Input", "Output", "Silent", "SimulationResult")}}


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'videoflow.testing' has no attribute {name!r}")
    return getattr(import_module(where), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])  # the lazy names too, as videoflow's own dir()


__all__ = ["Crash", "Drop", "Group", "Input", "Output", "Silent", "SimulationResult",
           "simulate", "simulate_node"]
