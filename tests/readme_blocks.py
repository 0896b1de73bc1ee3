"""The README's Python blocks, as the tests that run them read them.

Every ```python block is run by a test, so the README cannot rot:

- a script (one with ``if __name__ == "__main__":``) runs as ``python file.py``
  (tests/e2e/test_readme_flows.py), and prints what an output block right after it
  shows;
- ``tracing_setup.py`` is made the replicas' tracing setup, as the README then uses
  it (tests/unit/test_readme_blocks.py);
- a test file (``test_*.py``) runs under pytest: in tests/unit/test_readme_blocks.py,
  or in tests/e2e/test_pytest_plugin.py when it uses the pytest plugin's broker
  (its videoflow_server, videoflow_run or videoflow_benchmark fixture);
- every other block is executed (the same test module).

And mypy --strict reads them all (tests/unit/test_strict_typing.py).
"""

from __future__ import annotations

import ast
import builtins
import re
from dataclasses import dataclass
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"

GIVEN = {
    "fuse": ("from videoflow import ProcessorNode, ProducerNode\n"
             "fuse = ProcessorNode(name='fuse')(ProducerNode(name='cameras'))\n"),
}
"""What a fragment takes from the text around it, by name: the node the README's
SubjectSink line wires to is the join it has been describing."""

BROKER_FIXTURES = ("videoflow_server", "videoflow_run", "videoflow_benchmark")
"""The pytest plugin's fixtures that start its session's nats-server."""

_FENCE = re.compile(r"^```(\w*)\s*$")
_REPORT = re.compile(r"^run \S+ of flow ")


@dataclass(frozen=True)
class Block:
    """One fenced block of the README.

    Attributes:
        line: the README line of its opening fence (1-based).
        code: its text.
        before: the paragraph right before it.
        output: the text block right after it, with one paragraph between at most
            (what a script prints), else None.
    """

    line: int
    code: str
    before: str
    output: str | None

    @property
    def is_script(self) -> bool:
        return 'if __name__ == "__main__":' in self.code

    @property
    def needs_broker(self) -> bool:
        """It asks for a fixture of the pytest plugin that starts a nats-server."""
        return any(name in self.code for name in BROKER_FIXTURES)

    @property
    def file_name(self) -> str | None:
        """The file the README tells the reader to save it as (`name.py` in the
        paragraph before it), else None."""
        named = re.search(r"`(\w+\.py)`", self.before)
        return named.group(1) if named else None

    @property
    def given(self) -> str:
        """The definitions of the names it uses but does not define (GIVEN).

        Raises:
            KeyError: a name it uses that neither it nor GIVEN defines.
        """
        return "".join(GIVEN[name] for name in sorted(free_names(self.code)))

    @property
    def source(self) -> str:
        """Its code, with what it takes from the text around it in front."""
        return self.given + self.code

    @property
    def id(self) -> str:
        return f"README.md:{self.line}"


def _fenced(text: str) -> list[tuple[str, int, str, str]]:
    """(language, fence line, body, paragraph before) of each fenced block."""
    found, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        start = i
        while start > 0 and lines[start - 1].strip():
            start -= 1
        if start == i:  # a blank line, then the paragraph before it
            start = i - 1
            while start > 0 and not lines[start - 1].strip():
                start -= 1
            paragraph_end = start
            while start > 0 and lines[start - 1].strip():
                start -= 1
            before = "\n".join(lines[start:paragraph_end])
        else:
            before = "\n".join(lines[start:i])
        found.append((opening.group(1), i + 1, "\n".join(lines[i + 1:end]) + "\n", before))
        i = end + 1
    return found


def python_blocks(text: str | None = None) -> list[Block]:
    """The README's Python blocks, each with the output block that follows it."""
    text = README.read_text(encoding="utf-8") if text is None else text
    lines = text.splitlines()
    fenced = _fenced(text)
    blocks = []
    for k, (language, line, body, before) in enumerate(fenced):
        if language != "python":
            continue
        output = None
        if k + 1 < len(fenced) and fenced[k + 1][0] == "text":
            closing = line + body.count("\n")  # the python block's closing fence, 0-based
            between = [s for s in lines[closing + 1:fenced[k + 1][1] - 1] if s.strip()]
            if len(between) <= 3:  # one short paragraph: "It prints:"
                output = fenced[k + 1][2]
        blocks.append(Block(line, body, before, output))
    return blocks


def free_names(code: str) -> set[str]:
    """The names code reads at module level or in its functions that nothing in it
    binds and that are not builtins."""
    tree = ast.parse(code)
    bound: set[str] = set()
    read: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (read if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
    return read - bound - set(dir(builtins))


def printed_above_report(stdout: str) -> list[str]:
    """What a script's nodes printed: its stdout up to the run's report."""
    lines = stdout.splitlines()
    end = next((i for i, line in enumerate(lines) if _REPORT.match(line)), len(lines))
    return lines[:end]
