"""The interface both grouping cores implement: the compiled ``_grouping_core``
(csrc/) and the pure-Python reference ``_grouping_ref``. Assemblers, tests and
benchmarks type a core with these Protocols, whichever of the two it is."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol


class GroupingCore(Protocol):
    """One assembler's bookkeeping: entries and handles held opaquely beside sorted
    numeric tables; groups come out as ReadyGroup objects. The core never calls a
    handle: what it lets go of is appended to released as (handle, reason), reason
    SUPERSEDED or the discard's ('evicted', 'expired', 'late', 'flushed'), and a call
    that leaves pairs there (add, sweep, pop, flush) ends by handing that list to the
    on_release it was built with, then emptying it (without one they stay)."""

    evictions: int
    released: list[tuple[Any, str]]

    def add(self, parent_name: str, entry: Any, handle: Any) -> None: ...
    def sweep(self, now: float | None = None) -> None: ...
    def pop(self, now: float | None = None) -> Any: ...
    def flush(self, now: float | None = None) -> list[Any]: ...
    def pending_count(self) -> int: ...
    def oldest_wait(self, now: float | None = None) -> float: ...
    def waiting_for(self) -> list[str]: ...
    def has_pending_from(self, parent_name: str) -> bool: ...
    def queue_lengths(self) -> tuple[int, int]: ...


class TimeGroupingCore(GroupingCore, Protocol):
    """The event-time core adds the parents' silence and watermarks."""

    def heard(self, parent_name: str, now: float | None = None) -> None: ...
    def watermarks(self) -> dict[str, float | None]: ...


class GroupingCoreModule(Protocol):
    """A core implementation: the module, as messaging.grouping loads it."""

    CORE_KIND: str
    SUPERSEDED: str

    def group_identity(self, keys: list[str]) -> str: ...

    def TraceCore(  # noqa: N802 - the modules' class, called as a factory
        self, parent_names: list[str], timeout_s: float, quorum: int, max_pending: int,
        missing_wait: bool, clock: Callable[[], float], ready_factory: Callable[..., Any],
        on_release: Callable[[list[tuple[Any, str]]], object] | None = None,
    ) -> GroupingCore: ...

    def TimeCore(  # noqa: N802
        self, parent_names: list[str], collect_names: list[str], windows_s: list[float],
        tolerance_s: float, timeout_s: float, quorum: int, max_pending: int,
        missing_wait: bool, clock: Callable[[], float], ready_factory: Callable[..., Any],
        collect_factory: Callable[..., Any], epoch: Callable[[], float] | None = None,
        on_release: Callable[[list[tuple[Any, str]]], object] | None = None,
        disorder_s: float = 0.0,
    ) -> TimeGroupingCore: ...


__all__ = ["GroupingCore", "GroupingCoreModule", "TimeGroupingCore"]
