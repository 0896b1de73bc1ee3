"""Zstandard (extra ``zstd``): lossless bytes for any array, depth maps and point
clouds included; fast at its low levels."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from videoflow.wire.codecs import Codec, register


class ZstdCodec(Codec):
    """Options: level (1-22, default 1: the fastest, most of the saving)."""

    name: ClassVar[str] = "zstd"
    extra: ClassVar[str] = "zstd"
    package: ClassVar[str] = "zstandard"
    module: ClassVar[str] = "zstandard"
    options: ClassVar[Mapping[str, Any]] = {"level": 1}

    def check(self, options: Mapping[str, Any]) -> None:
        super().check(options)
        self.check_int(options, "level", 1, 22)

    def takes(self, array: np.ndarray[Any, Any]) -> bool:
        return not array.dtype.hasobject

    def encode(self, array: np.ndarray[Any, Any], options: Mapping[str, Any]) -> bytes:
        import zstandard

        raw = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        return zstandard.ZstdCompressor(level=options["level"]).compress(raw.data)

    def decode(self, data: memoryview, dtype: np.dtype[Any],
               shape: tuple[int, ...]) -> np.ndarray[Any, Any]:
        import zstandard

        size = int(np.prod(shape)) * dtype.itemsize
        claimed = zstandard.frame_content_size(data)
        if claimed not in (size, zstandard.CONTENTSIZE_UNKNOWN):
            raise ValueError(f"a frame of {claimed} bytes, the array needs {size}")
        raw = zstandard.ZstdDecompressor().decompress(data, max_output_size=size)
        if len(raw) != size:
            raise ValueError(f"decompressed to {len(raw)} bytes, the array needs {size}")
        return np.frombuffer(raw, dtype).reshape(shape)


register(ZstdCodec())
