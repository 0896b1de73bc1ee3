"""videoflow.io.ros_messages: ROS messages (as rosbags deserializes them) to the values
a flow carries: images as numpy views of the message's bytes, compressed images
decoded, IMU and point clouds as structured values, the rest as dicts."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pytest
from rosbags.typesys import Stores, get_typestore

from videoflow.io.ros_messages import Undecodable, decode, normalized_type

STORE = get_typestore(Stores.ROS2_HUMBLE)
T = STORE.types


def header() -> Any:
    return T["std_msgs/msg/Header"](stamp=T["builtin_interfaces/msg/Time"](sec=1, nanosec=0),
                                     frame_id="f")


def image(encoding: str, height: int, width: int, step: int, data: np.ndarray,
          big: int = 0) -> Any:
    return T["sensor_msgs/msg/Image"](header=header(), height=height, width=width,
                                      encoding=encoding, is_bigendian=big, step=step,
                                      data=data)


def test_an_rgb_image_is_a_read_view_of_its_bytes() -> None:
    data = np.arange(2 * 3 * 3, dtype=np.uint8)
    frame = decode("sensor_msgs/msg/Image", image("rgb8", 2, 3, 9, data))
    assert frame.shape == (2, 3, 3) and frame.dtype == np.uint8
    assert np.shares_memory(frame, data)  # no copy
    assert frame[1, 2].tolist() == [15, 16, 17]


def test_padded_rows_are_sliced_off_without_a_copy() -> None:
    # 2 rows of 3 mono16 pixels (6 bytes) padded to a step of 8.
    rows = np.array([[1, 0, 2, 0, 3, 0, 99, 99], [4, 0, 5, 0, 6, 0, 99, 99]], np.uint8)
    data = rows.reshape(-1)
    frame = decode("sensor_msgs/Image", image("mono16", 2, 3, 8, data))  # ROS 1 name
    assert frame.shape == (2, 3) and frame.dtype == np.dtype("<u2")
    assert frame.tolist() == [[1, 2, 3], [4, 5, 6]]
    assert np.shares_memory(frame, data)


@pytest.mark.parametrize("encoding, dtype, channels", [
    ("16UC1", ">u2", 1), ("32FC1", ">f4", 1), ("8UC3", ">u1", 3), ("64FC2", ">f8", 2),
    ("8SC1", ">i1", 1), ("bayer_rggb8", ">u1", 1), ("bgra16", ">u2", 4)])
def test_encodings_give_their_dtype_in_the_message_byte_order(encoding: str, dtype: str,
                                                              channels: int) -> None:
    item = np.dtype(dtype)
    values = np.arange(2 * 2 * channels).astype(item)
    frame = decode("sensor_msgs/msg/Image", image(
        encoding, 2, 2, 2 * channels * item.itemsize, values.view(np.uint8), big=1))
    assert frame.dtype == item
    assert frame.shape == ((2, 2) if channels == 1 else (2, 2, channels))
    assert frame.reshape(-1).tolist() == values.tolist()


@pytest.mark.parametrize("encoding, step, size", [
    ("weird42", 3, 6), ("16FC1", 4, 8), ("rgb8", 5, 10), ("rgb8", 6, 7)])
def test_an_image_that_cannot_be_read_is_undecodable(encoding: str, step: int,
                                                     size: int) -> None:
    with pytest.raises(Undecodable):
        decode("sensor_msgs/msg/Image", image(encoding, 2, 2, step, np.zeros(size, np.uint8)))


def test_a_compressed_image_is_decoded() -> None:
    from PIL import Image

    pixels = np.arange(4 * 5 * 3, dtype=np.uint8).reshape(4, 5, 3)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    message = T["sensor_msgs/msg/CompressedImage"](
        header=header(), format="png", data=np.frombuffer(buffer.getvalue(), np.uint8))
    assert np.array_equal(decode("sensor_msgs/msg/CompressedImage", message), pixels)
    broken = T["sensor_msgs/msg/CompressedImage"](header=header(), format="png",
                                                  data=np.zeros(10, np.uint8))
    with pytest.raises(Undecodable):
        decode("sensor_msgs/msg/CompressedImage", broken)


def test_an_imu_is_a_dict_of_arrays() -> None:
    v3, quaternion = T["geometry_msgs/msg/Vector3"], T["geometry_msgs/msg/Quaternion"]
    covariance = np.arange(9, dtype=np.float64)
    value = decode("sensor_msgs/msg/Imu", T["sensor_msgs/msg/Imu"](
        header=header(), orientation=quaternion(x=0.0, y=0.0, z=0.0, w=1.0),
        orientation_covariance=covariance, angular_velocity=v3(x=1.0, y=2.0, z=3.0),
        angular_velocity_covariance=covariance, linear_acceleration=v3(x=0.0, y=0.0, z=9.81),
        linear_acceleration_covariance=covariance))
    assert value["orientation"].tolist() == [0.0, 0.0, 0.0, 1.0]
    assert value["angular_velocity"].tolist() == [1.0, 2.0, 3.0]
    assert value["linear_acceleration"][2] == 9.81
    assert value["orientation_covariance"].shape == (3, 3)


def test_a_point_cloud_is_a_structured_view() -> None:
    field = T["sensor_msgs/msg/PointField"]
    points = np.zeros(3, dtype=np.dtype({"names": ["x", "y", "i"], "formats": ["<f4", "<f4",
                                         "<u2"], "offsets": [0, 4, 8], "itemsize": 12}))
    points["x"], points["y"], points["i"] = [1, 2, 3], [4, 5, 6], [7, 8, 9]
    data = points.view(np.uint8).reshape(-1)
    cloud = decode("sensor_msgs/msg/PointCloud2", T["sensor_msgs/msg/PointCloud2"](
        header=header(), height=1, width=3,
        fields=[field(name="x", offset=0, datatype=7, count=1),
                field(name="y", offset=4, datatype=7, count=1),
                field(name="i", offset=8, datatype=4, count=1)],
        is_bigendian=False, point_step=12, row_step=36, data=data, is_dense=True))
    assert cloud["x"].tolist() == [1, 2, 3] and cloud["i"].tolist() == [7, 8, 9]
    assert np.shares_memory(cloud, data)


def test_another_type_is_a_dict_without_its_header() -> None:
    pose = T["geometry_msgs/msg/PoseStamped"](header=header(), pose=T["geometry_msgs/msg/Pose"](
        position=T["geometry_msgs/msg/Point"](x=1.0, y=2.0, z=3.0),
        orientation=T["geometry_msgs/msg/Quaternion"](x=0.0, y=0.0, z=0.0, w=1.0)))
    assert decode("geometry_msgs/msg/PoseStamped", pose) == {"pose": {
        "position": {"x": 1.0, "y": 2.0, "z": 3.0},
        "orientation": {"x": 0.0, "y": 0.0, "z": 0.0, "w": 1.0}}}


def test_type_names_are_read_in_both_spellings() -> None:
    assert normalized_type("sensor_msgs/Image") == "sensor_msgs/msg/Image"
    assert normalized_type("sensor_msgs/msg/Image") == "sensor_msgs/msg/Image"
