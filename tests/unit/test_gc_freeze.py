"""videoflow.run.gc_freeze: a replica process freezes what it set up out of the garbage
collector's full collections, on its main thread only. Each case runs in a fresh
interpreter: freezing is per process, and pytest's must stay as it is."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

_FREEZE = """
import gc, json, sys, threading
import numpy, nats, msgspec
import videoflow.messaging.nats_messenger
from videoflow.run.gc_freeze import freeze_setup

if sys.argv[1] == "thread":
    got = []
    worker = threading.Thread(target=lambda: got.append(freeze_setup()))
    worker.start()
    worker.join()
    frozen = got[0]
elif sys.argv[1] == "opened":  # set up, then a node's open() loads a model
    freeze_setup()
    before = gc.get_freeze_count()
    model = [[k] for k in range(20_000)]
    frozen = freeze_setup(young=True)
    print(json.dumps({"frozen": frozen, "added": gc.get_freeze_count() - before,
                      "walked": len(gc.get_objects())}))
    sys.exit(0)
else:
    frozen = freeze_setup()
print(json.dumps({"frozen": frozen, "permanent": gc.get_freeze_count(),
                  "walked": len(gc.get_objects())}))
"""


def _freeze(where: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-c", _FREEZE, where], capture_output=True,
                          text=True, check=True)
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_on_the_main_thread_everything_set_up_leaves_the_full_collections() -> None:
    got = _freeze("main")
    assert got["frozen"] is True
    assert got["permanent"] > 10_000
    assert got["walked"] < 1_000


def test_off_the_main_thread_nothing_is_frozen() -> None:
    # A replica run on a thread shares its process (a test's): its heap is not its own.
    got = _freeze("thread")
    assert got == {"frozen": False, "permanent": 0, "walked": got["walked"]}
    assert got["walked"] > 10_000


def test_once_the_node_is_open_what_open_made_is_frozen_from_the_young_generations() -> None:
    # The second call collects only the younger generations: what open() made is
    # there, and the whole process is not walked again while the first inputs wait.
    got = _freeze("opened")
    assert got["frozen"] is True
    assert got["added"] >= 20_000
    assert got["walked"] < 1_000
