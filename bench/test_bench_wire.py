"""Throughput of the envelope codec (videoflow.wire.serialization).

Three shapes per direction: ``small_200B`` -- a ~200-byte v3 envelope with every
header field set and a small detection dict as the message, the per-message cost
of a busy edge; ``small_200B_bytes`` -- the same header with a 40-byte binary
message, so the header's own cost shows apart from parsing a nested payload --
and ``frame_1080p`` -- one 1920x1080x3 uint8 frame, where decode must be
zero-copy (its time is independent of the pixel count) and encode pays the copies
into the output buffer. Read the small/frame ratio, and the figures in
extra_info (envelopes/s from the median round), never an absolute time across runs.

Every case checks what it decoded or encoded, so a broken codec fails the run even
with --benchmark-disable.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

from videoflow.wire.serialization import decode_envelope, encode_envelope

SHAPES = ["small_200B", "small_200B_bytes", "frame_1080p"]

HEADER_FIELDS: dict[str, Any] = {
    "metadata": {"camera": "cam-01"},
    "type": "processor",
    "producer_name": "detector",
    "flow_id": "flow-7",
    "run_id": "run-20260101-01",
    "span_id": "a1b2c3d4e5f60718",
    "parent_span_id": "0102030405060708",
    "replica_id": 1,
    "event_ts": 1767225600.123,
}


def make_message(shape: str) -> Any:
    if shape == "small_200B":
        return {"frame": 1234, "label": "person", "score": 0.93, "bbox": [10, 20, 110, 220]}
    if shape == "small_200B_bytes":
        return bytes(range(40))  # an opaque binary payload (a packed record, a short blob)
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, (1080, 1920, 3), dtype=np.uint8)


def encode(shape: str) -> bytes:
    return encode_envelope(
        make_message(shape), trace_id="3f2b9c1e8d7a4f60b5e2c9d8a1f3e7b2", seq=1234, **HEADER_FIELDS
    )


def record(benchmark: Any, data: bytes) -> None:
    benchmark.extra_info["envelope_bytes"] = len(data)
    if benchmark.stats is None:  # --benchmark-disable: nothing was timed
        return
    median = benchmark.stats.stats.median
    benchmark.extra_info["envelopes_per_s"] = 1.0 / median
    benchmark.extra_info["ns_per_envelope"] = median * 1e9


@pytest.mark.benchmark(group="decode_envelope")
@pytest.mark.parametrize("shape", SHAPES)
def test_bench_decode_envelope(benchmark: Any, shape: str) -> None:
    data = encode(shape)
    if shape.startswith("small_200B"):
        assert 180 <= len(data) <= 220, len(data)

    decoded = benchmark(decode_envelope, data)

    assert decoded["seq"] == 1234
    assert decoded["event_ts"] == HEADER_FIELDS["event_ts"]
    if shape == "frame_1080p":
        frame = decoded["message"]
        assert frame.shape == (1080, 1920, 3)
        # Zero-copy: the pixels are the input buffer's bytes, not a copy of them.
        assert np.shares_memory(frame, np.frombuffer(data, np.uint8))
        assert np.array_equal(frame, make_message(shape))
    else:
        assert decoded["message"] == make_message(shape)
    record(benchmark, data)


def varied_stream(count: int = 1024) -> list[bytes]:
    """A stream's worth of small envelopes as a busy edge sees them: the header a
    stream repeats (type, producer, flow, run) with a fresh trace id, seq, span ids,
    event time and detection per message, so no per-message value is decoded twice in
    a row."""
    rng = np.random.default_rng(1)
    out = []
    for seq in range(count):
        fields = dict(HEADER_FIELDS, span_id=f"{rng.integers(2**63):016x}",
                      parent_span_id=f"{rng.integers(2**63):016x}",
                      event_ts=1767225600.0 + seq / 30)
        message = {"frame": seq, "label": ["person", "car", "bike"][seq % 3],
                   "score": float(rng.random()), "bbox": rng.integers(0, 1920, 4).tolist()}
        out.append(encode_envelope(message, trace_id=f"{rng.integers(2**63):032x}", seq=seq,
                                   **fields))
    return out


@pytest.mark.benchmark(group="decode_envelope")
def test_bench_decode_envelope_varied_stream(benchmark: Any) -> None:
    # One envelope per call, a different one each time, round the stream: the cost of
    # the small case without the help of decoding the very same bytes again. The
    # iteration is part of the timed call (about 50 ns), so this reads slightly low.
    stream = varied_stream()
    assert all(180 <= len(data) <= 230 for data in stream), [len(d) for d in stream[:5]]
    following = itertools.cycle(stream).__next__

    def decode_next() -> dict[str, Any]:
        return decode_envelope(following())

    benchmark(decode_next)

    for seq in (0, 1, 511, 1023):
        decoded = decode_envelope(stream[seq])
        assert decoded["seq"] == seq and decoded["message"]["frame"] == seq
        assert decoded["event_ts"] == 1767225600.0 + seq / 30
    record(benchmark, stream[0])


@pytest.mark.benchmark(group="encode_envelope")
@pytest.mark.parametrize("shape", SHAPES)
def test_bench_encode_envelope(benchmark: Any, shape: str) -> None:
    message = make_message(shape)

    data = benchmark(
        encode_envelope,
        message,
        trace_id="3f2b9c1e8d7a4f60b5e2c9d8a1f3e7b2",
        seq=1234,
        **HEADER_FIELDS,
    )

    assert data == encode(shape)
    record(benchmark, data)
