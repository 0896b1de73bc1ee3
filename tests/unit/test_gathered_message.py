"""gather_message: encode_message's bytes exactly, with large arrays left as pieces of
their own memory (no copy) for a store to write with one gathering call."""

from __future__ import annotations

import itertools
import threading
from typing import Any

import numpy as np
import pytest

from videoflow.wire import offload
from videoflow.wire.offload import (
    GATHER_ABOVE_BYTES,
    GatheredMessage,
    decode_message,
    encode_message,
    gather_message,
)

RNG = np.random.default_rng(7)
FRAME = RNG.integers(0, 256, (1080, 1920, 3), dtype=np.uint8)
AT = GATHER_ABOVE_BYTES

MESSAGES: dict[str, Any] = {
    "a frame in a dict": {"i": 3, "frame": FRAME},
    "a bare frame": FRAME,
    "frames in lists and dicts, other values between": [
        {"left": FRAME[:540], "t": 1.5, "name": "cam0", "raw": b"\xd8\x01" * 9},
        None, (FRAME[540:], {"depth": RNG.random((240, 320), dtype=np.float32)}),
    ],
    "big-endian floats and a structured dtype": {
        "be": RNG.random(20_000).astype(">f8"),
        "points": np.zeros(9_000, dtype=[("xyz", "<f4", (3,)), ("id", "<u4")]),
    },
    "datetimes": np.arange(10_000).astype("datetime64[ns]"),
    "not contiguous: transposed and strided": {"t": FRAME[:200].transpose(1, 0, 2),
                                               "s": FRAME[::2, ::3]},
    "exactly at the threshold": np.ones(AT, np.uint8),
    "one byte under it": np.ones(AT - 1, np.uint8),
    "small and empty arrays, scalars": {"a": np.arange(4), "e": np.zeros((0, 3)),
                                        "s": np.float32(2.5), "big": FRAME[:100]},
    "nothing to gather": {"k": 1, "x": [1.0, "two", b"3"]},
}


@pytest.mark.parametrize("name", MESSAGES)
def test_joined_pieces_are_encode_messages_bytes(name: str) -> None:
    message = MESSAGES[name]
    gathered = gather_message(message)
    assert bytes(gathered) == encode_message(message)
    assert len(gathered) == len(encode_message(message))
    decoded = decode_message(bytes(gathered))
    assert encode_message(decoded) == encode_message(message)


def test_a_contiguous_frame_is_a_piece_of_its_own_memory_and_the_anchor_finds_it() -> None:
    gathered = gather_message({"i": 1, "small": np.arange(3), "frame": FRAME,
                               "crop": FRAME[:100, :100]})
    assert isinstance(gathered, GatheredMessage)
    assert any(np.shares_memory(np.asarray(piece), FRAME) for piece in gathered.pieces
               if isinstance(piece, np.ndarray))
    joined = bytes(gathered)
    assert joined[gathered.anchor:gathered.anchor + FRAME.nbytes] == FRAME.tobytes()
    assert gathered.address == FRAME.ctypes.data  # the largest array's


def test_a_message_with_no_large_array_is_plain_bytes() -> None:
    assert gather_message({"k": np.arange(10)}) == encode_message({"k": np.arange(10)})
    assert isinstance(gather_message({"k": 1}), bytes)


def test_a_message_holding_the_placeholder_itself_is_encoded_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    state = offload._gatherer
    monkeypatch.setattr(state, "prefix", b"P" * 8)
    monkeypatch.setattr(state, "calls", itertools.count(5))
    marker = b"\xd8\x01" + b"P" * 8 + (5).to_bytes(4, "big") + (1).to_bytes(4, "big")
    message = {"before": marker, "frame": FRAME}

    gathered = gather_message(message)

    assert isinstance(gathered, bytes) and gathered == encode_message(message)


def test_what_the_wire_refuses_is_refused_the_same() -> None:
    with pytest.raises(TypeError, match="masked arrays"):
        gather_message(np.ma.masked_array(np.ones(AT), mask=np.zeros(AT)))
    with pytest.raises(TypeError, match="object dtype"):
        gather_message(np.empty(AT, dtype=object))
    with pytest.raises(TypeError, match="cannot encode objects"):
        gather_message({"frame": FRAME, "x": object()})


def test_threads_gather_at_once_without_mixing_their_arrays() -> None:
    frames = [RNG.integers(0, 256, (300, 400), dtype=np.uint8) for _ in range(4)]
    wrong: list[int] = []

    def work(k: int) -> None:
        for i in range(200):
            message = {"k": k, "i": i, "frame": frames[k]}
            if bytes(gather_message(message)) != encode_message(message):
                wrong.append(k)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert wrong == []
