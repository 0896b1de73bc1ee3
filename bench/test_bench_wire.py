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
