"""What a replica process's garbage collector walks.

Python's cyclic collector now and then makes a full collection: whenever the objects
that survived its younger collections reach a quarter of those it holds for good, it
walks every object the process has. In a replica, most of them are the modules it
imported (numpy, nats-py, msgspec, videoflow) and its own setup: tens of thousands of
objects that live as long as the process and are never garbage.

freeze_setup collects, then moves every object then alive to the collector's
permanent generation (gc.freeze): later full collections walk only what came after. A
replica calls it twice: once set up, before its node opens (imports, connection,
messenger: the bulk), and again once the node is open (a model, a table, whatever its
open() loaded) and before its first input. The second time it collects the younger
generations only, which hold what open() made:
- collected whole after open() only, the process took 20-45 ms there while a reader's
  first inputs waited; at 1 kHz that held the first 20-45 messages of a run, enough to
  be a paced flow's p99 latency;
- collected whole twice, the second full collection, of the little not yet frozen,
  set the bar for the next ones that low (a quarter of what it found): full
  collections came again and again, and walked a join's pending groups each time
  (the 8-camera time join bench lost a third of its rate).
Measured in a flat-out linear flow (60,000 messages at about 6,000 msg/s on 2 cores),
the processor's and the producer's full collections paused them 30-130 ms each before
any freezing, 10-30 ms after, and took a quarter of the time in all. A frozen object
is still freed as soon as nothing refers to it; only a reference cycle among objects
of the setup that became garbage later would be kept.
"""

from __future__ import annotations

import gc
import threading

__all__ = ["freeze_setup"]


def freeze_setup(young: bool = False) -> bool:
    """Collect, then freeze every object alive (see the module): once the replica is
    set up, and again once its node is open. Only on the process's main thread, where
    a replica runs as the process's own: a replica run on another thread (a test's)
    shares its process with others.

    Arguments:
        young: collect the younger generations only (once the node is open: what
            open() made), leaving the bar for the next full collection where the
            first call's set it.

    Returns:
        whether the objects were frozen (False off the main thread).
    """
    if threading.current_thread() is not threading.main_thread():
        return False
    gc.collect(1 if young else 2)
    gc.freeze()
    return True
