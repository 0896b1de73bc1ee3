"""Flow.run declares run_flow's options, each with run_flow's default, and hands
every one of them through."""

from __future__ import annotations

import inspect
import re
from typing import Any

import pytest

from videoflow.flow import Flow
from videoflow.run import local

OPTIONS = [p for p in inspect.signature(local.run_flow).parameters.values()
           if p.name != "flow"]


def _documented(function: Any) -> set[str]:
    """The names an Arguments section documents ('a / b / c: ...' names three)."""
    doc = inspect.getdoc(function) or ""
    section = doc.split("Arguments:", 1)[1].split("Returns:", 1)[0]
    names: set[str] = set()
    for line in section.splitlines():
        entry = re.match(r"    ([\w /]+):", line)
        if entry:
            names.update(name.strip() for name in entry.group(1).split("/"))
    return names


def test_flow_run_declares_every_run_flow_option_with_its_kind_default_and_type() -> None:
    declared = [p for p in inspect.signature(Flow.run).parameters.values()
                if p.name != "self"]

    assert [(p.name, p.kind, p.default, p.annotation) for p in declared] == [
        (p.name, p.kind, p.default, p.annotation) for p in OPTIONS]
    assert not [p for p in declared if p.kind is p.VAR_KEYWORD]


@pytest.mark.parametrize("function", [Flow.run, local.run_flow], ids=["Flow.run", "run_flow"])
def test_every_option_is_documented(function: Any) -> None:
    missing = {p.name for p in OPTIONS} - _documented(function)
    assert not missing, f"{function.__qualname__} does not document {sorted(missing)}"


def test_flow_run_hands_every_option_to_run_flow_as_given(
        monkeypatch: pytest.MonkeyPatch) -> None:
    received: dict[str, Any] = {}

    def recorder(flow: Any, **options: Any) -> str:
        received.update(options, flow=flow)
        return "report"

    monkeypatch.setattr(local, "run_flow", recorder)
    flow = Flow([], [], name="options")
    # A value of its own per option, none a default, so a swapped or dropped one shows.
    given = {p.name: object() for p in OPTIONS}

    assert flow.run(**given) == "report"
    assert received == {**given, "flow": flow}
