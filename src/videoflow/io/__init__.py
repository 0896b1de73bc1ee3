"""Data in and out of flows from outside videoflow: nodes that read and write plain
NATS subjects (SubjectSource, SubjectSink), for publishers and readers that know nothing of it, and
replay of recorded ROS bags (RosbagSource; the 'ros' extra), whose paced sources wait
for each other's processes through a StartGate, and groups shown in the Rerun viewer
(RerunSink; the 'rerun' extra)."""

from videoflow.io.rerun_sink import RerunSink
from videoflow.io.rosbag_source import RosbagSource
from videoflow.io.start_gate import StartGate
from videoflow.io.subject_sink import (
    DTYPE_HEADER,
    EVENT_TIME_HEADER,
    SHAPE_HEADER,
    SinkPublishFailed,
    SubjectSink,
)
from videoflow.io.subject_source import SubjectSource

__all__ = ["DTYPE_HEADER", "EVENT_TIME_HEADER", "SHAPE_HEADER", "RerunSink", "RosbagSource",
           "SinkPublishFailed", "StartGate", "SubjectSink", "SubjectSource"]
