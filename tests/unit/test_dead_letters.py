"""Dead-letter records (videoflow.messaging.dead_letters): what a node writes before it
terminates a delivery it gave up on, and what `videoflow dlq` reads back."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from videoflow.errors import WireError
from videoflow.messaging.dead_letters import (
    MAX_TRACEBACK,
    REASONS,
    dead_letter_for,
    dead_letter_msg_id,
    dead_letter_record_id,
    decode_dead_letter,
    encode_dead_letter,
)
from videoflow.wire.serialization import decode_envelope, encode_envelope


class Poisoned(ValueError):
    pass


def record(**overrides: object):  # type: ignore[no-untyped-def]
    fields: dict[str, object] = dict(
        flow_id="flow", run_id="run-1", node="fusion", parent="cam1", stream_seq=42,
        attempts=1, reason="poison", envelope=encode_envelope({"frame": 7}, trace_id="t",
                                                              seq=7),
        error=Poisoned("bad frame"), at=1767225600.5)
    fields.update(overrides)
    return dead_letter_for(**fields)  # type: ignore[arg-type]


def test_a_record_round_trips_and_keeps_the_input_exactly_as_it_arrived() -> None:
    made = record()
    back = decode_dead_letter(encode_dead_letter(made))
    assert back == made
    assert back.error_type == f"{__name__}.Poisoned" and back.error_message == "bad frame"
    assert decode_envelope(back.envelope)["message"] == {"frame": 7}  # replayable as sent


def test_undecodable_bytes_are_recorded_without_an_error() -> None:
    made = record(reason="undecodable", envelope=b"\xc1 not msgpack", error=None)
    back = decode_dead_letter(encode_dead_letter(made))
    assert (back.reason, back.error_type, back.error_message) == ("undecodable", "", "")
    assert back.envelope == b"\xc1 not msgpack"


def test_a_huge_error_message_is_truncated() -> None:
    assert len(record(error=Poisoned("x" * 100_000)).error_message) == 4096


def raised(error: BaseException, depth: int = 0) -> BaseException:
    """error, raised from `depth` nested calls (as a node's process() would raise it)
    and caught: its traceback has depth + 1 frames."""

    def nested(level: int) -> None:
        if level:
            other(level - 1)  # two functions in turn: Python shows every frame
        raise error

    def other(level: int) -> None:
        nested(level)

    try:
        nested(depth)
    except BaseException as caught:  # handed back to the test, traceback and all
        return caught
    raise AssertionError("unreachable")


def test_a_raised_error_keeps_its_traceback_with_the_file_and_line() -> None:
    made = record(error=raised(Poisoned("bad frame")))
    back = decode_dead_letter(encode_dead_letter(made))
    assert back.traceback == made.traceback
    assert back.traceback.startswith("Traceback (most recent call last):\n")
    assert f'File "{__file__}", line ' in back.traceback and ", in nested\n" in back.traceback
    assert back.traceback.endswith("Poisoned: bad frame\n")


def test_a_deep_traceback_keeps_its_innermost_frames_within_the_bound() -> None:
    made = record(error=raised(Poisoned("deep"), depth=200))
    assert len(made.traceback) <= MAX_TRACEBACK
    assert made.traceback.startswith("(earlier lines cut)\n  ")  # whole lines from there
    assert made.traceback.endswith("Poisoned: deep\n")
    assert made.traceback.count(", in nested\n") >= 10


def test_an_error_never_raised_or_no_error_has_no_traceback() -> None:
    assert record(error=Poisoned("made, not raised")).traceback == ""
    assert record(error=None, reason="undecodable").traceback == ""


def test_a_record_written_before_the_traceback_field_reads_with_none() -> None:
    fields = msgspec.structs.asdict(record(error=raised(Poisoned("old"))))
    del fields["traceback"]
    older = msgspec.msgpack.encode({**fields, "version": 1})
    back = decode_dead_letter(older)
    assert back.traceback == "" and back.error_message == "old"


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="reason"):
        record(reason="bored")
    with pytest.raises(ValueError, match=">= 1"):
        record(stream_seq=0)
    with pytest.raises(ValueError, match=">= 1"):
        record(attempts=0)
    assert set(REASONS) == {"poison", "retries_exhausted", "undecodable", "best_effort_failed",
                            "join_incomplete", "crashed_worker"}


def test_the_msg_id_names_the_delivery_so_a_retried_publish_deduplicates() -> None:
    assert dead_letter_msg_id("fusion", "cam1", 42) == dead_letter_msg_id("fusion", "cam1", 42)
    assert len({dead_letter_msg_id("fusion", "cam1", 42), dead_letter_msg_id("fusion", "cam2", 42),
                dead_letter_msg_id("fusion", "cam1", 43), dead_letter_msg_id("sink", "cam1", 42)}
               ) == 4


def test_the_record_id_names_the_run_so_a_second_run_is_never_a_duplicate() -> None:
    # The flow's dead-letter stream outlives runs and every run's parent streams number
    # from 1 again: the same (node, parent, seq) in run-2 is another dead letter.
    first = dead_letter_record_id("run-1", "fusion", "cam1", 42)
    assert first == dead_letter_record_id("run-1", "fusion", "cam1", 42)
    assert first != dead_letter_record_id("run-2", "fusion", "cam1", 42)
    assert len({first, dead_letter_record_id("run-1", "fusion", "cam2", 42),
                dead_letter_record_id("run-1", "fusion", "cam1", 43),
                dead_letter_record_id("run-1", "sink", "cam1", 42)}) == 4
    assert first == "dlq:run-1:fusion:cam1:42"


def test_a_future_version_or_a_foreign_record_is_a_wire_error() -> None:
    later = msgspec.msgpack.encode({**msgspec.structs.asdict(record()), "version": 2})
    with pytest.raises(WireError, match="not a dead-letter record"):
        decode_dead_letter(later)
    with pytest.raises(WireError, match="not a dead-letter record"):
        decode_dead_letter(encode_envelope("data", trace_id="t", seq=1))


@given(st.binary(max_size=256))
def test_random_bytes_decode_or_raise_wire_error_only(data: bytes) -> None:
    try:
        decode_dead_letter(data)
    except WireError:
        pass
