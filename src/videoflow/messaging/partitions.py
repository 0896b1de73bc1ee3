"""Partitioned consumption: which replica of a node an input belongs to.

Each replica of a partitioned node binds its own durables, so every replica sees every
message; it keeps only the inputs whose partition key hashes to it, and its backend
acknowledges the rest at once (MessagingBackend.set_admission).
"""

from __future__ import annotations

import zlib
from typing import Any

from videoflow.backends.messaging import Delivery
from videoflow.errors import WireError
from videoflow.wire.offload import encode_message
from videoflow.wire.serialization import decode_envelope


def partition_of(key: Any, partitions: int) -> int:
    """The partition a key routes to: stable across processes and runs (crc32 of its
    msgpack bytes, never Python's salted hash)."""
    return zlib.crc32(encode_message(key)) % partitions


class Partition:
    """One replica's share of a partitioned node's inputs.

    Arguments:
        partition_by: the field of a dict message that keys it, when its envelope
            carries no partition_key.
        partitions: the node's replica count.
        index: this replica.
    """

    def __init__(self, partition_by: str, partitions: int, index: int) -> None:
        self.partition_by, self.partitions, self.index = partition_by, partitions, index

    def admits(self, delivery: Delivery) -> bool:
        """Whether an input belongs to this replica: its envelope's partition_key,
        else the partition_by field of a dict message, else its trace id, hashed
        stably onto the replicas (partition_of). Undecodable bytes are admitted, so
        the receive path counts them."""
        try:
            decoded = decode_envelope(delivery.data)
        except WireError:
            return True
        return partition_of(self.key_of(decoded), self.partitions) == self.index

    def key_of(self, decoded: dict[str, Any]) -> Any:
        """The partition key of a decoded envelope (see admits)."""
        key = decoded["partition_key"]
        message = decoded["message"]
        if key is None and isinstance(message, dict) and self.partition_by in message:
            key = message[self.partition_by]
        return decoded["trace_id"] if key is None else key


__all__ = ["Partition", "partition_of"]
