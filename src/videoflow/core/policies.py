"""Join and delivery policies of a node, and the errors node code raises to steer delivery.

A policy is plain data: it validates itself on construction, round-trips through a
dict (so it can sit in a flow description or a ledger) and knows nothing of brokers.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

import msgspec

from videoflow.core.constants import BATCH, FLOW_TYPES, REALTIME
from videoflow.errors import VideoflowError, WireError

MAX_SYNC_PARENTS = 64
"""Sync parents per join: presence is a 64-bit mask in the compiled core."""

JOIN_MODES = ("trace", "time")
DEFAULT_MAX_DRIFT_MS = 1000.0
"""A time join's default drift bound (JoinPolicy.max_drift_ms): a second of event time.
Wide enough that cameras jittering, dropping frames or starting a little apart never
meet it; narrow enough that what the join holds for a lagging camera stays small (30
frames a camera at 30 fps)."""

MAX_CLOCK_OFFSET_S = 60.0
"""The largest clock offset a time join corrects (JoinPolicy.clock_offsets): a source a
minute off is misconfigured, not skewed."""

CLOCK_CORRECTIONS = ("static", "running")
"""JoinPolicy.clock_correction: clock_offsets alone, or following the join's estimate."""

MISSING_POLICIES = ("drop", "dead_letter", "wait")


def _finite_nonneg(name: str, value: Any, *, allow_zero: bool = True) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be finite and {bound}, got {value!r}")


def did_you_mean(name: Any, known: Iterable[str]) -> str:
    """The end of a message refusing name: '; did you mean X?' with the closest of known
    (difflib's), else '' (a name close to none, or not a string).

    Arguments:
        name: what was given, e.g. 'tolerence_ms'.
        known: the names taken.
    """
    if not isinstance(name, str):
        return ""
    close = difflib.get_close_matches(name, list(known), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def _refuse_unknown(what: str, data: Mapping[str, Any], known: Iterable[str]) -> None:
    known = tuple(known)
    for key in data:
        if key not in known:
            raise ValueError(f"unknown {what} field {key!r}{did_you_mean(key, known)}")


_Policy = TypeVar("_Policy", bound=msgspec.Struct)


def _as_dict(policy: msgspec.Struct) -> dict[str, Any]:
    """A policy's fields as a dict (msgspec.structs.asdict), a nested policy as its dict
    and a dict field copied, so the caller may edit what it gets. Values stay as they
    are (msgspec.to_builtins would refuse a numpy float the policy accepted)."""
    return {
        name: _as_dict(value) if isinstance(value, msgspec.Struct)
        else dict(value) if isinstance(value, dict) else value
        for name, value in msgspec.structs.asdict(policy).items()
    }


def _from_fields(cls: type[_Policy], data: Mapping[str, Any]) -> _Policy:
    """cls from a mapping of its (known) fields, through msgspec.convert, which takes a
    collect given as any mapping and a nested Backoff as it is; absent keys take
    defaults.

    Raises:
        ValueError: a value the policy's own checks refuse, in their words. msgspec
            checks a value's type before those checks run and says only which type it
            expected: a value it refuses is built as given instead, so that the checks
            name the field (or accept what they accept: a numpy float for a float).
    """
    try:
        return msgspec.convert(data, cls)
    except msgspec.ValidationError as error:
        if error.__cause__ is not None:  # __post_init__ refused it: its own error
            raise error.__cause__ from None
        return cls(**data)


class JoinPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """How a multi-parent node assembles its input groups.

    Attributes:
        mode: 'trace' joins halves of one originating message by trace id; 'time'
            fuses independent producers by event time.
        tolerance_ms: how far apart (ms) sync members of one time group may be; required
            in time mode.
        timeout_ms: the backstop for a parent that stopped: trace mode gives up on an
            incomplete group this long (wall ms) after it was seeded; time mode gives
            up on a missing parent once it has been silent this long (a parent whose
            event time has passed the group is given up on at once; one with input
            still waiting for the node, parked or on the broker, is not silent). None
            waits forever.
        missing: what happens to a group that times out below quorum: 'drop' evicts and
            counts it, 'dead_letter' terminates its halves against a dead letter, 'wait'
            never gives up.
        quorum: how many sync parents a timed-out group needs to be emitted with None for
            the missing ones; None means all of them (no partial emission).
        max_pending: incomplete groups held at once; beyond it the oldest is evicted.
            Also the sample capacity of each collect parent's buffer.
        collect: {parent: window_ms} for high-rate parents joined many-to-one: the group
            takes every sample within window_ms of its time (time mode only).
        max_drift_ms: event-time alignment (time mode only): the join stops taking input
            from a parent whose event time runs more than this ahead of its slowest live
            parent (one not ended and not silent past timeout_ms), and takes it again
            once the laggard catches up; what it holds back waits on the broker. None:
            DEFAULT_MAX_DRIFT_MS, or twice the tolerance or the widest collect window
            where that is more (drift_seconds). At least tolerance_ms and every collect
            window, which a group needs its members and samples to span.
        disorder_ms: how far (event-time ms) a parent's messages may arrive out of
            order (time mode only): a group gives up on a missing parent only once that
            parent's watermark has passed the group's time by tolerance_ms plus this,
            and a collect window closes this much later; a message no further behind
            its parent's watermark is not late. 0 takes every parent to send in event
            time order. A producer's output that had to be sent again (a receipt lost
            when a broker failed over) lands behind the outputs in flight after it,
            at most WINDOW_GROUPS (64) of them: 64 frame periods cover it, as the
            README's "Across hosts" says. It delays a group only while it lacks a
            parent or waits for a collect window.
        clock_offsets: {parent: seconds} added to that parent's event times before
            anything else reads them (time mode only): for a source whose clock is
            off by a constant (a camera without PTP, a driver stamping at readout),
            -0.0198 for one that reads 19.8 ms ahead. Matching, watermarks, the drift
            bound, collect windows and each group's event time all go by the
            corrected times; the node's entries carry them too.
        clock_correction: 'static' applies clock_offsets alone; 'running' also
            follows the join's own estimate of each parent's offset
            (videoflow.messaging.clock_estimates), a bounded step at a time: at most
            clock_step_ms per change, never more than clock_limit_ms in all, each
            change logged (time mode only).
        clock_step_ms / clock_limit_ms: those bounds.
    """

    mode: str = "trace"
    tolerance_ms: float | None = None
    timeout_ms: float | None = 5000.0
    missing: str = "drop"
    quorum: int | None = None
    max_pending: int = 1024
    collect: dict[str, float] = msgspec.field(default_factory=dict)
    max_drift_ms: float | None = None
    disorder_ms: float = 0.0
    clock_offsets: dict[str, float] = msgspec.field(default_factory=dict)
    clock_correction: str = "static"
    clock_step_ms: float = 2.0
    clock_limit_ms: float = 100.0

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
        if self.max_drift_ms is not None:
            if self.mode != "time":
                raise ValueError("max_drift_ms needs mode='time'")
            _finite_nonneg("max_drift_ms", self.max_drift_ms, allow_zero=False)
            spans = {"tolerance_ms": self.tolerance_ms or 0.0,
                     **{f"collect[{p!r}]": w for p, w in self.collect.items()}}
            for name, span in spans.items():
                if self.max_drift_ms < span:
                    raise ValueError(f"max_drift_ms {self.max_drift_ms!r} is below {name} "
                                     f"{span!r}: a group spans that much event time")

        _finite_nonneg("disorder_ms", self.disorder_ms)
        if self.disorder_ms and self.mode != "time":
            raise ValueError("disorder_ms needs mode='time'")
        if not isinstance(self.clock_offsets, dict):
            raise ValueError("clock_offsets must be a dict of parent -> seconds, got "
                             f"{self.clock_offsets!r}")
        if self.clock_offsets and self.mode != "time":
            raise ValueError("clock_offsets need mode='time'")
        for parent, offset in self.clock_offsets.items():
            if not isinstance(parent, str):
                raise ValueError(f"clock_offsets keys must be parent names, got {parent!r}")
            if isinstance(offset, bool) or not isinstance(offset, (int, float)) or (
                    not math.isfinite(offset)) or abs(offset) > MAX_CLOCK_OFFSET_S:
                raise ValueError(f"clock_offsets[{parent!r}] must be a finite number of "
                                 f"seconds within ±{MAX_CLOCK_OFFSET_S:g}, got {offset!r}")
        if self.clock_correction not in CLOCK_CORRECTIONS:
            raise ValueError(f"clock_correction must be one of {CLOCK_CORRECTIONS}, got "
                             f"{self.clock_correction!r}")
        if self.clock_correction != "static" and self.mode != "time":
            raise ValueError("clock_correction='running' needs mode='time'")
        _finite_nonneg("clock_step_ms", self.clock_step_ms, allow_zero=False)
        _finite_nonneg("clock_limit_ms", self.clock_limit_ms)
        if self.clock_limit_ms > MAX_CLOCK_OFFSET_S * 1000.0:
            raise ValueError(f"clock_limit_ms must be at most {MAX_CLOCK_OFFSET_S * 1000.0:g}, "
                             f"got {self.clock_limit_ms!r}")

    def drift_seconds(self) -> float | None:
        """The drift bound a time join aligns its parents by, in seconds (max_drift_ms,
        else its default); None in trace mode, which has no event time."""
        if self.mode != "time":
            return None
        if self.max_drift_ms is not None:
            return self.max_drift_ms / 1000.0
        widest = max(self.collect.values(), default=0.0)
        return max(DEFAULT_MAX_DRIFT_MS, 2.0 * (self.tolerance_ms or 0.0), 2.0 * widest) / 1000.0

    @classmethod
    def default_for(cls, flow_type: str) -> JoinPolicy:
        """The join policy a node of this flow type gets when it names none.

        Arguments:
            flow_type (str): REALTIME or BATCH.

        Returns:
            For REALTIME, trace mode, 2 s timeout, drop, 1024 pending (freshness first);
            for BATCH, trace mode, 10 min timeout, dead_letter, 100,000 pending
            (completeness).

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
        return _as_dict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JoinPolicy:
        """Builds a policy from a dict such as to_dict returns; absent keys take defaults.

        Raises:
            ValueError: naming the first unknown key (with the closest field, if one is
                close) or invalid field.
        """
        _refuse_unknown("JoinPolicy", data, cls.__struct_fields__)
        return _from_fields(cls, data)

    def sync_parents(self, parents: Iterable[str]) -> list[str]:
        """The parents that must each contribute one message per group (all but collect)."""
        return [p for p in parents if p not in self.collect]

    def validate_for(self, parents: Iterable[str]) -> list[str]:
        """Checks the policy against a node's parents and returns its sync parents.

        Raises:
            ValueError: naming the field: a collect parent that is not a parent (with the
                closest parent, if one is close), no sync parent, more than 64 sync
                parents, or a quorum above the sync count.
        """
        parents = list(parents)
        if len(set(parents)) != len(parents):
            raise ValueError(f"parents must be distinct, got {parents!r}")
        for name in self.collect:
            if name not in parents:
                raise ValueError(f"collect parent {name!r} is not a parent of this node"
                                 f"{did_you_mean(name, parents)}")
        for name in self.clock_offsets:
            if name not in parents:
                raise ValueError(f"clock_offsets names {name!r}, not a parent of this node"
                                 f"{did_you_mean(name, parents)}")
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


# --------------------------------------------------------------------------------------
# Delivery: what happens to an input whose processing raised.
# --------------------------------------------------------------------------------------


class PoisonMessage(VideoflowError):
    """Raised by node code when this input can never succeed: dead-letter it now.

    No retry is attempted, whatever the delivery mode or the attempts left; retrying
    a message that is wrong in itself only burns attempts on its way to the same place.
    """

    retryable = False


class WorkerFatal(VideoflowError):
    """Raised by node code when this worker is broken, not the message.

    The message is handed back to the broker without counting an attempt, so another
    (or a restarted) worker gets it with its retry budget intact.
    """

    retryable = True
    """Trying again can succeed elsewhere; the message itself is fine."""


DELIVERY_MODES = ("at_least_once", "best_effort")

RETRY = "retry"
DEAD_LETTER = "dead_letter"
NAK_UNCOUNTED = "nak_uncounted"
DROP = "drop"
ACTION_KINDS = (RETRY, DEAD_LETTER, NAK_UNCOUNTED, DROP)

POISON = "poison"
WORKER_FATAL = "worker_fatal"
TRANSIENT = "transient"

POISON_ERRORS: tuple[type[BaseException], ...] = (PoisonMessage, WireError, ValueError, TypeError)
"""Errors that say the input itself is bad, so no retry can help.

WireError (the envelope did not decode) is a ValueError; so are msgspec's DecodeError
and ValidationError, json.JSONDecodeError and UnicodeDecodeError, which is why the
builtin families cover them. KeyError, IndexError and AttributeError are deliberately
not poison: they are as often a bug or a state lookup in node code as a bad input, and
those deserve the retry budget.
"""

WORKER_FATAL_ERRORS: tuple[type[BaseException], ...] = (WorkerFatal, MemoryError)
"""Errors that say the worker is broken, not the message.

Beyond these, any BaseException that is not an Exception (KeyboardInterrupt,
SystemExit, asyncio.CancelledError) is worker-fatal too: the worker is stopping, and
the message did nothing wrong.
"""

_REASON_MAX_CHARS = 200
"""Reasons can travel in dead-letter headers; a huge exception text must not."""


def classify_error(error: BaseException) -> str:
    """Classifies a processing error as POISON, WORKER_FATAL or TRANSIENT.

    The first rule that matches wins:
      1. worker-fatal: a WorkerFatal, a MemoryError, or a BaseException that is not an
         Exception (the worker is stopping). First, because handing a message back loses
         nothing, while dead-lettering it because of a broken worker would.
      2. poison: a PoisonMessage (the user said so explicitly).
      3. transient: a VideoflowError whose ``retryable`` is True, even if it is also a
         ValueError: the error tree's own verdict beats its builtin base.
      4. poison: WireError, ValueError, TypeError (POISON_ERRORS).
      5. transient: anything else.

    Arguments:
        error (BaseException): the exception node code raised.

    Returns:
        One of POISON, WORKER_FATAL, TRANSIENT.

    Raises:
        TypeError: if error is not an exception instance.
    """
    if not isinstance(error, BaseException):
        raise TypeError(f"error must be an exception instance, got {error!r}")
    if isinstance(error, WORKER_FATAL_ERRORS) or not isinstance(error, Exception):
        return WORKER_FATAL
    if isinstance(error, PoisonMessage):
        return POISON
    if isinstance(error, VideoflowError) and error.retryable:
        return TRANSIENT
    if isinstance(error, POISON_ERRORS):
        return POISON
    return TRANSIENT


def _describe(error: BaseException) -> str:
    try:
        text = str(error)
    except Exception:  # a broken __str__ must not break the failure path
        text = "<str() failed>"
    if len(text) > _REASON_MAX_CHARS:
        text = text[: _REASON_MAX_CHARS - 3] + "..."
    name = type(error).__qualname__
    return f"{name}: {text}" if text else name


def _check_num_delivered(num_delivered: Any) -> None:
    if isinstance(num_delivered, bool) or not isinstance(num_delivered, int) or num_delivered < 1:
        raise ValueError(f"num_delivered must be an int >= 1 (1-based), got {num_delivered!r}")


class DeliveryAction(msgspec.Struct, frozen=True, kw_only=True):
    """The verdict DeliveryPolicy.action_for returns; the messenger only executes it.

    Attributes:
        kind: 'retry' (nak with ``delay``; the attempt counts), 'dead_letter' (publish a
            dead letter, then terminate), 'nak_uncounted' (hand the message back now
            without burning an attempt), 'drop' (terminate without a dead letter; the
            messenger counts the loss).
        delay: seconds to wait before redelivery; > 0 only for 'retry' with a non-zero
            backoff, 0.0 for every other kind.
        reason: a short human-readable cause, e.g. 'poison: WireError: truncated'.
    """

    kind: str
    delay: float = 0.0
    reason: str = ""

    def __post_init__(self) -> None:
        if self.kind not in ACTION_KINDS:
            raise ValueError(f"kind must be one of {ACTION_KINDS}, got {self.kind!r}")
        _finite_nonneg("delay", self.delay)
        if self.delay and self.kind != RETRY:
            raise ValueError(f"delay applies to 'retry' only, got {self.delay!r} for {self.kind!r}")
        if not isinstance(self.reason, str):
            raise ValueError(f"reason must be a str, got {self.reason!r}")


class Backoff(msgspec.Struct, frozen=True, kw_only=True):
    """Capped exponential backoff between redeliveries, without jitter.

    The delay after the n-th delivery failed (n = the broker's 1-based num_delivered) is
    ``min(max_ms, base_ms * factor ** (n - 1))`` milliseconds: base_ms after the first
    failure, growing by ``factor`` per delivery, never above max_ms. No jitter, so a
    verdict is a pure function of its inputs; competing consumers already spread retries.

    Attributes:
        base_ms: delay after the first failed delivery (>= 0; 0 disables waiting).
        factor: growth per further delivery (>= 1; 1 is a constant delay).
        max_ms: the cap (>= base_ms).
    """

    base_ms: float = 1000.0
    factor: float = 2.0
    max_ms: float = 60_000.0

    def __post_init__(self) -> None:
        _finite_nonneg("backoff.base_ms", self.base_ms)
        if isinstance(self.factor, bool) or not isinstance(self.factor, (int, float)):
            raise ValueError(f"backoff.factor must be a number, got {self.factor!r}")
        if not math.isfinite(self.factor) or self.factor < 1:
            raise ValueError(f"backoff.factor must be finite and >= 1, got {self.factor!r}")
        _finite_nonneg("backoff.max_ms", self.max_ms)
        if self.max_ms < self.base_ms:
            raise ValueError(
                f"backoff.max_ms must be >= backoff.base_ms ({self.base_ms!r}), "
                f"got {self.max_ms!r}"
            )

    def delay_for(self, num_delivered: int) -> float:
        """The wait before redelivering a message whose num_delivered-th delivery failed.

        Arguments:
            num_delivered (int): the broker's 1-based delivery count of the failed attempt.

        Returns:
            Seconds (float): ``min(max_ms, base_ms * factor ** (num_delivered - 1)) / 1000``.

        Raises:
            ValueError: if num_delivered is not an int >= 1.
        """
        _check_num_delivered(num_delivered)
        try:
            raw = self.base_ms * self.factor ** (num_delivered - 1)
        except OverflowError:
            # A huge delivery count (an uncapped durable) saturates rather than crashes.
            raw = math.inf
        return min(raw, self.max_ms) / 1000.0

    def to_dict(self) -> dict[str, Any]:
        """Returns the backoff as a plain dict that from_dict turns back into an equal one."""
        return _as_dict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Backoff:
        """Builds a backoff from a dict such as to_dict returns; absent keys take defaults.

        Arguments:
            data (Mapping): base_ms, factor, max_ms, each optional.

        Returns:
            The Backoff.

        Raises:
            ValueError: naming the first unknown key (with the closest field, if one is
                close) or invalid field.
        """
        if not isinstance(data, Mapping):
            raise ValueError(f"backoff must be a dict of base_ms/factor/max_ms, got {data!r}")
        _refuse_unknown("backoff", data, cls.__struct_fields__)
        return _from_fields(cls, data)


class DeliveryPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """What a node does with an input whose processing raised.

    Attributes:
        mode: 'at_least_once' retries transient failures with backoff, then dead-letters;
            'best_effort' never retries a transient failure: it drops it (counted).
        max_retries: redeliveries after the first delivery, at_least_once only. A message
            is tried at most 1 + max_retries times: with max_retries=3, deliveries 1, 2
            and 3 may fail and be retried, and a failure of delivery 4 dead-letters it.
            Ignored by best_effort (kept so that switching mode alone restores a budget).
        backoff: the delay before each retry (see Backoff).
    """

    mode: str = "at_least_once"
    max_retries: int = 3
    backoff: Backoff = msgspec.field(default_factory=Backoff)

    def __post_init__(self) -> None:
        if self.mode not in DELIVERY_MODES:
            raise ValueError(f"mode must be one of {DELIVERY_MODES}, got {self.mode!r}")
        if (
            isinstance(self.max_retries, bool)
            or not isinstance(self.max_retries, int)
            or self.max_retries < 0
        ):
            raise ValueError(f"max_retries must be an int >= 0, got {self.max_retries!r}")
        if not isinstance(self.backoff, Backoff):
            raise ValueError(f"backoff must be a Backoff, got {self.backoff!r}")

    @classmethod
    def default_for(cls, flow_type: str) -> DeliveryPolicy:
        """The delivery policy a node of this flow type gets when it names none.

        Arguments:
            flow_type (str): REALTIME or BATCH.

        Returns:
            For REALTIME, best_effort (a failed frame is dropped, not replayed late, for
            freshness); max_retries 3 and a 100 ms..2 s backoff apply if a node
            overrides the mode to at_least_once. For BATCH, at_least_once, max_retries
            3, backoff 1 s doubling up to 60 s (completeness).

        Raises:
            ValueError: for an unknown flow type.
        """
        if flow_type == REALTIME:
            return cls(
                mode="best_effort",
                max_retries=3,
                backoff=Backoff(base_ms=100.0, factor=2.0, max_ms=2000.0),
            )
        if flow_type == BATCH:
            return cls(
                mode="at_least_once",
                max_retries=3,
                backoff=Backoff(base_ms=1000.0, factor=2.0, max_ms=60_000.0),
            )
        raise ValueError(f"flow_type must be one of {FLOW_TYPES}, got {flow_type!r}")

    @property
    def max_deliveries(self) -> int:
        """How many times the broker may deliver one message, 1 + max_retries (1 for
        best_effort). A broker cap below this makes retries silently impossible."""
        return 1 + self.max_retries if self.mode == "at_least_once" else 1

    def to_dict(self) -> dict[str, Any]:
        """Returns the policy as a plain dict that from_dict turns back into an equal policy."""
        return _as_dict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DeliveryPolicy:
        """Builds a policy from a dict such as to_dict returns; absent keys take defaults.

        Arguments:
            data (Mapping): mode, max_retries, backoff (a dict, see Backoff.from_dict),
                each optional.

        Returns:
            The DeliveryPolicy.

        Raises:
            ValueError: naming the first unknown key (with the closest field, if one is
                close; backoff keys as 'backoff field') or invalid field.
        """
        _refuse_unknown("DeliveryPolicy", data, cls.__struct_fields__)
        fields = dict(data)
        if "backoff" in fields and not isinstance(fields["backoff"], Backoff):
            # Its own unknown keys and values are refused in its own words.
            fields["backoff"] = Backoff.from_dict(fields["backoff"])
        return _from_fields(cls, fields)

    def action_for(self, error: BaseException, num_delivered: int) -> DeliveryAction:
        """Decides what to do with a delivery whose processing raised ``error``.

        The error is classified by classify_error, then:
          - poison -> 'dead_letter' now, in either mode and on any attempt;
          - worker-fatal -> 'nak_uncounted', in either mode: the message goes back without
            burning an attempt (where the broker caps deliveries, only the durable's
            cap decides whether it can come back);
          - transient, at_least_once -> 'retry' with ``backoff.delay_for(num_delivered)``
            while num_delivered <= max_retries, 'dead_letter' once num_delivered >
            max_retries (1 + max_retries tries in all);
          - transient, best_effort -> 'drop' (never retried; the messenger counts it).

        Arguments:
            error (BaseException): what node code raised.
            num_delivered (int): the broker's 1-based delivery count of this attempt
                (JetStream's metadata.num_delivered): 1 on the first delivery.

        Returns:
            The DeliveryAction to execute.

        Raises:
            ValueError: if num_delivered is not an int >= 1.
            TypeError: if error is not an exception instance.
        """
        _check_num_delivered(num_delivered)
        category = classify_error(error)
        cause = _describe(error)
        if category == POISON:
            return DeliveryAction(kind=DEAD_LETTER, reason=f"poison: {cause}")
        if category == WORKER_FATAL:
            return DeliveryAction(kind=NAK_UNCOUNTED, reason=f"worker fatal: {cause}")
        if self.mode == "best_effort":
            return DeliveryAction(kind=DROP, reason=f"best effort, not retried: {cause}")
        if num_delivered > self.max_retries:
            return DeliveryAction(
                kind=DEAD_LETTER,
                reason=f"retries exhausted after {num_delivered} deliveries: {cause}",
            )
        return DeliveryAction(
            kind=RETRY,
            delay=self.backoff.delay_for(num_delivered),
            reason=f"transient, delivery {num_delivered} of {self.max_deliveries}: {cause}",
        )
