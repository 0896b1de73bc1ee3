"""Frame codecs (videoflow.wire.codecs, issue 44): one registry, ext 3 on the wire,
lossless round trips bit-exact, jpeg within its quality's error, corrupt or unreadable
bytes a CodecError, the compiled decoder reading ext 3 itself, and a node's or flow's
codec option checked when it is given and when the flow is compiled."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

import msgspec
import numpy as np
import pytest

from videoflow.core.node import ConsumerNode, ProducerNode
from videoflow.errors import CodecError, MissingDependency, WireError
from videoflow.flow import Flow
from videoflow.wire import codecs, serialization
from videoflow.wire.codecs import EXT_CODED, Codec, parse_codecs
from videoflow.wire.numpy_ext import CodedArray, code_message
from videoflow.wire.offload import decode_message, encode_message


def smooth_image(height: int = 240, width: int = 320, channels: int = 3) -> np.ndarray:
    """A camera-like image (gradients and soft shapes): what jpeg is made for."""
    y, x = np.mgrid[0:height, 0:width]
    planes = [x * 255 // width, y * 255 // height,
              128 + 100 * np.sin(x / 23.0) * np.cos(y / 17.0)]
    return np.stack(planes[:channels], -1).astype(np.uint8)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0 ** 2 / mse)


def round_trip(message: Any, spec: Any) -> Any:
    """message coded by spec, in an envelope, decoded back (the compiled decoder where
    it is built)."""
    coded = code_message(message, parse_codecs(spec))
    data = serialization.encode_envelope(coded, trace_id="t", seq=1)
    return serialization.decode_envelope(data)["message"]


@pytest.fixture
def counts() -> Iterator[None]:
    codecs._counts.clear()
    yield
    codecs._counts.clear()


# ------------------------------------------------------------------ round trips


@pytest.mark.parametrize("array", [
    smooth_image(channels=1)[:, :, 0],  # 8-bit gray
    smooth_image(),  # RGB
    np.dstack([smooth_image(), np.full((240, 320), 7, np.uint8)]),  # RGBA
    (np.arange(240 * 320, dtype=np.uint32).reshape(240, 320) * 7 % 65536).astype("<u2"),
], ids=["gray8", "rgb8", "rgba8", "gray16"])
def test_png_round_trips_bit_exact(array: np.ndarray) -> None:
    back = round_trip({"image": array}, "png")["image"]
    assert back.dtype == array.dtype and back.shape == array.shape
    assert np.array_equal(back, array)


@pytest.mark.parametrize("array", [
    np.random.default_rng(1).normal(size=(100, 90)).astype(np.float32),  # a depth map
    np.random.default_rng(2).integers(0, 5000, (120, 160), dtype=np.uint16),
    np.random.default_rng(3).normal(size=(2000, 3)),  # a point cloud, float64
    smooth_image(),
], ids=["float32", "uint16", "float64-points", "rgb8"])
def test_zstd_round_trips_bit_exact(array: np.ndarray) -> None:
    back = round_trip([array, "kept"], "zstd")
    assert back[1] == "kept"
    assert back[0].dtype == array.dtype and back[0].shape == array.shape
    assert np.array_equal(back[0], array)


@pytest.mark.parametrize(("quality", "floor_db"), [(95, 45.0), (90, 42.0), (50, 35.0)])
def test_jpeg_comes_back_within_its_qualitys_error(quality: int, floor_db: float) -> None:
    image = smooth_image()
    back = round_trip({"frame": image}, {"name": "jpeg", "quality": quality})["frame"]
    assert back.dtype == np.uint8 and back.shape == image.shape
    assert psnr(back, image) >= floor_db


def test_jpeg_keeps_a_gray_image_gray_and_the_channel_order() -> None:
    gray = smooth_image(channels=1)
    assert round_trip(gray, "jpeg").shape == gray.shape  # (H, W, 1) stays
    rgb = smooth_image()
    bgr = rgb[:, :, ::-1].copy()  # the same image, channels swapped
    back = round_trip(bgr, "jpeg")
    assert psnr(back, bgr) >= 42.0 > psnr(back, rgb) + 10  # BGR in, BGR out


def test_the_coded_bytes_are_what_the_codec_made_and_smaller(counts: None) -> None:
    image = smooth_image()
    coded = code_message(image, parse_codecs("jpeg"))
    assert isinstance(coded, CodedArray)
    ext = msgspec.msgpack.decode(msgspec.msgpack.encode(
        msgspec.msgpack.Ext(EXT_CODED, coded.payload)))
    assert ext.code == EXT_CODED and len(ext.data) < image.nbytes / 5
    snapshot = codecs.counts_snapshot()["jpeg"]
    assert (snapshot["encoded"], snapshot["raw_bytes"]) == (1, image.nbytes)
    assert snapshot["coded_bytes"] < image.nbytes / 5 and snapshot["encode_seconds"] > 0


# ------------------------------------------------------------------ which arrays


def test_each_array_goes_to_the_first_codec_that_takes_it_or_raw() -> None:
    frame, depth = smooth_image(), np.ones((64, 64), np.float32)
    small = np.ones(16, np.uint8)
    message = {"frame": frame, "depth": depth, "small": small, "n": 3}
    coded = code_message(message, parse_codecs(["jpeg", "zstd"]))
    assert coded is not message and message["frame"] is frame  # not changed in place
    assert isinstance(coded["frame"], CodedArray) and isinstance(coded["depth"], CodedArray)
    assert coded["small"] is small and coded["n"] == 3  # under MIN_CODED_BYTES: raw
    jpeg_only = code_message(message, parse_codecs("jpeg"))
    assert jpeg_only["depth"] is depth  # float32: jpeg does not take it, so it goes raw
    assert code_message({"n": 1}, parse_codecs("zstd")) == {"n": 1}


def test_a_codec_is_counted_once_per_array_on_the_compiled_path(counts: None) -> None:
    # The compiled decoder hands ext 3 to the hook itself: it does not give up on the
    # envelope and leave it to the reference decoder (which would decode it again).
    data = serialization.encode_envelope(code_message(smooth_image(), parse_codecs("png")),
                                         trace_id="t", seq=1)
    if serialization.DECODER_KIND == "compiled":
        direct = serialization._compiled.EnvelopeDecoder(  # type: ignore[union-attr]
            serialization._EnvelopeV3.__struct_fields__,
            tuple(serialization._V3_DEFAULTS.values()), serialization.ext_hook,
            codecs.EXT_CODES)
        assert direct.decode(data) is not None
        codecs._counts.clear()
    serialization.decode_envelope(data)
    assert codecs.counts_snapshot()["png"]["decoded"] == 1


def test_a_payload_by_ref_decodes_its_coded_arrays_too() -> None:
    image = smooth_image()
    message = code_message({"frame": image}, parse_codecs("zstd"))
    assert np.array_equal(decode_message(encode_message(message))["frame"], image)


# ------------------------------------------------------------------ bad bytes


@pytest.mark.parametrize("spec", ["jpeg", "png", "zstd"])
def test_corrupt_coded_bytes_are_a_codec_error(spec: str) -> None:
    coded = code_message(smooth_image(), parse_codecs(spec))
    assert isinstance(coded, CodedArray)
    head = 4 + int.from_bytes(coded.payload[:4], "little")
    body = bytearray(coded.payload[head:])
    body[len(body) // 3: len(body) // 3 + 64] = bytes(64)  # a run of zeros mid-stream
    cut = coded.payload[:head] + bytes(body[: len(body) // 2])  # and truncated
    for payload in (cut, coded.payload[:head] + b"not the codec's bytes"):
        data = serialization.encode_envelope(CodedArray(payload), trace_id="t", seq=1)
        with pytest.raises(CodecError, match=spec):
            serialization.decode_envelope(data)


def test_a_codec_unknown_to_the_reader_is_a_codec_error() -> None:
    coded = code_message(smooth_image(), parse_codecs("zstd"))
    assert isinstance(coded, CodedArray)
    payload = coded.payload.replace(b"zstd", b"zzzz", 1)
    data = serialization.encode_envelope(CodedArray(payload), trace_id="t", seq=1)
    with pytest.raises(CodecError, match="zzzz"):
        serialization.decode_envelope(data)


def test_a_header_that_lies_about_the_shape_is_a_codec_error() -> None:
    coded = code_message(np.zeros((64, 64), np.uint16), parse_codecs("zstd"))
    assert isinstance(coded, CodedArray)
    head = 4 + int.from_bytes(coded.payload[:4], "little")
    header = msgspec.msgpack.encode(("zstd", "<u2", (64, 65)))
    payload = len(header).to_bytes(4, "little") + header + coded.payload[head:]
    data = serialization.encode_envelope(CodedArray(payload), trace_id="t", seq=1)
    with pytest.raises(CodecError):
        serialization.decode_envelope(data)
    assert issubclass(CodecError, WireError)


# ------------------------------------------------------------------ the registry


class _Absent(Codec):
    name: ClassVar[str] = "absent-test-codec"
    extra: ClassVar[str] = "absent"
    package: ClassVar[str] = "absent-test-package"
    module: ClassVar[str] = "videoflow_no_such_module"


def test_a_codec_whose_library_is_missing_is_refused_naming_what_to_install() -> None:
    codecs.register(_Absent())
    try:
        with pytest.raises(MissingDependency, match="pip install absent-test-package"):
            parse_codecs("absent-test-codec")
    finally:
        codecs._registry.pop("absent-test-codec")


@pytest.mark.parametrize(("spec", "message"), [
    ("h264", "unknown codec 'h264'"),
    ({"name": "jpeg", "quality": 0}, "quality"),
    ({"name": "jpeg", "speed": 3}, "takes no option"),
    ({"name": "zstd", "level": 40}, "level"),
    ({"quality": 3}, "a codec is a name"),
    (["jpeg", "raw"], "stands alone"),
])
def test_a_bad_codec_option_is_refused(spec: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_codecs(spec)


def test_registry_names_the_builtin_codecs_and_raw_asks_for_none() -> None:
    assert {"jpeg", "png", "zstd"} <= set(codecs.names())
    assert parse_codecs(None) == parse_codecs("raw") == parse_codecs([]) == ()
    (choice,) = parse_codecs({"name": "jpeg", "quality": 70})
    assert choice.options == {"quality": 70, "fastdct": True}
    with pytest.raises(ValueError, match="already registered"):
        codecs.register(type("Other", (Codec,), {"name": "jpeg"})())


# ------------------------------------------------------------------ nodes and flows


class _Cam(ProducerNode):
    def next(self) -> Any:
        raise StopIteration


class _Sink(ConsumerNode):
    def consume(self, value: Any) -> None:
        pass


def test_a_flows_codec_is_every_nodes_that_names_none() -> None:
    default = _Cam(name="default")
    own = _Cam(name="own", codec={"name": "jpeg", "quality": 80})
    opted_out = _Cam(name="opted-out", codec="raw")
    sinks = [_Sink(name=f"s{i}")(cam) for i, cam in enumerate((default, own, opted_out))]
    flow = Flow([default, own, opted_out], sinks, name="codecs", codec="zstd")
    flow.compile()
    assert [c.name for c in default.codecs] == ["zstd"]
    assert [(c.name, c.options["quality"]) for c in own.codecs] == [("jpeg", 80)]
    assert opted_out.codecs == ()


def test_a_node_or_flow_asking_for_an_unknown_codec_fails_at_once() -> None:
    with pytest.raises(ValueError, match="node 'cam': codec: unknown codec 'webp'"):
        _Cam(name="cam", codec="webp")
    with pytest.raises(ValueError, match="flow: codec"):
        Flow([], [], codec={"name": "jpeg", "quality": 101})


def test_compiling_a_flow_checks_each_nodes_codec_library() -> None:
    codecs.register(_Absent())
    try:
        cam = _Cam(name="cam")
        flow = Flow([cam], [_Sink(name="sink")(cam)], name="absent")
        flow.codec = (codecs.CodecChoice("absent-test-codec"),)  # as if given
        with pytest.raises(MissingDependency, match="absent-test-package"):
            flow.compile()
    finally:
        codecs._registry.pop("absent-test-codec")
