"""What the shared-memory payload tests share: who owns an array's memory."""

from __future__ import annotations

import numpy as np


def base_of(array: np.ndarray) -> object:
    """The object that owns an array's memory, down its chain of views and buffers."""
    owner: object = array
    while isinstance(owner, np.ndarray) and owner.base is not None:
        owner = owner.base
    while isinstance(owner, memoryview):
        owner = owner.obj
    return owner
