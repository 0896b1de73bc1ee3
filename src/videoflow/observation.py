"""What was read from the broker, or why nothing could be: ``Known(value)`` or
``Unknown(reason, detail)``.

On the ground floor, so the broker floor's failure classification answers in these
types itself (broker.failures.unknown_from). The messaging contract re-exports them
(``videoflow.backends.messaging``), and that is where users import them from.

``Known(0)`` and ``Unknown(...)`` are different types, and neither may be
truth-tested, so "zero pending" can never be confused with "could not read" (MSG-012).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, Literal, TypeAlias, TypeVar

T = TypeVar("T")

UnknownReason = Literal["missing", "timeout", "auth", "unreachable", "api", "malformed", "unread"]
UNKNOWN_REASONS: frozenset[str] = frozenset(
    {"missing", "timeout", "auth", "unreachable", "api", "malformed", "unread"}
)
"""Why an observation is Unknown: missing (the thing does not exist — a definite
observation, kept apart from the rest), timeout (the server is there and slow), auth
(credentials or permissions refused), unreachable (no server answered), api (the
server answered with an error), malformed (an answer that could not be interpreted),
unread (nothing has been read yet)."""


class _NotTruthTestable:
    """Mixin: refuse ``bool()`` so ``if observation:`` cannot stand in for a type match.

    Known(0) would be falsy and Unknown truthy (or the reverse) under any convention,
    and either way a zero and an unread value would take the same branch (MSG-012).
    """

    __slots__ = ()

    def __bool__(self) -> bool:
        raise TypeError(
            f"{type(self).__name__} is not truth-testable: match on Known / Unknown"
        )


@dataclass(frozen=True, slots=True)
class Known(_NotTruthTestable, Generic[T]):
    """A value read from the broker. Known(0) means zero was observed."""

    value: T


@dataclass(frozen=True, slots=True)
class Unknown(_NotTruthTestable):
    """Nothing could be observed, and why (one of UNKNOWN_REASONS)."""

    reason: UnknownReason
    detail: str = ""

    def __post_init__(self) -> None:
        if self.reason not in UNKNOWN_REASONS:
            raise ValueError(
                f"Unknown.reason must be one of {sorted(UNKNOWN_REASONS)}, got {self.reason!r}"
            )
        if not isinstance(self.detail, str):
            raise ValueError(f"Unknown.detail must be a string, got {self.detail!r}")


Observation: TypeAlias = Known[T] | Unknown
"""``Observation[int]`` is ``Known[int] | Unknown``."""


__all__ = ["UNKNOWN_REASONS", "Known", "Observation", "Unknown", "UnknownReason"]
