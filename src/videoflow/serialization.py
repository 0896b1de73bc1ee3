"""Frozen compatibility shim: the wire serialization API under its old module path.

Dead-lettered payloads and stored flow descriptions name this path, so it must keep
importing. It re-exports exactly ``videoflow.wire.serialization.__all__`` and
nothing else; change the wire module, never this file.
"""

from videoflow.wire.serialization import *  # noqa: F403 -- re-exporting is the point
from videoflow.wire.serialization import __all__ as __all__
