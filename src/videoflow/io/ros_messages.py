"""ROS messages as the values a flow carries: what RosbagSource outputs for each message
type, decoded from the rosbags package's deserialized objects (ROS 1 and ROS 2 alike).

- sensor_msgs/Image: a numpy array (height, width) or (height, width, channels) of
  the encoding's dtype, a view of the message's bytes (no copy; rows padded past
  width*pixel are sliced off, still a view). Encodings: mono8/16, rgb8/bgr8,
  rgba8/bgra8, rgb16/bgr16, rgba16/bgra16, bayer_*8/16, yuv422/uyvy/yuyv (2 channels
  of uint8), and the <bits><U|S|F>C<channels> family (8UC3, 32FC1, ...); is_bigendian
  is honoured. Another encoding is undecodable.
- sensor_msgs/CompressedImage: a numpy array decoded by Pillow (a copy: the pixels do
  not exist until decoded).
- sensor_msgs/Imu: a dict of numpy float64 arrays: orientation (x, y, z, w),
  angular_velocity and linear_acceleration (x, y, z), and the three 3x3 covariances.
- sensor_msgs/PointCloud2: a numpy structured array of width*height points, one
  field per PointField (its name, datatype and count), a view of the message's bytes.
- anything else: a plain dict of its fields, nested messages as dicts, arrays of
  numbers as numpy arrays.

An ``std_msgs/Header`` field is kept out of the value; its stamp is the message's event
time (stamp_of).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Final

import numpy as np

from videoflow.errors import MissingDependency

IMAGE: Final = "sensor_msgs/msg/Image"
COMPRESSED_IMAGE: Final = "sensor_msgs/msg/CompressedImage"
IMU: Final = "sensor_msgs/msg/Imu"
POINT_CLOUD2: Final = "sensor_msgs/msg/PointCloud2"

_ENCODINGS: Final = {
    "mono8": ("u1", 1), "mono16": ("u2", 1), "rgb8": ("u1", 3), "bgr8": ("u1", 3),
    "rgba8": ("u1", 4), "bgra8": ("u1", 4), "rgb16": ("u2", 3), "bgr16": ("u2", 3),
    "rgba16": ("u2", 4), "bgra16": ("u2", 4), "yuv422": ("u1", 2), "uyvy": ("u1", 2),
    "yuyv": ("u1", 2), "yuv422_yuy2": ("u1", 2),
}
_CV_TYPE = re.compile(r"(8|16|32|64)([USF])C([1-9][0-9]*)")
_BAYER = re.compile(r"bayer_(rggb|bggr|gbrg|grbg)(8|16)")
_POINT_TYPES: Final = {1: "i1", 2: "u1", 3: "i2", 4: "u2", 5: "i4", 6: "u4", 7: "f4", 8: "f8"}
"""sensor_msgs/PointField datatypes."""


class Undecodable(ValueError):
    """A message this module cannot turn into a value (an unknown image encoding, a
    buffer shorter than its shape): the source counts it and goes on."""


def normalized_type(msgtype: str) -> str:
    """A type name as ROS 2 spells it: 'sensor_msgs/Image' (ROS 1) is
    'sensor_msgs/msg/Image'."""
    package, _, name = msgtype.rpartition("/")
    return msgtype if "/msg/" in msgtype or not package else f"{package}/msg/{name}"


def stamp_of(message: Any) -> float | None:
    """The message's header stamp in epoch seconds; None without a header, or with an
    unset (zero) stamp."""
    header = getattr(message, "header", None)
    stamp = getattr(header, "stamp", None)
    if stamp is None:
        return None
    sec = getattr(stamp, "sec", getattr(stamp, "secs", 0))
    nanosec = getattr(stamp, "nanosec", getattr(stamp, "nsecs", 0))
    if not sec and not nanosec:
        return None
    return sec + nanosec * 1e-9


def decode(msgtype: str, message: Any) -> Any:
    """The value a flow carries for a deserialized message (the module docstring).

    Raises:
        Undecodable: the message cannot be read as its type says.
    """
    kind = normalized_type(msgtype)
    if kind == IMAGE:
        return image(message)
    if kind == COMPRESSED_IMAGE:
        return compressed_image(message)
    if kind == IMU:
        return imu(message)
    if kind == POINT_CLOUD2:
        return point_cloud(message)
    return plain(message)


def _pixel(encoding: str) -> tuple[str, int]:
    if encoding in _ENCODINGS:
        return _ENCODINGS[encoding]
    bayer = _BAYER.fullmatch(encoding)
    if bayer:
        return ("u1" if bayer.group(2) == "8" else "u2"), 1
    cv = _CV_TYPE.fullmatch(encoding.upper())
    if cv:
        bits, kind, channels = cv.groups()
        code = {"U": "u", "S": "i", "F": "f"}[kind]
        if code == "f" and bits not in ("32", "64"):
            raise Undecodable(f"image encoding {encoding!r}: no float of {bits} bits")
        return f"{code}{int(bits) // 8}", int(channels)
    raise Undecodable(f"unknown image encoding {encoding!r}")


def image(message: Any) -> np.ndarray:
    """A sensor_msgs/Image as a numpy view of its bytes."""
    code, channels = _pixel(str(message.encoding))
    dtype = np.dtype(code).newbyteorder(">" if message.is_bigendian else "<")
    height, width, step = int(message.height), int(message.width), int(message.step)
    row = width * channels * dtype.itemsize
    data = np.asarray(message.data, np.uint8)
    if step < row or data.size < step * height:
        raise Undecodable(f"image of {height}x{width} {message.encoding!r}: {data.size} "
                          f"bytes with a step of {step}, short of {row} per row")
    rows = data[:step * height].reshape(height, step)[:, :row]
    try:
        pixels = rows.view(dtype)  # a view, padded rows or not (the last axis is whole)
    except ValueError:  # an old numpy that views C-contiguous arrays only
        pixels = np.ascontiguousarray(rows).view(dtype)
    shape = (height, width) if channels == 1 else (height, width, channels)
    return pixels.reshape(shape)


def compressed_image(message: Any) -> np.ndarray:
    """A sensor_msgs/CompressedImage decoded by Pillow.

    Raises:
        MissingDependency: Pillow is not installed.
    """
    try:
        from PIL import Image, UnidentifiedImageError
    except ImportError as error:
        raise MissingDependency("decoding sensor_msgs/CompressedImage needs Pillow: "
                                "pip install pillow") from error
    import io

    try:
        with Image.open(io.BytesIO(bytes(message.data))) as opened:
            return np.asarray(opened)
    except (UnidentifiedImageError, OSError) as error:
        raise Undecodable(f"compressed image ({message.format!r}): {error}") from error


def imu(message: Any) -> dict[str, np.ndarray]:
    """A sensor_msgs/Imu as float64 arrays."""
    def vector(v: Any, names: str = "xyz") -> np.ndarray:
        return np.array([getattr(v, n) for n in names], np.float64)

    return {
        "orientation": vector(message.orientation, "xyzw"),
        "angular_velocity": vector(message.angular_velocity),
        "linear_acceleration": vector(message.linear_acceleration),
        "orientation_covariance": np.asarray(message.orientation_covariance,
                                             np.float64).reshape(3, 3),
        "angular_velocity_covariance": np.asarray(message.angular_velocity_covariance,
                                                  np.float64).reshape(3, 3),
        "linear_acceleration_covariance": np.asarray(message.linear_acceleration_covariance,
                                                     np.float64).reshape(3, 3),
    }


def point_cloud(message: Any) -> np.ndarray:
    """A sensor_msgs/PointCloud2 as a structured array viewing its bytes."""
    order = ">" if message.is_bigendian else "<"
    names, formats, offsets = [], [], []
    for field in message.fields:
        code = _POINT_TYPES.get(int(field.datatype))
        if code is None:
            raise Undecodable(f"point field {field.name!r}: unknown datatype {field.datatype}")
        count = int(field.count) or 1
        names.append(str(field.name))
        formats.append(np.dtype(order + code) if count == 1
                       else np.dtype((np.dtype(order + code), (count,))))
        offsets.append(int(field.offset))
    try:
        dtype = np.dtype({"names": names, "formats": formats, "offsets": offsets,
                          "itemsize": int(message.point_step)})
    except ValueError as error:
        raise Undecodable(f"point cloud fields: {error}") from error
    points = int(message.width) * int(message.height)
    data = np.asarray(message.data, np.uint8)
    if data.size < points * dtype.itemsize:
        raise Undecodable(f"point cloud of {points} points of {dtype.itemsize} bytes: "
                          f"only {data.size} bytes")
    return data[:points * dtype.itemsize].view(dtype)


def plain(message: Any) -> Any:
    """A message's fields as a dict (header left out), recursively."""
    if not dataclasses.is_dataclass(message):
        if isinstance(message, (list, tuple)):
            return [plain(item) for item in message]
        return message
    # rosbags' generated classes list their __msgtype__ among the fields: not data.
    return {f.name: plain(getattr(message, f.name)) for f in dataclasses.fields(message)
            if not f.name.startswith("__")
            and not (f.name == "header" and hasattr(getattr(message, f.name), "stamp"))}


__all__ = ["COMPRESSED_IMAGE", "IMAGE", "IMU", "POINT_CLOUD2", "Undecodable", "decode",
           "normalized_type", "stamp_of"]
