"""What users import keeps importing wherever the code lives: every dotted name the
API reference gives (its five modules and the types and helpers they name), and the
top-level names a flow is written with."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

REFERENCE = Path(__file__).resolve().parents[3] / "shared" / "spec" / "messaging-api-reference.txt"

TOP_LEVEL = ("Flow", "ProducerNode", "ProcessorNode", "ConsumerNode", "JoinPolicy",
             "DeliveryPolicy", "PoisonMessage", "WorkerFatal", "BATCH", "REALTIME")

NOT_PATHS = {"videoflow.io"}  # a host name in the reference's examples, not a module


def resolve(dotted: str) -> object:
    """The object a dotted path names: its longest importable module prefix, then
    attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[cut:]:
            found = getattr(found, attribute)
        return found
    raise ModuleNotFoundError(dotted)


def reference_paths() -> list[str]:
    if not REFERENCE.exists():
        return []
    found = re.findall(r"videoflow(?:\.[A-Za-z_][A-Za-z0-9_]*)+", REFERENCE.read_text())
    return sorted(set(found) - NOT_PATHS)


@pytest.mark.skipif(not REFERENCE.exists(), reason="the API reference is not beside the repo")
def test_the_reference_names_many_paths() -> None:
    paths = reference_paths()
    assert len(paths) > 50
    for module in ("grouping", "jetstream_backend", "nats_messenger", "obligations",
                   "topology"):
        assert f"videoflow.messaging.{module}" in paths


@pytest.mark.parametrize("path", reference_paths())
def test_every_path_the_reference_gives_resolves(path: str) -> None:
    resolve(path)


def test_a_flow_is_written_with_names_from_the_top_level_alone() -> None:
    # A fresh interpreter: the names load on first use, not with the package.
    code = ("import sys, videoflow\n"
            "assert 'videoflow.flow' not in sys.modules\n"
            f"from videoflow import {', '.join(TOP_LEVEL)}\n"
            "from videoflow.flow import Flow as Home\n"
            "assert Flow is Home and BATCH == 'batch' and REALTIME == 'realtime'\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_an_unknown_top_level_name_is_refused() -> None:
    with pytest.raises(ImportError, match="Nope"):
        exec("from videoflow import Nope", {})
