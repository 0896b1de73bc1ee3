"""The wire's extension codes and its registry of array codecs.

A message's arrays travel raw (ext 1, a numpy scalar ext 2: numpy_ext) or, where the
publishing node names a codec that takes them, encoded (ext 3). Ext 3's payload::

    u32 little-endian H | H bytes: msgpack [codec, descr, shape] | encoded bytes

``descr`` and ``shape`` are ext 1's; ``codec`` names the registered codec that made
the bytes and reads them back into an array of exactly that dtype and shape. Readers
need nothing but the codec's library: numpy_ext decodes ext 3 wherever it decodes
ext 1, the compiled envelope decoder included.

A codec is one module holding a Codec subclass, and one line in BUILTIN (its name and
module). Its library is imported only when an array is first coded or decoded with
it; a flow that names a codec whose library is missing is refused when it is
compiled (require), naming the extra to install.

A node names its codecs (node and flow option ``codec``) as a name, a dict
``{"name": ..., option: value}``, or a list of those: each array of MIN_CODED_BYTES or
more is encoded by the first that takes it (jpeg takes 8-bit images only), and goes
raw when none does.
"""

from __future__ import annotations

import importlib
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final

import numpy as np

from videoflow.errors import MissingDependency

EXT_NDARRAY: Final = 1
"""A numpy ndarray, raw (numpy_ext)."""
EXT_NPSCALAR: Final = 2
"""A numpy scalar: a 0-d array that decodes to the scalar (numpy_ext)."""
EXT_CODED: Final = 3
"""An ndarray encoded by a registered codec (this module's docstring)."""
EXT_CODES: Final = frozenset({EXT_NDARRAY, EXT_NPSCALAR, EXT_CODED})
"""Every extension code numpy_ext.ext_hook decodes: the compiled envelope decoder
hands these to it and leaves any other code to the reference decoder."""

MIN_CODED_BYTES: Final = 4096
"""Arrays smaller than this go raw whatever the codecs: a codec's own header and call
cost more than it could save."""

RAW: Final = "raw"
"""The codec name that asks for none (a node that opts out of its flow's default)."""


class Codec:
    """One way to encode arrays. Subclasses set name, extra and options, and define
    takes, encode and decode; they import their library inside those, never at module
    import.

    Attributes:
        name: the name nodes ask for it by, and the one written on the wire.
        extra: videoflow's extra that installs its library.
        package: the library's distribution, what ``pip install`` names.
        module: the library's top-level module, checked by require.
        lossless: whether decode gives back the very bytes encode was given.
        options: the options it takes, with their defaults.
    """

    name: ClassVar[str] = ""
    extra: ClassVar[str] = ""
    package: ClassVar[str] = ""
    module: ClassVar[str] = ""
    lossless: ClassVar[bool] = True
    options: ClassVar[Mapping[str, Any]] = {}

    def check(self, options: Mapping[str, Any]) -> None:
        """Refuse options this codec cannot use (ValueError); the base checks only
        their names."""
        unknown = set(options) - set(self.options)
        if unknown:
            raise ValueError(f"codec {self.name!r} takes no option {sorted(unknown)} "
                             f"(it takes {sorted(self.options) or 'none'})")

    def check_int(self, options: Mapping[str, Any], name: str, low: int, high: int) -> None:
        """Refuse option name unless it is an int in low..high (or not given)."""
        value = options.get(name, low)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ValueError(f"codec {self.name!r}: {name} must be an int in {low}..{high}, "
                             f"not {value!r}")

    def takes(self, array: np.ndarray[Any, Any]) -> bool:
        """Whether this codec can encode array (dtype, shape, layout)."""
        raise NotImplementedError

    def encode(self, array: np.ndarray[Any, Any], options: Mapping[str, Any]) -> bytes:
        """array (one takes accepted) as this codec's bytes."""
        raise NotImplementedError

    def decode(self, data: memoryview, dtype: np.dtype[Any],
               shape: tuple[int, ...]) -> np.ndarray[Any, Any]:
        """The array data encodes; numpy_ext checks its dtype and shape. Raises what
        the library raises for bytes it cannot read."""
        raise NotImplementedError


BUILTIN: Final[Mapping[str, str]] = {
    "jpeg": "videoflow.wire.codec_jpeg",
    "png": "videoflow.wire.codec_png",
    "zstd": "videoflow.wire.codec_zstd",
}
"""The codecs videoflow ships: name -> the module defining it (imported on first use)."""

_registry: dict[str, Codec] = {}
_lock = threading.Lock()


def register(codec: Codec) -> Codec:
    """Add a codec under its name (a codec module's last line).

    Raises:
        ValueError: the name is empty, 'raw', or taken by another codec.
    """
    name = codec.name
    if not name or name == RAW:
        raise ValueError(f"a codec's name must be a non-empty str other than {RAW!r}")
    with _lock:
        known = _registry.get(name)
        if known is not None and type(known) is not type(codec):
            raise ValueError(f"codec {name!r} is already registered ({type(known).__name__})")
        _registry[name] = codec
    return codec


def get(name: str) -> Codec:
    """The codec registered as name, importing a built-in one's module first.

    Raises:
        KeyError: no codec has that name.
    """
    codec = _registry.get(name)
    if codec is None and name in BUILTIN:
        importlib.import_module(BUILTIN[name])
        codec = _registry.get(name)
    if codec is None:
        raise KeyError(name)
    return codec


def names() -> list[str]:
    """Every codec name that get knows."""
    return sorted(set(BUILTIN) | set(_registry))


def require(name: str) -> Codec:
    """The codec name, with its library importable: what a flow checks when it is
    compiled.

    Raises:
        ValueError: no codec has that name.
        MissingDependency: its library is not installed; the message names the extra.
    """
    try:
        codec = get(name)
    except KeyError:
        raise ValueError(f"unknown codec {name!r} (known: {', '.join(names())})") from None
    if codec.module:
        try:
            importlib.import_module(codec.module)
        except ImportError as error:
            raise MissingDependency(
                f"codec {name!r} needs {codec.package}, not installed here: pip install "
                f"{codec.package} (videoflow's extra {codec.extra!r}) ({error})") from error
    return codec


@dataclass(frozen=True)
class CodecChoice:
    """One codec a node asked for, with its options (the codec's defaults filled in)."""

    name: str
    options: Mapping[str, Any] = field(default_factory=dict)

    @property
    def codec(self) -> Codec:
        return get(self.name)


def parse_codecs(spec: Any, where: str = "codec") -> tuple[CodecChoice, ...]:
    """A node's or flow's ``codec`` option as the choices it makes, in order: None or
    'raw' (or an empty list) for none.

    Arguments:
        spec: a codec name, a dict with 'name' and the codec's options, or a list of
            those.
        where: what to name in an error.

    Raises:
        ValueError: an unknown codec, a bad option or a malformed spec.
        MissingDependency: a codec's library is not installed (require).
    """
    if spec is None or spec == RAW:
        return ()
    items = list(spec) if isinstance(spec, (list, tuple)) else [spec]
    choices: list[CodecChoice] = []
    for item in items:
        if isinstance(item, str):
            name, options = item, {}
        elif isinstance(item, Mapping) and isinstance(item.get("name"), str):
            name, options = item["name"], {k: v for k, v in item.items() if k != "name"}
        else:
            raise ValueError(f"{where}: a codec is a name or a dict with a 'name', "
                             f"not {item!r}")
        if name == RAW:
            raise ValueError(f"{where}: {RAW!r} stands alone, not in a list")
        try:
            codec = require(name)
            codec.check(options)
        except ValueError as error:
            raise ValueError(f"{where}: {error}") from None
        except MissingDependency as error:
            raise MissingDependency(f"{where}: {error}") from error.__cause__
        choices.append(CodecChoice(name, {**codec.options, **options}))
    return tuple(choices)


@dataclass
class CodecCounts:
    """What one codec did in this process: arrays encoded, their bytes before and
    after, seconds spent; arrays decoded, seconds spent."""

    encoded: int = 0
    raw_bytes: int = 0
    coded_bytes: int = 0
    encode_seconds: float = 0.0
    decoded: int = 0
    decode_seconds: float = 0.0


_counts: dict[str, CodecCounts] = {}


def count_encoded(name: str, raw_bytes: int, coded_bytes: int, started: float) -> None:
    """Count one array encoded by codec name since started (time.perf_counter)."""
    seconds = time.perf_counter() - started
    with _lock:
        counts = _counts.setdefault(name, CodecCounts())
        counts.encoded += 1
        counts.raw_bytes += raw_bytes
        counts.coded_bytes += coded_bytes
        counts.encode_seconds += seconds


def count_decoded(name: str, started: float) -> None:
    """Count one array decoded by codec name since started (time.perf_counter)."""
    seconds = time.perf_counter() - started
    with _lock:
        counts = _counts.setdefault(name, CodecCounts())
        counts.decoded += 1
        counts.decode_seconds += seconds


def counts_snapshot() -> dict[str, dict[str, float]]:
    """Every codec's counts in this process so far, as plain dicts (a replica's
    report and /metrics)."""
    with _lock:
        return {name: dict(vars(counts)) for name, counts in _counts.items()}


__all__ = ["BUILTIN", "EXT_CODED", "EXT_CODES", "EXT_NDARRAY", "EXT_NPSCALAR",
           "MIN_CODED_BYTES", "RAW", "Codec", "CodecChoice", "CodecCounts",
           "count_decoded", "count_encoded", "counts_snapshot", "get", "names",
           "parse_codecs", "register", "require"]
