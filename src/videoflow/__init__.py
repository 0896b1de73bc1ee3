"""videoflow: dataflow pipelines over NATS JetStream with an event-time join node.

What a flow is written with, importable from here without knowing the folders::

    from videoflow import Flow, ProducerNode, ProcessorNode, ConsumerNode, JoinPolicy

The names load on first use: importing videoflow (or any of its modules, in a replica
process) does not load the engine, the broker client or the compiled cores until a
name that needs them is asked for.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_HOMES = {
    "Flow": "videoflow.flow",
    "ProducerNode": "videoflow.core.node",
    "ProcessorNode": "videoflow.core.node",
    "ConsumerNode": "videoflow.core.node",
    "JoinPolicy": "videoflow.core.policies",
    "DeliveryPolicy": "videoflow.core.policies",
    "PoisonMessage": "videoflow.core.policies",
    "WorkerFatal": "videoflow.core.policies",
    "BATCH": "videoflow.core.constants",
    "REALTIME": "videoflow.core.constants",
}

if TYPE_CHECKING:
    from videoflow.core.constants import BATCH, REALTIME
    from videoflow.core.node import ConsumerNode, ProcessorNode, ProducerNode
    from videoflow.core.policies import DeliveryPolicy, JoinPolicy, PoisonMessage, WorkerFatal
    from videoflow.flow import Flow


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'videoflow' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # asked once
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES])


__all__ = [
    "BATCH",
    "REALTIME",
    "ConsumerNode",
    "DeliveryPolicy",
    "Flow",
    "JoinPolicy",
    "PoisonMessage",
    "ProcessorNode",
    "ProducerNode",
    "WorkerFatal",
]
