"""RerunSink: a consumer node that logs each input group it gets to the Rerun viewer
(rerun-sdk, the 'rerun' extra) -- a join's groups when it is given the join's parents
and policy, any node's outputs when it has one parent."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from videoflow.core.node import ConsumerNode
from videoflow.io.rerun_log import (
    RerunLog,
    check_target,
    group_layout,
    open_recording,
    require_rerun,
)


class RerunSink(ConsumerNode):
    """Logs every input group to Rerun, on a timeline of event time (rerun_log): each
    camera's frame an image, collect windows as scalar series at their samples' times,
    a parent missing from a quorum group cleared and named in ``{name}/notes``, with
    the clock corrections applied and the inputs the node dropped.

    Wired like any consumer: ``RerunSink("groups.rrd", join=JoinPolicy(...))(cam0, cam1,
    imu)`` fuses and shows the fusion's groups; ``RerunSink("spawn")(fusion)`` shows a
    node's outputs in a viewer it starts.

    Arguments:
        target: where to log: a path ending in .rrd (written as the run goes; open it
            with ``rerun FILE``), 'spawn' (starts a viewer), or a running viewer's gRPC
            URL (rerun+http://HOST:PORT/proxy).
        recording_id: the recording's id (default: the run's, so a replica's groups
            and a rerun of the same flow land apart).
        leave_out: keys of dict messages not logged (RerunLog).
        options: the node's (name, join, delivery, ...).

    Raises:
        MissingDependency: rerun-sdk is not installed (at once, naming the extra).
        ValueError: a bad target.
    """

    def __init__(self, target: str, *, recording_id: str | None = None,
                 leave_out: Iterable[str] = (), **options: Any) -> None:
        super().__init__(**options)
        require_rerun()
        self.target = check_target(target)
        self.recording_id = recording_id
        self.leave_out = tuple(leave_out)

    def open(self) -> None:
        context = self.context
        assert context is not None
        target = self.target
        if target.endswith(".rrd") and context.nb_tasks > 1:  # one file per replica
            target = f"{target[:-4]}.{context.replica_id}.rrd"
        self._recording = open_recording(target, f"videoflow {context.flow_id}",
                                         self.recording_id or context.run_id or None)
        self._log = RerunLog(self._recording, self.name, self.leave_out)
        collect = set((self.join_policy or {}).get("collect") or {})
        parents = list(context.parents)
        self._recording.send_blueprint(group_layout(
            self.name, [p for p in parents if p not in collect],
            [p for p in parents if p in collect]))
        self._dropped: dict[str, int] = {}

    def consume(self, *inputs: Any) -> None:
        context = self.context
        assert context is not None
        info = context.input_info or {}
        parents = list(context.parents or info)
        members = dict(zip(parents, inputs, strict=True))
        dropped = context.dropped
        since = {r: n - self._dropped.get(r, 0) for r, n in dropped.items()}
        self._dropped = dropped
        self._log.group(group_time(info), members, info, since)

    def close(self) -> None:
        recording = getattr(self, "_recording", None)
        if recording is not None:
            recording.flush()
            recording.disconnect()


def group_time(info: dict[str, Any]) -> float | None:
    """A group's event time as its join fused it: the earliest of its members' (a
    collect window's samples aside); None when none has one."""
    times = [one["event_ts"] for one in info.values()
             if one is not None and isinstance(one.get("event_ts"), float)]
    return min(times) if times else None


__all__ = ["RerunSink", "group_time"]
