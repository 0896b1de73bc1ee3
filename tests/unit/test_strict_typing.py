"""What a user's code meets under ``mypy --strict``: the examples and every Python
block of the README check clean, and the API's types catch the slips they should (an
option misspelt, an event time that is not a number)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from mypy import api

from readme_blocks import python_blocks

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples").rglob("*.py"))  # examples/<name>/ too

SLIPS = '''\
from videoflow import Flow, ProducerNode
from videoflow.run.local import run_flow


class Camera(ProducerNode):
    def next(self) -> float:
        self.context.set_event_timestamp("now")
        return 1.0


flow = Flow([Camera()], [])
flow.run(ephemral=True)
run_flow(flow, ephemral=True)
flow.run(stop_after="soon")
report = flow.run(ephemeral=True)
reveal_type(report)
'''
"""A user's slips, each of which mypy must flag (checked line by line below)."""

_ERROR = re.compile(r"^(?P<path>[^:]+):(?P<line>\d+): (?P<kind>error|note): (?P<text>.*)$")


@pytest.fixture(scope="module")
def checked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, list[str]]]:
    """One mypy --strict run over the examples, the README's blocks and SLIPS: its
    errors and notes by file name (a README block's as README.md:LINE, its lines the
    README's)."""
    work = tmp_path_factory.mktemp("strict")
    config = work / "mypy.ini"
    config.write_text("[mypy]\n")  # not the project's: a user's defaults plus --strict
    files, readme = [str(p) for p in EXAMPLES], {}
    for block in python_blocks():
        path = work / f"readme_{block.line}.py"
        path.write_text(block.source, encoding="utf-8")
        # Report lines as the README's: the block's first line is the one after its fence.
        readme[str(path)] = (block.line + 1 - block.given.count("\n"))
        files.append(str(path))
    slips = work / "slips.py"
    slips.write_text(SLIPS, encoding="utf-8")
    files.append(str(slips))
    stdout, stderr, _status = api.run([
        "--strict", "--follow-imports=silent", "--python-version=3.10",
        "--config-file", str(config), "--cache-dir", str(work / "cache"),
        "--hide-error-context", "--no-error-summary", "--no-color-output", *files])
    assert not stderr, stderr
    found: dict[str, list[str]] = {}
    for line in stdout.splitlines():
        matched = _ERROR.match(line)
        assert matched, f"unparsed mypy output: {line}"
        path = matched["path"]
        if path in readme:
            where = f"README.md:{int(matched['line']) + readme[path] - 1}"
            name = "README.md"
        else:
            name = Path(path).name
            where = f"{name}:{matched['line']}"
        found.setdefault(name, []).append(f"{where}: {matched['kind']}: {matched['text']}")
    yield found


@pytest.mark.timeout(240)
def test_the_examples_and_every_readme_block_pass_mypy_strict(
        checked: dict[str, list[str]]) -> None:
    assert EXAMPLES
    errors = [line for name, lines in checked.items() if name != "slips.py"
              for line in lines]
    assert not errors, "\n".join(errors)


@pytest.mark.timeout(240)
def test_mypy_strict_flags_the_slips_a_user_makes_and_types_the_report(
        checked: dict[str, list[str]]) -> None:
    # Errors and what reveal_type says; mypy's notes saying where a callee is defined aside.
    lines = [line for line in checked.get("slips.py", [])
             if ": error: " in line or "Revealed type" in line]
    found = {int(line.split(":")[1]): line for line in lines}
    assert len(found) == len(lines), "\n".join(lines)  # one error a line, no more

    # The context is typed non-optional: the event time's type is checked, not a None.
    assert '"set_event_timestamp" of "RuntimeContext" has incompatible type "str"' in (
        found.get(7, "")), lines
    # Flow.run and run_flow declare their options, so a misspelt one is an error.
    assert 'Unexpected keyword argument "ephemral" for "run" of "Flow"' in (
        found.get(12, "")), lines
    assert 'Unexpected keyword argument "ephemral" for "run_flow"' in found.get(13, ""), lines
    assert 'Argument "stop_after" to "run" of "Flow" has incompatible type "str"' in (
        found.get(14, "")), lines
    assert 'Revealed type is "videoflow.core.report.RunReport"' in found.get(16, ""), lines
    assert set(found) == {7, 12, 13, 14, 16}, lines
