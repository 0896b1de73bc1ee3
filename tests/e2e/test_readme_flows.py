"""The README's flows, run as its reader runs them: each script saved under the name
the README gives it and run with ``python``, every replica a process of its own on
the embedded broker. A script followed by an output block prints those lines."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from readme_blocks import Block, printed_above_report, python_blocks

pytestmark = pytest.mark.timeout(120)

SCRIPTS = [b for b in python_blocks() if b.is_script]


@pytest.mark.parametrize("block", SCRIPTS, ids=[b.id for b in SCRIPTS])
def test_each_readme_flow_runs_to_completion_printing_what_the_readme_shows(
        block: Block, tmp_path: Path) -> None:
    script = tmp_path / (block.file_name or f"readme_{block.line}.py")
    script.write_text(block.source, encoding="utf-8")
    env = dict(os.environ)
    env.pop("VIDEOFLOW_NATS_URL", None)  # the embedded broker, as on a fresh machine

    ran = subprocess.run([sys.executable, script.name], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=100)

    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "completed in" in ran.stdout, ran.stdout + ran.stderr
    if block.output is not None:
        # Groups reach a node as they complete (the README says so): compared as a set.
        assert sorted(printed_above_report(ran.stdout)) == sorted(
            block.output.splitlines()), ran.stdout
