"""The README's Python blocks that need no broker run here: each fragment executed,
tracing_setup.py made the tracing setup it is said to be. Its flows run in
tests/e2e/test_readme_flows.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import readme_blocks
from readme_blocks import Block, python_blocks

BLOCKS = python_blocks()
TRACING = "tracing_setup.py"
TEST_FILES = [b for b in BLOCKS if (b.file_name or "").startswith("test_")]
SNIPPETS = [b for b in BLOCKS
            if not b.is_script and b.file_name != TRACING and b not in TEST_FILES]
# Those on the pytest plugin's broker run in tests/e2e/test_pytest_plugin.py.
TEST_FILES = [b for b in TEST_FILES if not b.needs_broker]


def test_every_python_fence_of_the_readme_is_read_as_a_block() -> None:
    text = readme_blocks.README.read_text(encoding="utf-8")

    assert len(BLOCKS) == text.count("\n```python\n")
    assert [b.file_name for b in BLOCKS].count(TRACING) == 1
    assert [b for b in BLOCKS if b.is_script], "no flow to run in the README"
    assert SNIPPETS


def test_a_block_that_uses_a_name_nothing_defines_is_refused() -> None:
    block = Block(line=1, code="sink = Sink()(camera)\n", before="", output=None)

    with pytest.raises(KeyError, match="Sink"):
        block.given  # noqa: B018 - the read is the test


def test_the_output_block_is_the_one_a_short_paragraph_after_the_script() -> None:
    text = ("Run it:\n\n```python\nif __name__ == \"__main__\":\n    pass\n```\n\n"
            "It prints:\n\n```text\nhello\n```\n\nLater, far off:\n\n```python\nx = 1\n```\n"
            + "prose\n" * 5 + "\n```text\nnot x's\n```\n")

    first, second = python_blocks(text)

    assert (first.is_script, first.output) == (True, "hello\n")
    assert (second.is_script, second.output) == (False, None)


@pytest.mark.parametrize("block", SNIPPETS, ids=[b.id for b in SNIPPETS])
def test_each_readme_fragment_runs(block: Block) -> None:
    namespace: dict[str, object] = {"__name__": "readme_fragment"}

    exec(compile(block.source, block.id, "exec"), namespace)  # noqa: S102 - the README's own code


@pytest.mark.timeout(120)
@pytest.mark.parametrize("block", TEST_FILES, ids=[b.id for b in TEST_FILES])
def test_each_readme_test_file_passes_under_pytest(block: Block, tmp_path: Path) -> None:
    assert block.file_name is not None
    (tmp_path / block.file_name).write_text(block.source, encoding="utf-8")
    written = block.source.count("\ndef test_")

    ran = subprocess.run([sys.executable, "-m", "pytest", block.file_name, "-q",
                          "-p", "no:cacheprovider", "-p", "no:randomly"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=110)

    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert f"{written} passed" in ran.stdout, ran.stdout


def test_the_readme_shows_a_test_file() -> None:
    assert [b.file_name for b in TEST_FILES] == ["test_fusion.py"]


@pytest.mark.timeout(60)
def test_the_readmes_tracing_setup_gives_every_replica_spans_printed_as_json(
        tmp_path: Path) -> None:
    block = next(b for b in BLOCKS if b.file_name == TRACING)
    (tmp_path / TRACING).write_text(block.source, encoding="utf-8")
    # What a replica does at start with VIDEOFLOW_TRACING_SETUP set as the README sets it
    # (in a process of its own: a tracer provider is set once per process).
    replica = ("from videoflow.messaging import tracing\n"
               "tracing.check_setup()\n"
               "tracer = tracing.active_tracer()\n"
               "assert tracer is not None, 'no tracer from the setup'\n"
               "with tracer.start_as_current_span('readme-span'):\n"
               "    pass\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path),
           "VIDEOFLOW_TRACING_SETUP": "tracing_setup:install"}
    env.pop("VIDEOFLOW_TRACING", None)

    ran = subprocess.run([sys.executable, "-c", replica], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=50)

    assert ran.returncode == 0, ran.stderr
    assert '"name": "readme-span"' in ran.stdout, ran.stdout
