"""The shared-memory budget's writers: a payload's record names the writer (node,
replica) its bytes are charged to."""

from __future__ import annotations

from dataclasses import replace

import pytest

from videoflow.backends.payload import PayloadRecord
from videoflow.errors import UnobservableState

REF = "0" * 32


def test_a_record_keeps_the_writer_it_is_charged_to_and_an_older_one_reads_with_none(
) -> None:
    record = PayloadRecord(frozenset({"fuse"}), frozenset({"fuse"}), "cam:1", 1.0, 10,
                           writer=("cam", 3))
    assert PayloadRecord.from_json(record.to_json(), REF) == record
    older = replace(record, writer=None)
    assert b"writer" not in older.to_json()
    assert PayloadRecord.from_json(older.to_json(), REF) == older
    with pytest.raises(UnobservableState, match="unreadable") as caught:
        PayloadRecord.from_json(older.to_json()[:-1] + b',"writer":["cam"]}', REF)
    assert caught.value.reason == "malformed"
