"""videoflow.logs: the text and JSON formats, secrets masked in both, and the choice
handed down to the processes a command starts."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest

from videoflow import logs


@pytest.fixture(autouse=True)
def root_restored(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test's configure() undone: the root level, the handler, the environment."""
    root = logging.getLogger()
    level = root.level
    node_failures = logging.getLogger(logs.NODE_FAILURES)
    node_level = node_failures.level
    for name in (logs.LOG_FORMAT_ENV, logs.LOG_LEVEL_ENV):
        # set, then deleted: undone, whatever the test sets is removed too
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    yield
    logs.set_origin(None)
    if logs._installed is not None:  # the handler this test's configure() installed
        root.removeHandler(logs._installed)
        logs._installed = None
    root.setLevel(level)
    node_failures.setLevel(node_level)


@pytest.mark.parametrize("text, shown", [
    ("to nats://u:pw@h:4222 now", "to nats://u:***@h:4222 now"),
    ("token nats://t0k@h:1", "token nats://***@h:1"),
    ("list nats://a:1,nats://u:p@b:2", "list nats://a:1,nats://u:***@b:2"),
    ("no secret nats://h:4222/x@y", "no secret nats://h:4222/x@y"),
    ("tls://u:p@ss@h:1 'nats://x:y@z'", "tls://u:***@h:1 'nats://x:***@z'"),
    ("mail me at a@b.c", "mail me at a@b.c"),
])
def test_a_password_or_token_in_a_url_is_masked_anywhere_in_a_text(
        text: str, shown: str) -> None:
    assert logs.redact_text(text) == shown


def test_json_lines_carry_time_level_logger_message_pid_and_the_traceback(
        capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure("json", logging.WARNING)
    log = logging.getLogger("videoflow.test")
    log.info("not shown at WARNING")
    log.warning("reconnecting to %s", "nats://u:secret@h:4222")
    try:
        raise RuntimeError("broker said nats://u:secret@h:1")
    except RuntimeError:
        log.exception("gave up")
    lines = capsys.readouterr().err.splitlines()
    first, second = (json.loads(line) for line in lines[:2])
    assert len(lines) >= 2 and all(not line.startswith(" ") for line in lines)
    assert (first["level"], first["logger"], first["message"]) == (
        "WARNING", "videoflow.test", "reconnecting to nats://u:***@h:4222")
    assert first["time"].endswith("+00:00") and isinstance(first["pid"], int)
    assert second["level"] == "ERROR" and second["message"] == "gave up"
    assert second["exception"].startswith("Traceback (most recent call last):")
    assert "RuntimeError: broker said nats://u:***@h:1" in second["exception"]
    assert "secret" not in "".join(lines)


def test_text_lines_name_the_logger_and_mask_secrets(
        capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure("text", logging.WARNING)
    logging.getLogger("videoflow.broker.link").warning("away: nats://u:pw@h:1")
    assert capsys.readouterr().err == "videoflow: videoflow.broker.link: away: nats://u:***@h:1\n"


def test_a_replicas_process_names_the_replica_in_every_record(
        capsys: pytest.CaptureFixture[str]) -> None:
    logs.set_origin("scale[1]")
    logs.configure("text", logging.WARNING)
    logging.getLogger("videoflow.broker.link").warning("away: nats://u:pw@h:1")
    assert capsys.readouterr().err == (
        "videoflow: scale[1]: videoflow.broker.link: away: nats://u:***@h:1\n")
    logs.configure("json", logging.WARNING)
    logging.getLogger("videoflow.broker.link").warning("back")
    record = json.loads(capsys.readouterr().err)
    assert (record["replica"], record["logger"], record["message"]) == (
        "scale[1]", "videoflow.broker.link", "back")
    logs.set_origin(None)  # the engine's own process names none
    logging.getLogger("videoflow.run").warning("done")
    assert "replica" not in json.loads(capsys.readouterr().err)


def test_a_process_started_after_hand_down_logs_as_its_parent_chose(
        capsys: pytest.CaptureFixture[str]) -> None:
    logs.hand_down("json", logging.WARNING)
    logs.configure()  # what a replica does: read the environment
    logging.getLogger("videoflow.x").warning("hello")
    assert json.loads(capsys.readouterr().err)["message"] == "hello"
    assert logging.getLogger().level == logging.WARNING


def test_configuring_again_replaces_only_its_own_handler() -> None:
    root = logging.getLogger()
    theirs = logging.NullHandler()
    root.addHandler(theirs)
    try:
        logs.configure("text", logging.ERROR)
        logs.configure("json", logging.ERROR)
        ours = [h for h in root.handlers if isinstance(h.formatter, (logs.JsonFormatter,
                                                                      logs.RedactingFormatter))]
        assert len(ours) == 1 and isinstance(ours[0].formatter, logs.JsonFormatter)
        assert theirs in root.handlers
    finally:
        root.removeHandler(theirs)


@pytest.mark.parametrize("log_format, level, message", [
    ("xml", None, "log format must be one of text, json"),
    (None, "LOUD", "not a logging level"),
])
def test_an_unknown_format_or_level_is_refused(
        monkeypatch: pytest.MonkeyPatch, log_format: str | None, level: str | None,
        message: str) -> None:
    if level is not None:
        monkeypatch.setenv(logs.LOG_LEVEL_ENV, level)
    with pytest.raises(ValueError, match=message):
        logs.configure(log_format)


@pytest.mark.parametrize("verbose", [False, True], ids=["default", "-v"])
def test_a_nodes_first_failure_of_a_type_shows_by_default_and_every_one_with_v(
        capsys: pytest.CaptureFixture[str], verbose: bool) -> None:
    # What the videoflow command configures: ERROR by default, WARNING with -v.
    logs.configure("text", logging.WARNING if verbose else logging.ERROR)
    failures = logging.getLogger(logs.NODE_FAILURES)
    failures.warning("square raised RuntimeError: the first")
    failures.info("square raised RuntimeError: the second")
    logging.getLogger("videoflow.broker.link").warning("a reconnect")
    err = capsys.readouterr().err
    assert f"videoflow: {logs.NODE_FAILURES}: square raised RuntimeError: the first\n" in err
    assert ("the second" in err) is verbose
    assert ("a reconnect" in err) is verbose  # the library's other warnings: -v only
