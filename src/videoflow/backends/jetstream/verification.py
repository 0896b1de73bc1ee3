"""Read-back verification: requested against effective configs, profile checks and
how a failed observation is reported."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, Final

from nats.js.api import (
    ConsumerConfig,
    DiscardPolicy,
    RetentionPolicy,
    StreamConfig,
)

from videoflow.backends.messaging import (
    LIVE_LATEST,
    PROFILES,
    RELIABLE_WORK,
    ProfileRequest,
    Unknown,
)
from videoflow.core.naming import (
    user_metadata,
)
from videoflow.errors import BrokerUnavailable, IncompatibleProfile, UnobservableState

logger = logging.getLogger(__name__)



# --------------------------------------------------------------------------------------
# Read-back verification
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class VerifiedStream:
    """What the broker holds after ensure_stream: the config that was asked for, the
    config read back (None when the read-back itself failed), and each requested field
    the two differ on, rendered 'field: requested X, effective Y'. Empty mismatches
    means the broker gave the flow exactly what it asked for."""

    requested: StreamConfig
    effective: StreamConfig | None
    mismatches: tuple[str, ...] = ()


@dataclass(frozen=True)
class VerifiedConsumer:
    """VerifiedStream's counterpart for a durable consumer."""

    requested: ConsumerConfig
    effective: ConsumerConfig | None
    mismatches: tuple[str, ...] = ()


STREAM_FIELDS: Final = (
    "name", "subjects", "retention", "discard", "max_msgs", "max_msgs_per_subject",
    "max_bytes", "max_age", "duplicate_window", "storage", "num_replicas", "metadata",
)
"""The StreamConfig fields a read-back compares (only those the request set)."""

CONSUMER_FIELDS: Final = (
    "durable_name", "filter_subject", "deliver_policy", "ack_policy", "replay_policy",
    "ack_wait", "max_deliver", "max_ack_pending", "inactive_threshold", "metadata",
)
"""The ConsumerConfig fields a read-back compares (only those the request set)."""

# Dataclass defaults that mean "server default", not a request.
_UNREQUESTED_DEFAULTS: Final[Mapping[str, Any]] = {
    "duplicate_window": 0,
    "max_msgs_per_subject": -1,
}


def _plain(value: Any) -> Any:
    """A comparable form: enums to their value (read-backs carry plain str; S17), lists
    elementwise, durations as floats (ack_wait 60 reads back as 60.0)."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def _render(value: Any) -> str:
    value = value.value if isinstance(value, Enum) else value
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, (list, tuple)):
        return repr([_render_scalar(v) for v in value])
    return repr(value)


def _render_scalar(value: Any) -> Any:
    return value.value if isinstance(value, Enum) else value


def _mismatches(
    requested: StreamConfig | ConsumerConfig,
    effective: StreamConfig | ConsumerConfig,
    compared: Sequence[str],
) -> tuple[str, ...]:
    """The requested fields the effective config does not honour, each rendered
    'field: requested X, effective Y'.

    Only fields the request set take part (not None, and not a dataclass default that
    means "server default"), so server-filled values never count. Enums compare by
    value, since read-backs carry plain str (NATS_FACTS S17). metadata is a subset
    check over the user keys: the server adds _nats.* keys of its own (S7).
    """
    found: list[str] = []
    for name in compared:
        want = getattr(requested, name, None)
        if want is None or (
            name in _UNREQUESTED_DEFAULTS and want == _UNREQUESTED_DEFAULTS[name]
        ):
            continue
        got = getattr(effective, name, None)
        if name == "metadata":
            have = user_metadata(got)
            absent = {k: v for k, v in user_metadata(want).items() if have.get(k) != v}
            if absent:
                found.append(
                    f"metadata: requested {absent!r}, effective "
                    f"{ {k: have.get(k) for k in absent}!r}"
                )
            continue
        if _plain(want) != _plain(got):
            found.append(f"{name}: requested {_render(want)}, effective {_render(got)}")
    return tuple(found)


def stream_mismatches(requested: StreamConfig, effective: StreamConfig) -> tuple[str, ...]:
    """_mismatches over STREAM_FIELDS: what VerifiedStream.mismatches holds."""
    return _mismatches(requested, effective, STREAM_FIELDS)


def consumer_mismatches(
    requested: ConsumerConfig, effective: ConsumerConfig
) -> tuple[str, ...]:
    """_mismatches over CONSUMER_FIELDS: what VerifiedConsumer.mismatches holds."""
    return _mismatches(requested, effective, CONSUMER_FIELDS)


def _enum_value(value: Any) -> str | None:
    # S17: read-backs carry 'limits', not RetentionPolicy.LIMITS; compare the value.
    if value is None:
        return None
    if isinstance(value, Enum):
        value = value.value
    return str(value).lower()


def _bounded(value: Any, *, zero_is_unbounded: bool) -> bool:
    if value is None or isinstance(value, bool):
        return False
    if not isinstance(value, (int, float)):
        return False
    return value > 0 if zero_is_unbounded else value >= 0


def profile_mismatches(profile: str, effective: StreamConfig) -> tuple[str, ...]:
    """The ways a stream's effective configuration contradicts a messaging profile — the
    semantic half of a read-back, beside the field-level _mismatches.

    A field can match the request and still not carry the profile (the request asked
    for the wrong shape), and a stream nobody here provisioned can carry the profile
    with fields no request ever set (a byte limit instead of a message limit), so the
    two checks are separate. Each finding reads '<field>: <effective value> <what that
    means>'; empty means the stream carries the profile.

    reliable_work needs retention that keeps a message until it is acknowledged
    (INTEREST or WORK_QUEUE) and DiscardPolicy.NEW at the limit — OLD on a full stream
    evicts an unacknowledged message, which is exactly the loss the profile forbids.
    live_latest needs LIMITS retention, DiscardPolicy.OLD (the freshest message wins)
    and a bound on the backlog (max_msgs, max_bytes or max_age), or "latest" is
    whatever fits on the disk. durable_control and replay_archive are not stream-level
    promises on JetStream (the planner rejects them before a stream exists), so they
    have no findings here.

    Arguments:
        profile (str): one of backends.messaging.PROFILES.
        effective (StreamConfig): the configuration read back from the broker.

    Returns:
        The findings, in field order (retention, discard, backlog bound).

    Raises:
        ValueError: for an unknown profile.
    """
    if profile not in PROFILES:
        raise ValueError(f"profile must be one of {sorted(PROFILES)}, got {profile!r}")
    retention = _enum_value(effective.retention) or RetentionPolicy.LIMITS.value
    discard = _enum_value(effective.discard) or DiscardPolicy.OLD.value
    found: list[str] = []
    if profile == RELIABLE_WORK:
        if retention not in (RetentionPolicy.INTEREST.value, RetentionPolicy.WORK_QUEUE.value):
            found.append(
                f"retention: {retention} does not keep a message until it is acknowledged"
            )
        if discard != DiscardPolicy.NEW.value:
            found.append(
                f"discard: {discard} evicts an unacknowledged message when the stream is full"
            )
    elif profile == LIVE_LATEST:
        if retention != RetentionPolicy.LIMITS.value:
            found.append(
                f"retention: {retention} holds messages for consumers instead of keeping "
                "the latest"
            )
        if discard != DiscardPolicy.OLD.value:
            found.append(
                f"discard: {discard} refuses the freshest message when the stream is full"
            )
        if not (
            _bounded(effective.max_msgs, zero_is_unbounded=True)
            or _bounded(effective.max_bytes, zero_is_unbounded=True)
            or _bounded(effective.max_age, zero_is_unbounded=True)
        ):
            found.append(
                f"max_msgs: {_render(effective.max_msgs)} with max_bytes "
                f"{_render(effective.max_bytes)} and max_age {_render(effective.max_age)} "
                "leaves the backlog unbounded: 'latest' is whatever fits on the disk"
            )
    return tuple(found)


# --------------------------------------------------------------------------------------
# Profile verification
# --------------------------------------------------------------------------------------


def _who(request: ProfileRequest) -> str:
    return f" (requested by {request.requested_by})" if request.requested_by else ""


def verify_channel_profiles(
    read_back: Mapping[str, VerifiedStream | Unknown],
    requests: Sequence[ProfileRequest],
    *,
    unknown_is_fatal: bool,
    where: str,
    config_mismatches: bool = False,
) -> None:
    """Bind explicit profile requests to what the broker actually holds.

    For every request whose channel was read back: a stream whose effective
    configuration contradicts the profile (profile_mismatches) is a definite rejection;
    a stream that does not exist is a broker problem (provisioning has not run, or ran
    against another run id); a stream that could not be observed is fatal only when
    unknown_is_fatal — an explicit request must not pass on an unread guarantee — and a
    logged warning otherwise. Requests for channels the caller did not read back are not
    this caller's to judge.

    Every request is judged before anything is raised; when several fail, the most
    definite verdict wins (IncompatibleProfile, then BrokerUnavailable, then
    UnobservableState), for the first request in order that earned it. A VerifiedStream
    whose read-back failed (effective None) counts as unobserved.

    Arguments:
        read_back: node name -> VerifiedStream or Unknown (read_back_streams).
        requests: the explicit profile requests.
        unknown_is_fatal: whether an unobservable stream fails the check.
        where: provision / worker <node>, for the message.
        config_mismatches: also count the field-level VerifiedStream.mismatches (a
            num_replicas below the requested count, a clamped limit). The provision
            entrypoint knows the full request and passes True; a worker, which does not
            know the replica count asked for, judges the profile only.

    Raises:
        IncompatibleProfile: a stream definitely does not carry its requested profile.
        BrokerUnavailable: a requested channel's stream does not exist.
        UnobservableState: a requested channel could not be read back and
            unknown_is_fatal.
    """
    incompatible: IncompatibleProfile | None = None
    missing: BrokerUnavailable | None = None
    unobservable: UnobservableState | None = None
    for request in requests:
        if request.channel not in read_back:
            continue  # not this caller's to judge
        entry = read_back[request.channel]
        subject = (
            f"{where}: channel {request.channel!r}, profile {request.profile!r}{_who(request)}"
        )
        if isinstance(entry, Unknown) and entry.reason == "missing":
            if missing is None:
                missing = BrokerUnavailable(
                    f"{subject}: its stream does not exist ({entry.detail or 'missing'}); "
                    "provisioning has not run, or ran against another run id"
                )
            continue
        if isinstance(entry, Unknown) or entry.effective is None:
            if isinstance(entry, Unknown):
                reason, detail = entry.reason, entry.detail
            else:
                reason, detail = "unread", "; ".join(entry.mismatches)
            text = f"{subject}: the stream could not be read back ({reason}: {detail})"
            if not unknown_is_fatal:
                logger.warning("%s; the profile is not verified", text)
            elif unobservable is None:
                unobservable = UnobservableState(
                    f"{text}; an explicit profile request cannot pass on an unread guarantee",
                    reason=reason,
                    detail=detail,
                )
            continue
        findings = list(profile_mismatches(request.profile, entry.effective))
        if config_mismatches:
            findings.extend(entry.mismatches)
        if findings and incompatible is None:
            incompatible = IncompatibleProfile(
                f"{subject}: the stream does not carry the profile: {'; '.join(findings)}",
                channel=request.channel,
                profile=request.profile,
                findings=tuple(findings),
            )
    for verdict in (incompatible, missing, unobservable):
        if verdict is not None:
            raise verdict

