"""PNG through Pillow (extra ``png``): lossless, for 8- and 16-bit gray images (H, W)
and 8-bit RGB (H, W, 3) or RGBA (H, W, 4). Slow to encode where the image is noisy
(Pillow's zlib): for depth maps and other arrays that must come back exact, zstd is
the fast choice."""

from __future__ import annotations

import io
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from videoflow.wire.codecs import Codec, register

_MODES = {(np.dtype(np.uint8), 2): "L", (np.dtype(np.uint8), 3): "RGB",
          (np.dtype(np.uint8), 4): "RGBA", (np.dtype("<u2"), 2): "I;16"}


class PngCodec(Codec):
    """Options: level (zlib compression, 0-9, default 1: fast, most of the saving)."""

    name: ClassVar[str] = "png"
    extra: ClassVar[str] = "png"
    package: ClassVar[str] = "pillow"
    module: ClassVar[str] = "PIL"
    options: ClassVar[Mapping[str, Any]] = {"level": 1}

    def check(self, options: Mapping[str, Any]) -> None:
        super().check(options)
        self.check_int(options, "level", 0, 9)

    @staticmethod
    def _mode(array: np.ndarray[Any, Any]) -> str | None:
        channels = 2 if array.ndim == 2 else (array.shape[2] if array.ndim == 3 else 0)
        if array.ndim == 3 and channels == 1:
            return None
        return _MODES.get((array.dtype, channels if array.ndim == 3 else 2))

    def takes(self, array: np.ndarray[Any, Any]) -> bool:
        return (array.ndim in (2, 3) and array.shape[0] > 0 and array.shape[1] > 0
                and self._mode(array) is not None)

    def encode(self, array: np.ndarray[Any, Any], options: Mapping[str, Any]) -> bytes:
        from PIL import Image

        out = io.BytesIO()
        # Pillow picks the mode _MODES names from the dtype and shape (and deprecates
        # being told it).
        Image.fromarray(np.ascontiguousarray(array)).save(
            out, format="PNG", compress_level=options["level"])
        return out.getvalue()

    def decode(self, data: memoryview, dtype: np.dtype[Any],
               shape: tuple[int, ...]) -> np.ndarray[Any, Any]:
        from PIL import Image

        with Image.open(io.BytesIO(data)) as image:
            if image.format != "PNG":
                raise ValueError(f"not a PNG image ({image.format})")
            return np.asarray(image).astype(dtype, copy=False)


register(PngCodec())
