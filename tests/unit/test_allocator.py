"""videoflow.run.allocator: a replica process reuses frame-sized buffers instead of
taking every page of every frame from the kernel again, and leaves an allocator the
user tuned alone. Each case runs in a fresh interpreter: the tuning is per process."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc",
                                reason="the tuning is glibc's mallopt")

# A camera's work per frame, without the broker: build a 1080p frame, encode it as a
# message (two more buffers of its size), let all three go. Minor faults counted over
# 60 frames after 5 to settle.
_FRAMES = """
import json, resource, sys
import numpy as np
from videoflow.run.allocator import tune_allocator
from videoflow.wire.offload import encode_message
tuned = tune_allocator() if sys.argv[1] == "tune" else None

def frame(k):
    data = encode_message({"k": k, "frame": np.full((1080, 1920), k % 256, np.uint8)})
    return len(data)

for k in range(5):
    frame(k)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for k in range(60):
    frame(k)
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(json.dumps({"tuned": tuned, "faults_per_frame": faults / 60}))
"""


def _frames(mode: str, **env: str) -> dict[str, object]:
    environ = {k: v for k, v in os.environ.items()
               if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    done = subprocess.run([sys.executable, "-c", _FRAMES, mode], capture_output=True,
                          text=True, check=True, env={**environ, **env})
    result: dict[str, object] = json.loads(done.stdout)
    return result


def test_a_tuned_process_reuses_frame_buffers_instead_of_faulting_them_in() -> None:
    default = _frames("default")
    tuned = _frames("tune")

    # 2 MB a buffer is 506 pages; untuned, each frame faults in at least one buffer.
    assert tuned["tuned"] is True
    assert float(default["faults_per_frame"]) > 400  # type: ignore[arg-type]
    assert float(tuned["faults_per_frame"]) < 20  # type: ignore[arg-type]


def test_an_allocator_the_user_tuned_is_left_alone() -> None:
    assert _frames("tune", MALLOC_TRIM_THRESHOLD_="131072")["tuned"] is False
    assert _frames("tune", GLIBC_TUNABLES="glibc.malloc.trim_threshold=131072")[
        "tuned"] is False
