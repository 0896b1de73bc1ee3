"""The operator CLI's wiring and formatting, without a broker."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest

from videoflow import ops
from videoflow.backends.messaging import Known, Unknown
from videoflow.cli import ops as cli_ops
from videoflow.cli.common import ENV_NATS_URL
from videoflow.cli.decoded import SHOWN_CHARS, describe, when


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="videoflow")
    sub = parser.add_subparsers(dest="command", required=True)
    cli_ops.register(sub)
    return parser.parse_args(argv)


def test_every_command_sets_func_and_the_url_falls_back_to_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for argv in (["status", "--flow", "f", "--run", "r"], ["dlq", "list", "--flow", "f"],
                 ["dlq", "show", "--flow", "f", "3"], ["dlq", "replay", "--flow", "f", "--all"],
                 ["dlq", "purge", "--flow", "f", "1", "--yes"],
                 ["teardown", "--flow", "f", "--run", "r"]):
        assert callable(parse(argv).func)
    args = parse(["status", "--flow", "f", "--run", "r"])
    monkeypatch.delenv(ENV_NATS_URL, raising=False)
    assert cli_ops.given_url(args) is None  # the embedded broker on the store
    monkeypatch.setenv(ENV_NATS_URL, "nats://broker:4222")
    assert cli_ops.given_url(args) == "nats://broker:4222"
    assert cli_ops.given_url(parse(["status", "--flow", "f", "--run", "r", "--nats-url",
                                     "nats://x:1"])) == "nats://x:1"


def test_without_a_url_and_without_a_store_there_is_one_line_and_nothing_is_made(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    # A status of nothing that ever ran must not make a store (or start a broker) to
    # report an empty one.
    monkeypatch.delenv(ENV_NATS_URL, raising=False)
    nowhere = tmp_path / "never-used"
    args = parse(["dlq", "list", "--flow", "f", "--store-dir", str(nowhere)])
    assert args.func(args) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"videoflow: error: no broker store at {nowhere}")
    assert "--nats-url" in line and "--store-dir" in line
    assert not nowhere.exists()


def test_purge_without_yes_refuses_in_one_line_with_exit_code_2_before_connecting(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The URL is never dialled: the refusal comes first.
    args = parse(["dlq", "purge", "--flow", "f", "--run", "r", "--nats-url", "nats://x:1"])
    assert args.func(args) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == ("videoflow: error: dlq purge deletes dead letters for good; "
                            "add --yes to confirm\n")


@pytest.mark.parametrize("argv, message", [
    (["dlq", "replay", "--flow", "f", "3", "--all"], "not both"),
    (["dlq", "replay", "--flow", "f", "3", "--run", "r"], "not both"),
    (["dlq", "replay", "--flow", "f"], "name the dead letters"),
    (["dlq", "purge", "--flow", "f", "--yes"], "name the dead letters"),
    (["dlq", "list", "--flow", "f", "--run", "_dlq"], "reserved"),
])
def test_contradictory_or_bad_arguments_are_a_one_line_usage_error(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str],
) -> None:
    args = parse([*argv, "--nats-url", "nats://x:1"])
    assert args.func(args) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("videoflow: error: ") and message in line


def test_a_bad_timeout_or_sequence_is_refused_by_the_parser() -> None:
    with pytest.raises(SystemExit, match="2"):
        parse(["status", "--flow", "f", "--run", "r", "--timeout", "0"])
    with pytest.raises(SystemExit, match="2"):
        parse(["dlq", "show", "--flow", "f", "0"])


def test_unknown_prints_as_unknown_with_its_reason_never_as_zero() -> None:
    missing = Unknown("timeout", "no answer in 1 s")
    assert cli_ops._text(Known(0)) == "0"
    assert cli_ops._text(missing) == "unknown (timeout)"
    assert cli_ops._json_value(missing) == {"unknown": "timeout", "detail": "no answer in 1 s"}
    status = ops.RunStatus("f", "r", missing, "vf-f-dlq", Unknown("missing", "no DLQ"))
    text = cli_ops._status_text(status)
    assert "streams: unknown (timeout)" in text
    assert text.endswith("dead letters of this run (vf-f-dlq): unknown (missing)")
    document = json.loads(json.dumps(cli_ops._status_json(status)))
    assert document["streams"] == {"unknown": "timeout", "detail": "no answer in 1 s"}
    assert document["exists"] == {"unknown": "timeout", "detail": "no answer in 1 s"}
    assert document["dlq_count"] == {"unknown": "missing", "detail": "no DLQ"}


def test_times_are_shown_in_utc_to_the_millisecond() -> None:
    assert when(0.0) == "1970-01-01 00:00:00.000 UTC"
    assert when(1_796_300_000.5) == "2026-12-03 12:13:20.500 UTC"
    assert when(None) == "-"


def test_an_input_is_described_without_dumping_its_arrays_or_bytes() -> None:
    frame = np.zeros((1080, 1920, 3), dtype=np.uint8)
    assert describe({"frame": frame, "raw": b"abc", "label": "person", "n": 3}) == (
        "{'frame': array(uint8, shape (1080, 1920, 3)), 'raw': <3 bytes>, "
        "'label': 'person', 'n': 3}")
    assert describe(list(range(25))) == (
        "[" + ", ".join(map(str, range(20))) + ", ... 5 more]")
    long = describe("x" * 1000)
    assert len(long) == SHOWN_CHARS and long.endswith("...")


def test_dlq_show_prints_the_traceback_and_its_json_carries_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    from videoflow.messaging.dead_letters import dead_letter_for
    from videoflow.wire.serialization import encode_envelope

    def process(value: int) -> None:
        raise RuntimeError(f"cannot take {value}")

    try:
        process(3)
    except RuntimeError as error:
        record = dead_letter_for("f", "r1", "square", "numbers", 4, 4, "retries_exhausted",
                                 encode_envelope(3, trace_id="t", seq=4), error, 1.0)
    monkeypatch.setattr(ops, "dlq_show", lambda *_, **__: ops.DeadLetterEntry(
        9, "vf.f._dlq.r1.square", record))
    args = parse(["dlq", "show", "--flow", "f", "9", "--nats-url", "nats://x:1"])
    assert args.func(args) == 0
    lines = capsys.readouterr().out.splitlines()
    start = lines.index("traceback:")
    shown = lines[start + 1:]
    assert shown[0] == "  Traceback (most recent call last):"
    assert any(line.startswith(f'    File "{__file__}", line ') and line.endswith(
        ", in process") for line in shown), shown
    assert shown[-1] == "  RuntimeError: cannot take 3"
    args = parse(["dlq", "show", "--flow", "f", "9", "--nats-url", "nats://x:1", "--json"])
    assert args.func(args) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["traceback"] == record.traceback
    assert document["traceback"].endswith("RuntimeError: cannot take 3\n")
