"""The conventions a command-line user expects of `videoflow`, in process: --version,
the global -v before or after a command, numeric flags that refuse nonsense, and a flow
module that fails to import reported in one line (its traceback with -v)."""

from __future__ import annotations

import argparse
import importlib.metadata
import io
import json
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import videoflow
from videoflow import logs
from videoflow.cli.common import stdout_for_the_document
from videoflow.cli.main import build_parser, main


@pytest.fixture(autouse=True)
def logging_restored(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """main() configures logging and hands its choice down through the environment,
    as the command does for its replicas; in this process, both are undone after."""
    root = logging.getLogger()
    level = root.level
    for name in (logs.LOG_FORMAT_ENV, logs.LOG_LEVEL_ENV):
        # set, then deleted: undone, whatever the test sets is removed too
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    yield
    if logs._installed is not None:  # the handler main()'s configure() installed
        root.removeHandler(logs._installed)
        logs._installed = None
    root.setLevel(level)


@pytest.mark.parametrize("installed", ["9.8.7", None])
def test_version_prints_the_distribution_name_and_its_installed_version(
        installed: str | None, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Installed as videoflow-nats (9.8.7, to tell it from the package's own), or not
    # installed under that name at all: a source tree on sys.path. The installed
    # wheel's own answer is test_packaging's.
    def version(name: str) -> str:
        if name == "videoflow-nats" and installed is not None:
            return installed
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", version)
    with pytest.raises(SystemExit) as ended:
        main(["--version"])
    assert ended.value.code == 0
    assert capsys.readouterr().out == f"videoflow-nats {installed or videoflow.__version__}\n"


@pytest.mark.parametrize("argv", [
    ["-v", "status", "--flow", "f", "--run", "r"],
    ["status", "-v", "--flow", "f", "--run", "r"],
    ["status", "--flow", "f", "--run", "r", "--verbose"],
    ["dlq", "-v", "list", "--flow", "f"],
    ["dlq", "list", "--flow", "f", "-v"],
    ["run", "flows:chain", "-v"],
    ["demo", "-v"],
])
def test_verbose_is_taken_before_or_after_the_command(argv: list[str]) -> None:
    assert build_parser().parse_args(argv).verbose is True


@pytest.mark.parametrize("argv", [
    ["status", "--flow", "f", "--run", "r"],
    ["dlq", "list", "--flow", "f"],
])
def test_without_verbose_it_is_off(argv: list[str]) -> None:
    assert build_parser().parse_args(argv).verbose is False


@pytest.mark.parametrize("argv, flag", [
    (["run", "m:f", "--stop-after", "-5"], "--stop-after"),
    (["run", "m:f", "--stop-after", "nan"], "--stop-after"),
    (["run", "m:f", "--stop-after", "inf"], "--stop-after"),
    (["run", "m:f", "--stop-after", "soon"], "--stop-after"),
    (["provision", "m:f", "--out", "x", "--timeout", "nan"], "--timeout"),
    (["provision", "m:f", "--out", "x", "--ack-wait", "0"], "--ack-wait"),
    (["provision", "m:f", "--out", "x", "--max-retries", "-1"], "--max-retries"),
    (["worker", "--spec", "s", "--node", "n", "--replica", "-1"], "--replica"),
    (["worker", "--spec", "s", "--node", "n", "--progress-every", "0"], "--progress-every"),
])
def test_a_numeric_flag_out_of_range_is_a_usage_error_naming_it(
        argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ended:
        build_parser().parse_args(argv)
    assert ended.value.code == 2
    assert f"argument {flag}" in capsys.readouterr().err


def test_numeric_flags_in_range_are_taken() -> None:
    args = build_parser().parse_args(["run", "m:f", "--stop-after", "2.5"])
    assert args.stop_after == 2.5
    # 0 asks the flow to stop at once (a run that only needs to start and end).
    assert build_parser().parse_args(["run", "m:f", "--stop-after", "0"]).stop_after == 0
    args = build_parser().parse_args(["provision", "m:f", "--out", "x", "--ack-wait", "1",
                                      "--max-retries", "0", "--timeout", "0.5"])
    assert (args.ack_wait, args.max_retries, args.timeout) == (1, 0, 0.5)


@pytest.fixture
def flow_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A directory of flow modules, the current one (as a user runs `videoflow run`)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in ("vf_syntax", "vf_raises", "vf_builder", "vf_needs"):
        sys.modules.pop(name, None)


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def test_a_flow_module_with_a_syntax_error_is_one_line_naming_file_and_line(
        flow_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (flow_dir / "vf_syntax.py").write_text("x = 1\ndef broken(:\n    pass\n")
    assert main(["run", "vf_syntax:flow"]) == 2
    line = one_error_line(capsys)
    assert line.startswith("videoflow: error: cannot import 'vf_syntax': SyntaxError: ")
    assert line.endswith(f"({flow_dir / 'vf_syntax.py'}, line 2)")


def test_a_flow_module_that_raises_as_it_imports_is_one_line_naming_its_line(
        flow_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (flow_dir / "vf_raises.py").write_text("import os\nraise RuntimeError('no camera')\n")
    assert main(["run", "vf_raises:flow"]) == 2
    assert one_error_line(capsys) == (
        "videoflow: error: cannot import 'vf_raises': RuntimeError: no camera "
        f"({flow_dir / 'vf_raises.py'}, line 2)")


def test_a_flow_module_whose_own_import_fails_is_one_line_naming_that_import(
        flow_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (flow_dir / "vf_needs.py").write_text("import os\nimport vf_not_installed_xyz\n")
    assert main(["run", "vf_needs:flow"]) == 2
    assert one_error_line(capsys) == (
        "videoflow: error: cannot import 'vf_needs': ModuleNotFoundError: No module named "
        f"'vf_not_installed_xyz' ({flow_dir / 'vf_needs.py'}, line 2)")
    # A flow module that is not there at all has no line to name.
    assert main(["run", "vf_nowhere_xyz:flow"]) == 2
    assert one_error_line(capsys) == (
        "videoflow: error: cannot import 'vf_nowhere_xyz': No module named 'vf_nowhere_xyz'")


def test_with_json_logs_the_commands_own_error_is_a_json_record_too(
        flow_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (flow_dir / "vf_raises.py").write_text("import os\nraise RuntimeError('no camera')\n")
    assert main(["run", "vf_raises:flow", "--log-format", "json"]) == 2
    record = json.loads(one_error_line(capsys))
    assert (record["level"], record["logger"], record["message"]) == (
        "ERROR", "videoflow", "error: cannot import 'vf_raises': RuntimeError: no camera "
        f"({flow_dir / 'vf_raises.py'}, line 2)")
    assert "exception" not in record
    sys.modules.pop("vf_raises", None)
    # -v adds the traceback, inside the record.
    assert main(["run", "vf_raises:flow", "--log-format", "json", "-v"]) == 2
    record = json.loads(one_error_line(capsys))
    assert record["exception"].startswith("Traceback (most recent call last):")
    assert record["exception"].rstrip().endswith("RuntimeError: no camera")


def test_with_json_logs_a_taps_own_lines_are_records_and_its_messages_stay_on_stdout(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("VIDEOFLOW_NATS_URL", raising=False)
    store = tmp_path / "store"  # no run on it: the tap waits, then its time is up
    assert main(["tap", "f", "n", "--store-dir", str(store), "--seconds", "0.5",
                 "--log-format", "json"]) == 0
    out, err = capsys.readouterr()
    records = [json.loads(line) for line in err.splitlines()]
    assert [(r["logger"], r["message"]) for r in records] == [
        ("videoflow", f"waiting for a run on the store {store}"),
        ("videoflow", records[-1]["message"])]
    assert records[-1]["message"].startswith("tap: 0 messages in ") and out == ""


def test_a_flow_module_in_a_checkout_named_videoflow_is_still_the_users_code(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    checkout = tmp_path / "videoflow"  # `git clone .../videoflow`, a flow beside it
    checkout.mkdir()
    monkeypatch.chdir(checkout)
    monkeypatch.syspath_prepend(str(checkout))
    monkeypatch.delitem(sys.modules, "vf_in_checkout", raising=False)
    (checkout / "vf_in_checkout.py").write_text("import os\nimport vf_absent_xyz\n")
    assert main(["run", "vf_in_checkout:flow"]) == 2
    assert one_error_line(capsys) == (
        "videoflow: error: cannot import 'vf_in_checkout': ModuleNotFoundError: No module "
        f"named 'vf_absent_xyz' ({checkout / 'vf_in_checkout.py'}, line 2)")


def test_the_document_stdout_is_given_back_even_when_a_flush_is_interrupted(
        capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    class Interrupted(io.StringIO):
        armed = False

        def flush(self) -> None:
            if self.armed:  # a second Ctrl-C as the block ends
                raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        with stdout_for_the_document(True):
            os.write(1, b"a node printed\n")
            interrupted = Interrupted()
            interrupted.armed = True
            monkeypatch.setattr(sys, "stderr", interrupted)
    monkeypatch.undo()
    os.write(1, b"the document\n")
    out, err = capfd.readouterr()
    assert (out, err) == ("the document\n", "a node printed\n")


def test_a_flow_function_that_raises_is_one_line_and_verbose_adds_its_traceback(
        flow_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (flow_dir / "vf_builder.py").write_text(
        "def flow():\n    return {}['cameras']\n")
    assert main(["run", "vf_builder:flow"]) == 2
    assert one_error_line(capsys) == (
        "videoflow: error: vf_builder:flow() raised KeyError: 'cameras' "
        f"({flow_dir / 'vf_builder.py'}, line 2)")
    assert main(["run", "vf_builder:flow", "-v"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("videoflow: error: vf_builder:flow() raised KeyError")
    assert "Traceback (most recent call last):" in err and "return {}['cameras']" in err


@pytest.mark.parametrize("report, fail_on_dead_letters, code", [
    ({}, False, 0),
    ({"stopped_by": "stop_after"}, False, 0),
    ({"dead_lettered": 2}, False, 0),
    ({"dead_lettered": 2}, True, 3),
    ({"left_over": True}, False, 4),
    ({"left_over": True, "dead_lettered": 2}, True, 4),
    ({"outcome": "failed", "left_over": True, "dead_lettered": 2}, True, 1),
    ({"outcome": "stopped", "stopped_by": "SIGINT"}, False, 130),
    ({"outcome": "stopped", "stopped_by": "SIGINT", "left_over": True}, False, 130),
    ({"outcome": "failed", "stopped_by": "SIGINT"}, True, 130),
    ({"outcome": "stopped", "stopped_by": "SIGTERM"}, False, 143),
], ids=["completed", "stop_after", "dead-letters", "fail-on-dead-letters", "kept",
        "kept-first", "failed-first", "ctrl-c", "ctrl-c-twice", "ctrl-c-first", "sigterm"])
def test_the_run_exit_code_follows_the_report(
    report: dict[str, object], fail_on_dead_letters: bool, code: int,
) -> None:
    from videoflow.cli.main import run_exit_code
    from videoflow.core.report import NodeReport, RunReport

    dead = int(report.pop("dead_lettered", 0))  # type: ignore[call-overload]
    made = RunReport("f", "r1", "batch", "nats://x", **report,  # type: ignore[arg-type]
                     nodes={"n": NodeReport("processor", dead_lettered=dead)})
    assert run_exit_code(made, fail_on_dead_letters=fail_on_dead_letters) == code


URL_COMMANDS = {
    ("run",): ["m:f"],
    ("replay",): ["bag.db3", "--topics", "/t", "--into", "m:f"],
    ("provision",): ["m:f", "--out", "run.json"],
    ("worker",): ["--spec", "run.json", "--node", "n"],
    ("demo",): [],
    ("status",): ["--flow", "f", "--run", "r"],
    ("dlq", "list"): ["--flow", "f"],
    ("dlq", "show"): ["--flow", "f", "1"],
    ("dlq", "replay"): ["--flow", "f", "1"],
    ("dlq", "purge"): ["--flow", "f", "1"],
    ("teardown",): ["--flow", "f", "--run", "r"],
    ("buckets", "list"): [],
    ("buckets", "remove"): ["--flow", "f"],
    ("ls",): [],
    ("tap",): ["f", "n"],
    ("hz",): ["f", "n"],
}
"""Every command that takes --nats-url, with the arguments it requires."""


def _commands_taking_a_url(parser: argparse.ArgumentParser,
                           path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands_taking_a_url(sub, (*path, name))
        elif "--nats-url" in action.option_strings:
            yield path


def test_every_command_taking_a_url_is_checked_below() -> None:
    assert set(_commands_taking_a_url(build_parser())) == set(URL_COMMANDS)


@pytest.mark.parametrize("url, said", [
    ("http://localhost:4222", "has the scheme 'http://'"),
    ("not a url", "a host name holds no spaces"),
])
@pytest.mark.parametrize("command", sorted(URL_COMMANDS), ids=" ".join)
def test_a_malformed_broker_url_is_one_usage_error_naming_what_is_wrong(
        command: tuple[str, ...], url: str, said: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    # Before: nats-py took 'http' for the host and 'not a url' for a host name; the
    # command said "gaierror: Name or service not known" twice and exited 1.
    assert main([*command, *URL_COMMANDS[command], "--nats-url", url]) == 2
    line = one_error_line(capsys)
    assert said in line and f"'{url}'" in line
    assert "gaierror" not in line


def test_a_malformed_url_from_the_variable_is_refused_the_same_way(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("VIDEOFLOW_NATS_URL", "https://u:s3cret@broker:4222")
    assert main(["ls"]) == 2
    line = one_error_line(capsys)
    assert "has the scheme 'https://'" in line and "s3cret" not in line
