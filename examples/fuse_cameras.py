"""Fuse four cameras and an IMU by event time with a TimeGroupAssembler.

A simulation, deterministic from run to run: four cameras capture at 30 fps, each
stamping its frames with up to +-2 ms of jitter and now and then dropping a frame;
an IMU samples at 400 Hz. Every source reaches the join with its own network delay,
so the assembler sees the streams interleaved roughly as a real join node would. The
clock is simulated as well (it follows arrival time), so the output is the same on
every run.

The join policy:
  - tolerance 5 ms: covers the 4 ms widest spread between two cameras of one instant;
  - quorum 3 of 4: a group missing one camera is still emitted once it times out;
  - timeout 100 ms: how long an incomplete group may wait for its last camera;
  - collect {"imu": 10 ms}: each group takes every IMU sample within 10 ms of its time.

Run:  python examples/fuse_cameras.py
"""

from __future__ import annotations

import random
import sys
from collections import Counter

from videoflow.core.policies import JoinPolicy
from videoflow.messaging.grouping import CollectEntry, EnvelopeEntry, TimeGroupAssembler

CAMERAS = ["front", "rear", "left", "right"]
FPS = 30.0
JITTER_S = 0.002
DROP_RATE = 0.03
IMU_HZ = 400.0
SECONDS = 60
# Per-source network delay (s): constant per source, so each source stays in order.
DELAY_S = {"front": 0.004, "rear": 0.009, "left": 0.006, "right": 0.012, "imu": 0.002}

POLICY = JoinPolicy(
    mode="time",
    tolerance_ms=5.0,
    quorum=3,
    timeout_ms=100.0,
    collect={"imu": 10.0},
)


class AckHandle:
    """Stands in for a broker ack handle and records how it was resolved.

    The assembler resolves some handles itself (discard: frames of a group that timed
    out below quorum, IMU samples no window took); the rest travel out in
    ReadyGroup.handles, for the task loop to ack once the node has processed the group.
    """

    __slots__ = ("kind", "outcomes")

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.outcomes: list[str] = []

    def discard(self, reason: str) -> None:
        self.outcomes.append(reason)

    def supersede(self) -> None:
        self.outcomes.append("superseded")


def simulate(rng: random.Random) -> tuple[list[tuple[float, str, EnvelopeEntry]], int]:
    """Returns (messages as (arrival time, source, entry) in arrival order, frames dropped)."""
    messages = []
    dropped = 0
    for k in range(int(SECONDS * FPS)):
        instant = k / FPS
        for camera in CAMERAS:
            if rng.random() < DROP_RATE:
                dropped += 1
                continue
            ts = instant + rng.uniform(-JITTER_S, JITTER_S)
            frame = {"camera": camera, "instant": k}
            entry = EnvelopeEntry(f"{camera}-{k}", k, ts, frame, None, False)
            messages.append((ts + DELAY_S[camera], camera, entry))
    for j in range(int(SECONDS * IMU_HZ)):
        ts = j / IMU_HZ
        sample = {"gyro": (0.0, 0.0, 0.01 * j)}
        entry = EnvelopeEntry(f"imu-{j}", j, ts, sample, None, False)
        messages.append((ts + DELAY_S["imu"], "imu", entry))
    messages.sort(key=lambda m: m[0])
    return messages, dropped


def main() -> int:
    messages, dropped = simulate(random.Random(7))

    now = [0.0]  # the simulated clock: the arrival time of the message being fed
    assembler = TimeGroupAssembler("fuse", CAMERAS + ["imu"], POLICY, clock=lambda: now[0])
    handles = []
    groups = []
    for arrival, source, entry in messages:
        now[0] = arrival
        handle = AckHandle("imu" if source == "imu" else "camera")
        handles.append(handle)
        assembler.add(source, entry, handle)
        while (group := assembler.pop_ready(arrival)) is not None:
            groups.append(group)
    # End of input: emit what holds a quorum, release everything else.
    groups.extend(assembler.flush(now[0] + 1.0))

    partial = 0
    missing: Counter = Counter()
    imu_per_group: Counter = Counter()
    mixed = []
    for group in groups:
        cams = [group.entries[c] for c in CAMERAS]
        if None in cams:
            partial += 1
            missing.update(c for c, e in zip(CAMERAS, cams, strict=True) if e is None)
        instants = {e.message["instant"] for e in cams if e is not None}
        if len(instants) != 1:
            mixed.append((group.trace_id, sorted(instants)))
        imu = group.entries["imu"]
        assert isinstance(imu, CollectEntry)
        imu_per_group[len(imu.event_ts)] += 1
        for handle in group.handles:
            handle.outcomes.append("acked")  # what the task loop does after processing

    outcomes = Counter((h.kind, "+".join(h.outcomes) or "unresolved") for h in handles)
    print(
        f"simulated {SECONDS} s: {int(SECONDS * FPS)} capture instants x {len(CAMERAS)} "
        f"cameras ({dropped} frames dropped), {int(SECONDS * IMU_HZ)} IMU samples"
    )
    print(f"groups emitted:         {len(groups)}")
    print(f"  all {len(CAMERAS)} cameras:        {len(groups) - partial}")
    print(
        f"  quorum, one missing:  {partial}  ("
        + ", ".join(f"{c} {n}" for c, n in sorted(missing.items()))
        + ")"
    )
    print(
        "imu samples per group: "
        + ", ".join(f"{n} in {g} groups" for n, g in sorted(imu_per_group.items(), reverse=True))
        + "  (fewer only at the start: no samples before t=0)"
    )
    print(f"groups evicted:         {assembler.evictions} (timed out below quorum)")
    print("message handles:")
    for (kind, outcome), n in sorted(outcomes.items()):
        print(f"  {kind:<7}{outcome:<10}{n:>7}")

    ok = True
    if mixed:
        print(f"FAIL: {len(mixed)} groups mix capture instants, e.g. {mixed[:3]}")
        ok = False
    else:
        print("check: every group's cameras come from one capture instant: ok")
    once = {"acked", "expired", "evicted", "flushed"}
    bad = sum(n for (_, outcome), n in outcomes.items() if outcome not in once)
    if bad:
        print(f"FAIL: {bad} handles not resolved exactly once")
        ok = False
    else:
        print("check: every message's handle was resolved exactly once: ok")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
