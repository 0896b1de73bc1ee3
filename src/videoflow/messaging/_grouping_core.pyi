from collections.abc import Callable
from typing import Any

CORE_KIND: str
SUPERSEDED: str

def group_identity(keys: list[str]) -> str: ...

class _Core:
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

class TraceCore(_Core):
    def __init__(
        self,
        parent_names: list[str],
        timeout_s: float,
        quorum: int,
        max_pending: int,
        missing_wait: bool,
        clock: Callable[[], float],
        ready_factory: Callable[..., Any],
        on_release: Callable[[list[tuple[Any, str]]], object] | None = None,
    ) -> None: ...

class TimeCore(_Core):
    def __init__(
        self,
        parent_names: list[str],
        collect_names: list[str],
        windows_s: list[float],
        tolerance_s: float,
        timeout_s: float,
        quorum: int,
        max_pending: int,
        missing_wait: bool,
        clock: Callable[[], float],
        ready_factory: Callable[..., Any],
        collect_factory: Callable[..., Any],
        epoch: Callable[[], float] | None = None,
        on_release: Callable[[list[tuple[Any, str]]], object] | None = None,
        disorder_s: float = 0.0,
    ) -> None: ...
    def heard(self, parent_name: str, now: float | None = None) -> None: ...
    def watermarks(self) -> dict[str, float | None]: ...
