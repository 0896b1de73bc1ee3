"""Join and delivery policies of a node.

A policy is plain data: it validates itself on construction, round-trips through a
dict (so it can sit in a flow description or a ledger) and knows nothing of brokers.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from videoflow.core.constants import BATCH, FLOW_TYPES, REALTIME

MAX_SYNC_PARENTS = 64
"""Sync parents per join: presence is a 64-bit mask in the compiled core."""

JOIN_MODES = ("trace", "time")
MISSING_POLICIES = ("drop", "dead_letter", "wait")


def _finite_nonneg(name: str, value: Any, *, allow_zero: bool = True) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be finite and {bound}, got {value!r}")


class JoinPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """How a multi-parent node assembles its input groups.

    Attributes:
        mode: 'trace' joins halves of one originating message by trace id; 'time'
            fuses independent producers by event time.
        tolerance_ms: how far apart (ms) sync members of one time group may be; required
            in time mode.
        timeout_ms: how long (wall ms since a group was seeded) an incomplete group may
            wait; None waits forever.
        missing: what happens to a group that times out below quorum: 'drop' evicts and
            counts it, 'dead_letter' terminates its halves against a dead letter, 'wait'
            never gives up.
        quorum: how many sync parents a timed-out group needs to be emitted with None for
            the missing ones; None means all of them (no partial emission).
        max_pending: incomplete groups held at once; beyond it the oldest is evicted.
            Also the sample capacity of each collect parent's buffer.
        collect: {parent: window_ms} for high-rate parents joined many-to-one: the group
            takes every sample within window_ms of its time (time mode only).
    """

    mode: str = "trace"
    tolerance_ms: float | None = None
    timeout_ms: float | None = 5000.0
    missing: str = "drop"
    quorum: int | None = None
    max_pending: int = 1024
    collect: dict[str, float] = msgspec.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.mode not in JOIN_MODES:
            raise ValueError(f"mode must be one of {JOIN_MODES}, got {self.mode!r}")
        if self.missing not in MISSING_POLICIES:
            raise ValueError(f"missing must be one of {MISSING_POLICIES}, got {self.missing!r}")
        if self.tolerance_ms is not None:
            _finite_nonneg("tolerance_ms", self.tolerance_ms)
        elif self.mode == "time":
            raise ValueError("tolerance_ms is required in time mode")
        if self.timeout_ms is not None:
            _finite_nonneg("timeout_ms", self.timeout_ms, allow_zero=False)
        if self.quorum is not None and (
            isinstance(self.quorum, bool) or not isinstance(self.quorum, int) or self.quorum < 1
        ):
            raise ValueError(f"quorum must be an int >= 1 or None, got {self.quorum!r}")
        if isinstance(self.max_pending, bool) or not isinstance(self.max_pending, int) or (
            self.max_pending < 1
        ):
            raise ValueError(f"max_pending must be an int >= 1, got {self.max_pending!r}")
        if not isinstance(self.collect, dict):
            raise ValueError(f"collect must be a dict of parent -> window_ms, got {self.collect!r}")
        if self.collect and self.mode != "time":
            raise ValueError("collect windows need mode='time'")
        for parent, window in self.collect.items():
            if not isinstance(parent, str):
                raise ValueError(f"collect keys must be parent names, got {parent!r}")
            _finite_nonneg(f"collect[{parent!r}]", window)

    @classmethod
    def default_for(cls, flow_type: str) -> JoinPolicy:
        """The join policy a node of this flow type gets when it names none.

        Arguments:
            flow_type (str): REALTIME or BATCH.

        Returns:
            REALTIME: trace mode, 2 s timeout, drop, 1024 pending (freshness first).
            BATCH: trace mode, 10 min timeout, dead_letter, 100,000 pending (completeness).

        Raises:
            ValueError: for an unknown flow type.
        """
        if flow_type == REALTIME:
            return cls(timeout_ms=2000.0, missing="drop", max_pending=1024)
        if flow_type == BATCH:
            return cls(timeout_ms=600_000.0, missing="dead_letter", max_pending=100_000)
        raise ValueError(f"flow_type must be one of {FLOW_TYPES}, got {flow_type!r}")

    def to_dict(self) -> dict[str, Any]:
        """Returns the policy as a plain dict that from_dict turns back into an equal policy."""
        return {
            "mode": self.mode,
            "tolerance_ms": self.tolerance_ms,
            "timeout_ms": self.timeout_ms,
            "missing": self.missing,
            "quorum": self.quorum,
            "max_pending": self.max_pending,
            "collect": dict(self.collect),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JoinPolicy:
        """Builds a policy from a dict such as to_dict returns; absent keys take defaults.

        Raises:
            ValueError: naming the first unknown key or invalid field.
        """
        known = set(cls.__struct_fields__)
        for key in data:
            if key not in known:
                raise ValueError(f"unknown JoinPolicy field {key!r}")
        fields = dict(data)
        if "collect" in fields and fields["collect"] is not None:
            fields["collect"] = dict(fields["collect"])
        return cls(**fields)

    def sync_parents(self, parents: Iterable[str]) -> list[str]:
        """The parents that must each contribute one message per group (all but collect)."""
        return [p for p in parents if p not in self.collect]

    def validate_for(self, parents: Iterable[str]) -> list[str]:
        """Checks the policy against a node's parents and returns its sync parents.

        Raises:
            ValueError: naming the field: a collect parent that is not a parent, no sync
                parent, more than 64 sync parents, or a quorum above the sync count.
        """
        parents = list(parents)
        if len(set(parents)) != len(parents):
            raise ValueError(f"parents must be distinct, got {parents!r}")
        for name in self.collect:
            if name not in parents:
                raise ValueError(f"collect parent {name!r} is not a parent of this node")
        sync = self.sync_parents(parents)
        if not sync:
            raise ValueError("collect: at least one parent must be a sync (non-collect) parent")
        if len(sync) > MAX_SYNC_PARENTS:
            raise ValueError(
                f"parents: {len(sync)} sync parents exceed the maximum of {MAX_SYNC_PARENTS}"
            )
        if self.quorum is not None and self.quorum > len(sync):
            raise ValueError(f"quorum {self.quorum} exceeds the {len(sync)} sync parents")
        return sync

    def working_set(self, parents: Iterable[str]) -> int:
        """How many unsettled messages the join may hold at once (RUN-005: join credit).

        Every half of every pending group plus the group being assembled, and each
        collect parent's sample buffer (capacity max_pending). A broker credit below
        this can starve the join: it would wait for halves the broker will not send.

        Raises:
            ValueError: as validate_for.
        """
        parents = list(parents)
        sync = self.validate_for(parents)
        n_collect = len(parents) - len(sync)
        return (self.max_pending + 1) * len(sync) + self.max_pending * n_collect
