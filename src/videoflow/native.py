"""Whether this process runs the compiled cores or their pure-Python references: the
one place VIDEOFLOW_PURE_PYTHON is read.

Two modules import compiled code, each beside its reference: messaging.grouping (the
grouping core, csrc/) and wire.serialization (the envelope decoder). Without the
variable the compiled code is required, and its absence is an ImportError that says
how to build it, never a silent fall back to the slow path.
"""

from __future__ import annotations

import os
from typing import Final

PURE_PYTHON_ENV: Final = "VIDEOFLOW_PURE_PYTHON"
"""Set to 1 to run the pure-Python references instead of the compiled code."""

PURE_PYTHON: Final = os.environ.get(PURE_PYTHON_ENV) == "1"
"""Read once, at the first import of videoflow's compiled-code users."""


def asked_now() -> bool:
    """Whether the environment asks for the references now: a process forked from one
    that imported videoflow earlier (a replica server's) holds PURE_PYTHON as it was
    then."""
    return os.environ.get(PURE_PYTHON_ENV) == "1"


def not_built(what: str, reference: str) -> ImportError:
    """The error for compiled code that is not built: how to build it, or to choose
    the reference instead."""
    return ImportError(
        f"videoflow's compiled {what} is not built: install the package with "
        "`pip install .` (or build in place with `python setup.py build_ext --inplace`), "
        f"or set {PURE_PYTHON_ENV}=1 to {reference}")


__all__ = ["PURE_PYTHON", "PURE_PYTHON_ENV", "asked_now", "not_built"]
