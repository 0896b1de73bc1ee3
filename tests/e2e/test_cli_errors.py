"""A node's exceptions as `videoflow run` shows them: logged with their traceback on
stderr (the first of each type without -v, every one with it), kept in the dead letter
and printed by `dlq show`, counted on the report's last line with the command that
lists them, and, with --fail-on-dead-letters, the run's exit code."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from flow_nodes import applied
from test_cli import environment, videoflow

from videoflow.broker import server as embedded
from videoflow.cli.common import EXIT_DEAD_LETTERS

pytestmark = pytest.mark.timeout(180)

NODES = Path(__file__).resolve().parent / "helpers" / "flow_nodes.py"
RAISED = re.compile(r"^videoflow: picky\[0\]: videoflow\.core\.task: picky raised on its "
                    r"input \(numbers [0-9a-f]+:\d+\): (\w+): (.*?); ", re.MULTILINE)


def raised_where(stderr: str, line: str) -> None:
    """The traceback follows the line it belongs to, and names the node's own frame."""
    after = stderr[stderr.index(line):]
    assert after.split("\n", 2)[1] == "Traceback (most recent call last):", after
    assert f'File "{NODES}", line ' in after and ", in process\n" in after, after


def test_a_nodes_first_failure_of_each_type_is_logged_with_its_traceback_without_v(
    nats_server: embedded.EmbeddedServer, out: Path,
) -> None:
    # 3 and 13 raise RuntimeError twice each (retried once), 7 and 17 are poison.
    done = videoflow("run", "flows:picky", "--nats-url", nats_server.url,
                     "--fail-on-dead-letters", env=environment(out, count=20))
    assert done.returncode == EXIT_DEAD_LETTERS == 3, done.stderr
    # One line per type, each with its traceback: no line per input.
    said = RAISED.findall(done.stderr)
    assert sorted(said) == [("PoisonMessage", "7 ends in 7"),
                            ("RuntimeError", "cannot take 3")], done.stderr
    for line in RAISED.finditer(done.stderr):
        raised_where(done.stderr, line.group(0))
    assert done.stderr.count("Traceback (most recent call last):") == 2, done.stderr
    assert sorted(v for (v,) in applied(out)) == [
        v for v in range(20) if v % 10 not in (3, 7)]
    # The report's last line: how many, and the command that lists them.
    last = done.stdout.rstrip("\n").splitlines()[-1]
    head, _, listing = last.partition(", listed by: ")
    assert head == "  4 inputs dead-lettered", last
    words = shlex.split(listing)
    run_id = words[words.index("--run") + 1]
    assert words == ["videoflow", "dlq", "list", "--flow", "clipicky", "--run", run_id,
                     "--nats-url", nats_server.url]
    listed = videoflow(*words[1:])  # the command as printed
    assert listed.returncode == 0, listed.stderr
    rows = [line.split(None, 7) for line in listed.stdout.splitlines()[1:]]
    assert sorted((row[6], row[7]) for row in rows) == [
        ("poison", "videoflow.core.policies.PoisonMessage: 17 ends in 7"),
        ("poison", "videoflow.core.policies.PoisonMessage: 7 ends in 7"),
        ("retries_exhausted", "builtins.RuntimeError: cannot take 13"),
        ("retries_exhausted", "builtins.RuntimeError: cannot take 3")], listed.stdout
    # dlq show prints where it was raised: the node's file and line.
    (seq,) = [row[0] for row in rows if row[7].endswith("cannot take 13")]
    shown = videoflow("dlq", "show", "--flow", "clipicky", seq, "--nats-url",
                      nats_server.url)
    assert shown.returncode == 0, shown.stderr
    traceback = shown.stdout[shown.stdout.index("\ntraceback:\n"):]
    assert "  Traceback (most recent call last):\n" in traceback
    assert f'    File "{NODES}", line ' in traceback and ", in process\n" in traceback
    assert traceback.rstrip("\n").endswith("  RuntimeError: cannot take 13"), traceback


def test_with_v_every_failure_is_logged_and_dead_letters_alone_exit_0(
    nats_server: embedded.EmbeddedServer, out: Path,
) -> None:
    done = videoflow("run", "flows:picky", "--nats-url", nats_server.url, "--json", "-v",
                     env=environment(out, count=20))
    assert done.returncode == 0, done.stderr  # dead letters fail a run only when asked
    said = RAISED.findall(done.stderr)
    assert sorted(said) == sorted([("RuntimeError", "cannot take 3")] * 2
                                  + [("RuntimeError", "cannot take 13")] * 2
                                  + [("PoisonMessage", "7 ends in 7"),
                                     ("PoisonMessage", "17 ends in 7")]), done.stderr
    for line in RAISED.finditer(done.stderr):
        raised_where(done.stderr, line.group(0))
    report = json.loads(done.stdout)
    assert report["outcome"] == "completed"
    assert report["nodes"]["picky"]["dead_lettered"] == 4
    assert report["dead_letters"].startswith("4 inputs dead-lettered, listed by: videoflow "
                                             "dlq list --flow clipicky --run ")
