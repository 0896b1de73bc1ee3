"""StartGate: one first instant for the processes of a flow on one host, taken once
every one of them is up.

Processes of a flow start one after another (spawned, each importing numpy and
connecting to the broker): 2 to 6 s apart on a busy 2-core machine. Producers that
pace their output from a shared instant (the demo's cameras, the sources of a paced bag
replay) would otherwise begin at different distances behind it, and a time join would
give up on the late ones for its timeout. Each process marks itself up with a file in
a directory they share; the first instant is a delay after the last mark, and every
process reads it from the same files, so they agree without talking to each other. The
directory is on one host's file system: a flow whose processes span hosts has none.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

GATE_PATIENCE_S = 120.0
"""How long a process waits for every other one to be up before it fails."""


@dataclass(frozen=True)
class StartGate:
    """The first instant, the same for every process of the flow (see the module).

    Arguments:
        directory: the shared directory (the flow's temporary one).
        names: every node that marks itself up.
        delay: seconds from the last node up to the first instant.
    """

    directory: str
    names: tuple[str, ...]
    delay: float

    def arrive(self, name: str) -> None:
        """Mark name up. A restarted process marks nothing new: the first mark stays."""
        try:
            with open(os.path.join(self.directory, f"{name}.up"), "x"):
                pass
        except FileExistsError:
            pass

    def t0(self, patience: float = GATE_PATIENCE_S) -> float:
        """Wait until every node is up, and return the first instant (epoch s).

        Raises:
            TimeoutError: some node was not up within patience seconds.
        """
        paths = [os.path.join(self.directory, f"{name}.up") for name in self.names]
        deadline = time.monotonic() + patience
        while True:
            missing = [name for name, path in zip(self.names, paths, strict=True)
                       if not os.path.exists(path)]
            if not missing:
                return max(os.stat(path).st_mtime for path in paths) + self.delay
            if time.monotonic() > deadline:
                raise TimeoutError(f"{', '.join(missing)} not up after {patience:g} s")
            time.sleep(0.01)


__all__ = ["GATE_PATIENCE_S", "StartGate"]
