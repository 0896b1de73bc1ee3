"""The Messenger seam (videoflow.core.engine): what every messenger must provide, and
the defaults the reference documents for a bare one."""

from __future__ import annotations

from typing import Any

import pytest

from videoflow.core.engine import (
    CHECKPOINT_METADATA_KEY,
    STOP_CONTROL,
    STOP_QUIESCE,
    STOP_REASONS,
    Messenger,
)


class Bare(Messenger):
    """Only what a messenger must provide."""

    def __init__(self) -> None:
        self.terminated = False

    def receive_message(self) -> dict[str, Any]:
        return {}

    def ack_inputs(self) -> None:
        pass

    def fail_inputs(self, exc: BaseException) -> None:
        pass

    def check_for_termination(self) -> bool:
        return self.terminated

    def publish_message(self, message: Any, metadata: dict[str, Any] | None = None) -> None:
        pass

    def publish_stop_signal(self) -> None:
        pass


def test_a_messenger_must_provide_the_input_output_and_termination_methods() -> None:
    assert Messenger.__abstractmethods__ == {
        "receive_message", "ack_inputs", "fail_inputs", "check_for_termination",
        "publish_message", "publish_stop_signal",
    }
    with pytest.raises(TypeError, match="abstract"):
        Messenger()  # type: ignore[abstract]


def test_a_bare_messenger_reports_the_control_stop_once_terminated() -> None:
    messenger = Bare()
    assert messenger.stop_reason() is None
    messenger.terminated = True
    assert messenger.stop_reason() == STOP_CONTROL


def test_the_documented_defaults_are_no_ops() -> None:
    messenger = Bare()
    assert messenger.set_output_event_timestamp(1.5) is None
    assert messenger.set_output_partition_key("cam-1") is None
    assert messenger.close() is None


def test_stop_reasons_are_distinct_and_the_checkpoint_key_is_reserved_looking() -> None:
    assert STOP_REASONS == (STOP_CONTROL, STOP_QUIESCE) and STOP_CONTROL != STOP_QUIESCE
    # A node's own metadata keys never start with the double underscore.
    assert CHECKPOINT_METADATA_KEY.startswith("__videoflow")
