"""JPEG through libjpeg-turbo (simplejpeg; extra ``jpeg``), for 8-bit images: gray
(H, W) or (H, W, 1), and three-channel (H, W, 3) read as RGB both ways, so a BGR
frame comes back BGR. Lossy: the decoded frame is close to the sent one, within the
quality's error, not equal to it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from videoflow.wire.codecs import Codec, register


class JpegCodec(Codec):
    """Options: quality (1-100, default 90), fastdct (default True: libjpeg-turbo's
    faster, slightly coarser transform)."""

    name: ClassVar[str] = "jpeg"
    extra: ClassVar[str] = "jpeg"
    package: ClassVar[str] = "simplejpeg"
    module: ClassVar[str] = "simplejpeg"
    lossless: ClassVar[bool] = False
    options: ClassVar[Mapping[str, Any]] = {"quality": 90, "fastdct": True}

    def check(self, options: Mapping[str, Any]) -> None:
        super().check(options)
        self.check_int(options, "quality", 1, 100)
        if not isinstance(options.get("fastdct", True), bool):
            raise ValueError("codec 'jpeg': fastdct must be a bool")

    def takes(self, array: np.ndarray[Any, Any]) -> bool:
        shape = array.shape
        return (array.dtype == np.uint8 and (len(shape) == 2 or (
            len(shape) == 3 and shape[2] in (1, 3))) and shape[0] > 0 and shape[1] > 0)

    def encode(self, array: np.ndarray[Any, Any], options: Mapping[str, Any]) -> bytes:
        import simplejpeg

        image = array if array.ndim == 3 else array[:, :, None]
        gray = image.shape[2] == 1
        encoded: bytes = simplejpeg.encode_jpeg(
            np.ascontiguousarray(image), quality=options["quality"],
            colorspace="GRAY" if gray else "RGB",
            colorsubsampling="Gray" if gray else "420", fastdct=options["fastdct"])
        return encoded

    def decode(self, data: memoryview, dtype: np.dtype[Any],
               shape: tuple[int, ...]) -> np.ndarray[Any, Any]:
        import simplejpeg

        gray = len(shape) == 2 or shape[2] == 1
        height, width, _, _ = simplejpeg.decode_jpeg_header(data)
        if (height, width) != tuple(shape[:2]):
            # Read before the pixels are: a bad header cannot make it allocate more.
            raise ValueError(f"a {height}x{width} image, the array is {shape}")
        image = simplejpeg.decode_jpeg(data, colorspace="GRAY" if gray else "RGB")
        return image.reshape(shape) if image.size == int(np.prod(shape)) else image


register(JpegCodec())
