"""The values the messaging contract trades in: ids, specs, traffic, outcomes, observations.

Everything here is a frozen, slotted dataclass validated at construction, so a value
that exists is a value that makes sense; the per-message records have builders for the
code that made their values itself (trusted_delivery, trusted_envelope,
trusted_accepted), which skip the checks. Nothing here talks to a broker. Import them
from ``videoflow.backends.messaging``, which re-exports this module beside the
abstract ``MessagingBackend``.

Outcomes and observations are closed unions of distinct types, never flags or
sentinels: callers match on the type (``isinstance`` or ``match``). An observation is
``Known(value)`` or ``Unknown(reason)`` (videoflow.observation, on the ground floor so
the broker floor can answer in them; re-exported by ``videoflow.backends.messaging``).

Over ~700 lines, as one module: it is the contract's vocabulary, about forty small
types each with its validation and docstring, read together with
videoflow.backends.messaging; split by kind, each part would be imported beside all the
others everywhere.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Literal, TypeAlias

from videoflow.observation import Known, Unknown
from videoflow.wire.packs import encode_pack

DUPLICATE_WINDOW_SECONDS: Final = 120.0
"""How long the broker remembers a Nats-Msg-Id for publish deduplication."""

DLQ_RETENTION_SECONDS: Final = 7 * 24 * 3600
"""How long dead letters are retained (STREAM-8), the forensic and replay horizon a dead
letter's payload obligation must cover too (BLOB-14 step 3)."""


# ---------------------------------------------------------------------------- profiles

RELIABLE_WORK = "reliable_work"
"""Keep every message until it is acknowledged (INTEREST or WORK_QUEUE retention) and
refuse new messages at the limit (DiscardPolicy.NEW): a full stream never evicts
unacknowledged work. A stream-level promise on JetStream."""

LIVE_LATEST = "live_latest"
"""The freshest message wins: LIMITS retention, DiscardPolicy.OLD and a bounded backlog
(max_msgs, max_bytes or max_age). A stream-level promise on JetStream."""

DURABLE_CONTROL = "durable_control"
"""Control traffic that must survive a restart. Not a stream-level promise on
JetStream: the planner rejects it before a stream exists."""

REPLAY_ARCHIVE = "replay_archive"
"""An archive a run can be replayed from. Not a stream-level promise on JetStream:
the planner rejects it before a stream exists."""

PROFILES: frozenset[str] = frozenset({RELIABLE_WORK, LIVE_LATEST, DURABLE_CONTROL, REPLAY_ARCHIVE})
"""Every messaging profile name."""

STREAM_PROFILES: frozenset[str] = frozenset({RELIABLE_WORK, LIVE_LATEST})
"""The profiles a JetStream stream's configuration can carry (and profile_mismatches
judges); the others have no stream-level meaning there."""

Kind = Literal["data", "eos"]
KINDS: frozenset[str] = frozenset({"data", "eos"})

EnvelopeKind = Literal["data", "eos", "dlq"]
ENVELOPE_KINDS: frozenset[str] = KINDS | {"dlq"}
"""What an envelope can be published as: a channel's data or end-of-stream marker, or
a dead letter ('dlq') of the channel's node, bound for the flow's dead-letter stream
(STREAM-8). Nobody subscribes to a node's dead letters, so SubscriptionId keeps KINDS."""

def _require_text(owner: str, name: str, value: object) -> None:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{owner}.{name} must be a non-empty string, got {value!r}")


def _require_int(owner: str, name: str, value: object, minimum: int) -> None:
    # bool is an int subclass; True as a sequence number is a bug, not a 1.
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{owner}.{name} must be an int >= {minimum}, got {value!r}")


def _require_seconds(owner: str, name: str, value: object, *, positive: bool) -> None:
    ok = (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and (value > 0 if positive else value >= 0)
    )
    if not ok:
        bound = "> 0" if positive else ">= 0"
        raise ValueError(f"{owner}.{name} must be a finite number {bound}, got {value!r}")


def _require_profile(owner: str, profile: object) -> None:
    if profile not in PROFILES:
        raise ValueError(f"{owner}.profile must be one of {sorted(PROFILES)}, got {profile!r}")


# ------------------------------------------------------------------------------- ids


@dataclass(frozen=True, slots=True)
class ChannelId:
    """One node's output channel within one run.

    Arguments:
        flow / run / node: the flow id, run id and producing node's name.
    """

    flow: str
    run: str
    node: str

    def __post_init__(self) -> None:
        for name in ("flow", "run", "node"):
            _require_text("ChannelId", name, getattr(self, name))


@dataclass(frozen=True, slots=True)
class SubscriptionId:
    """One consumer's subscription to a parent channel.

    Arguments:
        consumer: the consuming node's name.
        channel: the parent channel it reads.
        kind: 'data' or 'eos' (end-of-stream markers travel on their own subject).
        replica: the replica a partitioned durable belongs to; None for a shared
            (competing-consumer) durable.
    """

    consumer: str
    channel: ChannelId
    kind: Kind = "data"
    replica: int | None = None

    def __post_init__(self) -> None:
        _require_text("SubscriptionId", "consumer", self.consumer)
        if not isinstance(self.channel, ChannelId):
            raise ValueError(f"SubscriptionId.channel must be a ChannelId, got {self.channel!r}")
        if self.kind not in KINDS:
            raise ValueError(f"SubscriptionId.kind must be 'data' or 'eos', got {self.kind!r}")
        if self.replica is not None:
            _require_int("SubscriptionId", "replica", self.replica, 0)


# ----------------------------------------------------------------------------- specs


@dataclass(frozen=True, slots=True)
class ChannelSpec:
    """What a node's output channel must provide.

    Arguments:
        channel: the channel.
        profile: one of PROFILES.
        required: subscriptions that must exist before anything is published (under
            INTEREST retention a message nobody is subscribed to is discarded).
        realtime_buffer: backlog bound of a REALTIME channel, in messages per subject:
            the freshest data messages kept, and room for as many end markers (so at
            least the publishing node's replica count).
        batch_max_msgs: message limit of a BATCH channel.
        replicas: copies a replicated broker keeps (STREAM-14).
        max_bytes: storage cap, or None for none.
    """

    channel: ChannelId
    profile: str
    required: tuple[SubscriptionId, ...] = ()
    realtime_buffer: int = 1
    batch_max_msgs: int = 10000
    replicas: int = 1
    max_bytes: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.channel, ChannelId):
            raise ValueError(f"ChannelSpec.channel must be a ChannelId, got {self.channel!r}")
        _require_profile("ChannelSpec", self.profile)
        required = tuple(self.required)
        for sub in required:
            if not isinstance(sub, SubscriptionId) or sub.channel != self.channel:
                raise ValueError(f"ChannelSpec.required: {sub!r} does not read {self.channel!r}")
        object.__setattr__(self, "required", required)
        _require_int("ChannelSpec", "realtime_buffer", self.realtime_buffer, 1)
        _require_int("ChannelSpec", "batch_max_msgs", self.batch_max_msgs, 1)
        _require_int("ChannelSpec", "replicas", self.replicas, 1)
        if self.max_bytes is not None:
            _require_int("ChannelSpec", "max_bytes", self.max_bytes, 1)


@dataclass(frozen=True, slots=True)
class SubscriptionSpec:
    """How a subscription is bound.

    Arguments:
        id: the subscription.
        ack_wait_seconds: the lease a delivery holds before the broker redelivers it.
        max_deliver: the broker's delivery cap; -1 when the runtime ledger enforces
            the retry budget instead (the broker then never strands a message).
        credit: broker-side max_ack_pending (STREAM-15; MSG-017: provisioned credit
            equals bound credit).
        byte_credit: the most unsettled bytes, 0 for no byte bound (RUN-025).
    """

    id: SubscriptionId
    ack_wait_seconds: float
    max_deliver: int
    credit: int
    byte_credit: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.id, SubscriptionId):
            raise ValueError(f"SubscriptionSpec.id must be a SubscriptionId, got {self.id!r}")
        _require_seconds("SubscriptionSpec", "ack_wait_seconds", self.ack_wait_seconds,
                         positive=True)
        if self.max_deliver != -1:
            _require_int("SubscriptionSpec", "max_deliver (or -1)", self.max_deliver, 1)
        _require_int("SubscriptionSpec", "credit", self.credit, 1)
        _require_int("SubscriptionSpec", "byte_credit", self.byte_credit, 0)


@dataclass(frozen=True, slots=True)
class ProfileRequest:
    """An explicit request that a channel carry a messaging profile, judged against
    what the broker actually holds (topology.verify_channel_profiles).

    Arguments:
        channel: the producing node's name — the key its stream is read back under.
        profile: one of PROFILES.
        requested_by: who asked (a node name, 'provision'), for the error message;
            optional.
    """

    channel: str
    profile: str
    requested_by: str = ""

    def __post_init__(self) -> None:
        _require_text("ProfileRequest", "channel", self.channel)
        _require_profile("ProfileRequest", self.profile)
        if not isinstance(self.requested_by, str):
            raise ValueError(f"ProfileRequest.requested_by must be a string, got "
                             f"{self.requested_by!r}")

    @property
    def stream_level(self) -> bool:
        """Whether a JetStream stream's configuration can carry this profile at all."""
        return self.profile in STREAM_PROFILES


# --------------------------------------------------------------------------- traffic


# The per-message records below are built without their constructors' checks where
# the values come from code that has already made them (trusted_delivery,
# trusted_envelope, trusted_accepted):
# the checks cost about half of each record, paid per message in every node (a
# Delivery and its token 2.6 -> 1.2 us, measured, Python 3.11).
_new = object.__new__
_set = object.__setattr__


@dataclass(frozen=True, slots=True)
class Envelope:
    """One message to publish: encoded envelope bytes bound for a channel's subject.

    Arguments:
        channel: where it goes (for a dead letter: the node that gave up on an input).
        kind: 'data', 'eos' or 'dlq' (ENVELOPE_KINDS).
        data: the encoded envelope (named ``data``, not ``bytes``, so no builtin is
            shadowed).
        msg_id: the broker's deduplication id (Nats-Msg-Id; MSGID-5/6), or None.
        traceparent: its W3C trace context (videoflow.messaging.tracing), sent as the
            message's ``traceparent`` header, or None for none.
        subject: a subject outside the flow's to publish data on instead of the
            channel's (a sink writing a plain subject a stream captures: data is then
            the payload as its readers take it, not an envelope); None: the channel's.
        headers: further headers to send with it (an external publication's), or None.
        packable: it may travel in one broker message with the packable data
            envelopes published next to it on its subject (a pack:
            videoflow.wire.packs), which its publisher allows only where no id is
            ever minted again for a retry of the output (a live producer's). An
            adapter may send it alone; its receipt is the pack's outcome.
    """

    channel: ChannelId
    kind: EnvelopeKind
    data: bytes
    msg_id: str | None = None
    traceparent: str | None = None
    subject: str | None = None
    headers: Mapping[str, str] | None = None
    packable: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.channel, ChannelId):
            raise ValueError(f"Envelope.channel must be a ChannelId, got {self.channel!r}")
        if self.kind not in ENVELOPE_KINDS:
            raise ValueError(f"Envelope.kind must be 'data', 'eos' or 'dlq', got {self.kind!r}")
        if not isinstance(self.data, bytes):
            raise ValueError(f"Envelope.data must be bytes, got {type(self.data).__name__}")
        if self.msg_id is not None:
            _require_text("Envelope", "msg_id", self.msg_id)
        if self.subject is not None:
            _require_text("Envelope", "subject", self.subject)
            if self.kind != "data" or any(c in self.subject for c in " \t\r\n*>"):
                raise ValueError(f"Envelope.subject must be a subject without spaces or "
                                 f"wildcards, for data, got {self.subject!r} ({self.kind})")
        if self.headers is not None and not all(
                isinstance(k, str) and isinstance(v, str) for k, v in self.headers.items()):
            raise ValueError(f"Envelope.headers must map str to str, got {self.headers!r}")

    @property
    def size(self) -> int:
        """Envelope bytes, as counted against byte credit."""
        return len(self.data)


def trusted_envelope(channel: ChannelId, data: bytes, msg_id: str, traceparent: str | None,
                     packable: bool = False) -> Envelope:
    """A data Envelope for the channel's own subject, unchecked: for a messenger that
    encoded data (bytes) and made msg_id (non-empty text) and traceparent itself.

    Returns:
        what Envelope(channel, 'data', data, msg_id, traceparent, packable=packable)
        would be.
    """
    envelope = _new(Envelope)
    _set(envelope, "channel", channel)
    _set(envelope, "kind", "data")
    _set(envelope, "data", data)
    _set(envelope, "msg_id", msg_id)
    _set(envelope, "traceparent", traceparent)
    _set(envelope, "subject", None)
    _set(envelope, "headers", None)
    _set(envelope, "packable", packable)
    return envelope


def pack_envelope(envelopes: Sequence[Envelope]) -> Envelope:
    """One envelope carrying envelopes, of one channel's data, as a pack
    (videoflow.wire.packs), in order: its id is the first one's with ``+{count}``, so
    the same outputs packed again carry the same id, and the broker's duplicate window
    fences the pack as it fences each of them.

    Raises:
        ValueError: no envelopes.
    """
    if not envelopes:
        raise ValueError("a pack has at least one member")
    first = envelopes[0]
    pack_id = f"{first.msg_id}+{len(envelopes)}"
    return Envelope(first.channel, "data", encode_pack(
        pack_id, [e.data for e in envelopes], [e.traceparent for e in envelopes]), pack_id)


@dataclass(frozen=True, slots=True)
class DeliveryToken:
    """The handle a receiver settles a delivery by. Equal tokens name the same attempt
    of the same message on the same binding; a redelivery (higher attempt) or a rebind
    (higher generation) makes an earlier token stale (MSG-011).

    Arguments:
        subscription: the subscription it came through.
        stream_seq: the message's stream sequence.
        attempt: the broker's delivery count for this attempt (1 for the first).
        generation: which binding of the subscription handed it out.
    """

    subscription: SubscriptionId
    stream_seq: int
    attempt: int
    generation: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.subscription, SubscriptionId):
            raise ValueError(f"DeliveryToken.subscription must be a SubscriptionId, got "
                             f"{self.subscription!r}")
        _require_int("DeliveryToken", "stream_seq", self.stream_seq, 1)
        _require_int("DeliveryToken", "attempt", self.attempt, 1)
        _require_int("DeliveryToken", "generation", self.generation, 0)

    def __hash__(self) -> int:
        # Equal tokens have equal sequences, attempts and generations, so this agrees
        # with ==. The subscription is left out: the tokens of one set or dict come
        # through one subscription or a few, and hashing it (and its channel) made a
        # token's hash five times dearer, paid twice per delivery (held, let go).
        return hash((self.stream_seq, self.attempt, self.generation))


@dataclass(frozen=True, slots=True)
class Delivery:
    """One received message.

    Arguments:
        token: what to settle it by.
        data: the encoded envelope.
        num_delivered: the broker's delivery count (equals token.attempt).
        stream_seq: the message's stream sequence (equals token.stream_seq).
        traceparent: the W3C trace context it was published with (its
            ``traceparent`` header), or None when it carried none.
    """

    token: DeliveryToken
    data: bytes
    num_delivered: int
    stream_seq: int
    traceparent: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.token, DeliveryToken):
            raise ValueError(f"Delivery.token must be a DeliveryToken, got {self.token!r}")
        if not isinstance(self.data, bytes):
            raise ValueError(f"Delivery.data must be bytes, got {type(self.data).__name__}")
        if self.num_delivered != self.token.attempt or self.stream_seq != self.token.stream_seq:
            raise ValueError("Delivery.num_delivered/stream_seq must agree with its token")

    @property
    def size(self) -> int:
        """Envelope bytes, as counted against byte credit (RUN-025)."""
        return len(self.data)


def trusted_delivery(subscription: SubscriptionId, stream_seq: int, attempt: int,
                     generation: int, data: bytes, traceparent: str | None) -> Delivery:
    """A Delivery and its token as a backend hands them out, unchecked: for a backend
    that read stream_seq and attempt (ints >= 1) off the broker's delivery, with its
    data (bytes).

    Returns:
        what Delivery(DeliveryToken(subscription, stream_seq, attempt, generation),
        data, attempt, stream_seq, traceparent) would be.
    """
    token = _new(DeliveryToken)
    _set(token, "subscription", subscription)
    _set(token, "stream_seq", stream_seq)
    _set(token, "attempt", attempt)
    _set(token, "generation", generation)
    delivery = _new(Delivery)
    _set(delivery, "token", token)
    _set(delivery, "data", data)
    _set(delivery, "num_delivered", attempt)
    _set(delivery, "stream_seq", stream_seq)
    _set(delivery, "traceparent", traceparent)
    return delivery


# ------------------------------------------------------------------ publish outcomes


@dataclass(frozen=True, slots=True)
class Accepted:
    """The broker stored the message (or already had it: duplicate)."""

    stream_seq: int
    duplicate: bool = False

    def __post_init__(self) -> None:
        _require_int("Accepted", "stream_seq", self.stream_seq, 1)


def trusted_accepted(stream_seq: int, duplicate: bool) -> Accepted:
    """Accepted, unchecked: for a backend that read stream_seq (an int >= 1) off the
    broker's acknowledgement.

    Returns:
        what Accepted(stream_seq, duplicate) would be.
    """
    outcome = _new(Accepted)
    _set(outcome, "stream_seq", stream_seq)
    _set(outcome, "duplicate", duplicate)
    return outcome


@dataclass(frozen=True, slots=True)
class Rejected:
    """The broker definitely refused the message. retryable says whether waiting can
    help (a full BATCH stream) or not (no stream captures the subject)."""

    reason: str
    retryable: bool

    def __post_init__(self) -> None:
        _require_text("Rejected", "reason", self.reason)


@dataclass(frozen=True, slots=True)
class PublicationUnknown:
    """The send happened but no receipt arrived in time: stored or not, nobody knows
    (MSG-014: a lost receipt is never a rejection). Resolve with observe_publication."""

    reason: str

    def __post_init__(self) -> None:
        _require_text("PublicationUnknown", "reason", self.reason)


@dataclass(frozen=True, slots=True)
class PublicationUnresolvable:
    """An unknown publication can no longer be resolved (outside the broker's duplicate
    window): whether it was stored will never be known."""

    reason: str = ""


PublishOutcome: TypeAlias = Accepted | Rejected | PublicationUnknown | PublicationUnresolvable

# ------------------------------------------------------------------ settle outcomes


@dataclass(frozen=True, slots=True)
class Completed:
    """The delivery was processed: acknowledge it (and confirm the acknowledgement)."""


@dataclass(frozen=True, slots=True)
class Retry:
    """Hand the delivery back for another attempt after delay seconds."""

    delay: float = 0.0

    def __post_init__(self) -> None:
        _require_seconds("Retry", "delay", self.delay, positive=False)


@dataclass(frozen=True, slots=True)
class Terminal:
    """Never deliver again. Only against a durable record of the message — a dead
    letter's reference — so nothing is terminated without a trace (DELIV-15)."""

    record_ref: str

    def __post_init__(self) -> None:
        if not isinstance(self.record_ref, str) or not self.record_ref.strip():
            raise ValueError(
                "Terminal requires a non-empty record_ref: a delivery is terminated only "
                f"against a durable record (DELIV-15), got {self.record_ref!r}"
            )


SettleOutcome: TypeAlias = Completed | Retry | Terminal


@dataclass(frozen=True, slots=True)
class SettleConfirmed:
    """The broker confirmed the settlement."""


@dataclass(frozen=True, slots=True)
class SettleUnknown:
    """The settlement was sent but not confirmed; a payload obligation must not be
    released on it (PAY-004)."""

    reason: str

    def __post_init__(self) -> None:
        _require_text("SettleUnknown", "reason", self.reason)


@dataclass(frozen=True, slots=True)
class SettleStale:
    """The token was superseded (a newer attempt or binding exists); nothing was sent
    to the broker (MSG-011)."""

    reason: str = ""


SettleResult: TypeAlias = SettleConfirmed | SettleUnknown | SettleStale

# ----------------------------------------------------------------------- observations
# Known and Unknown themselves live on the ground floor (videoflow.observation).

LeaseState = Literal["extended", "stale", "unknown"]


def _require_counts(owner: str, value: object, names: tuple[str, ...]) -> None:
    for name in names:
        _require_int(owner, name, getattr(value, name), 0)


def _require_names(owner: str, name: str, value: Iterable[str]) -> tuple[str, ...]:
    if isinstance(value, str):  # a lone name would otherwise become its characters
        raise ValueError(f"{owner}.{name} must be a sequence of names, got {value!r}")
    names = tuple(value)
    for item in names:
        _require_text(owner, name, item)
    return names


@dataclass(frozen=True, slots=True)
class MessagingCapabilities:
    """What a broker offers. Parts that need a read-back are observations: Unknown
    ('unread') until the backend has read them.

    Arguments:
        backend: the adapter's name ('memory', 'jetstream').
        profiles: the profiles a channel of this backend can promise.
        durable: whether messages outlive the process (False for memory).
        max_payload: the largest message the broker takes, in bytes.
        replicas: copies the broker keeps of a channel.
        storage: 'file' or 'memory'.
    """

    backend: str
    profiles: frozenset[str]
    durable: bool
    max_payload: Known[int] | Unknown = Unknown("unread")
    replicas: Known[int] | Unknown = Unknown("unread")
    storage: Known[str] | Unknown = Unknown("unread")

    def __post_init__(self) -> None:
        _require_text("MessagingCapabilities", "backend", self.backend)
        profiles = frozenset(self.profiles)
        for profile in profiles:
            _require_profile("MessagingCapabilities", profile)
        object.__setattr__(self, "profiles", profiles)
        for name in ("max_payload", "replicas", "storage"):
            if not isinstance(getattr(self, name), (Known, Unknown)):
                raise ValueError(f"MessagingCapabilities.{name} must be Known or Unknown")


@dataclass(frozen=True, slots=True)
class VerifiedChannel:
    """A channel as read back after ensure_channel — never "already exists" on trust.

    Arguments:
        spec: what was asked for.
        name: the broker's name for it (the stream).
        created: whether this call created it (False: it existed and was inspected).
        mismatches: requested fields the broker does not honour, each
            '<field>: <effective> ...'; empty when every field is honoured.
    """

    spec: ChannelSpec
    name: str
    created: bool = False
    mismatches: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _require_text("VerifiedChannel", "name", self.name)
        object.__setattr__(self, "mismatches",
                           _require_names("VerifiedChannel", "mismatches", self.mismatches))

    @property
    def honoured(self) -> bool:
        """Whether the broker honours every requested field."""
        return not self.mismatches


@dataclass(frozen=True, slots=True)
class VerifiedSubscription:
    """A subscription as read back after ensure_subscription.

    Arguments:
        spec: what was asked for.
        name: the broker's name for it (the durable).
        generation: this binding's generation; tokens it hands out carry it.
        created: whether this call created the durable.
        mismatches: requested fields the broker does not honour (a credit other than
            the one provisioned is one: MSG-017).
    """

    spec: SubscriptionSpec
    name: str
    generation: int = 0
    created: bool = False
    mismatches: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _require_text("VerifiedSubscription", "name", self.name)
        _require_int("VerifiedSubscription", "generation", self.generation, 0)
        object.__setattr__(self, "mismatches",
                           _require_names("VerifiedSubscription", "mismatches", self.mismatches))

    @property
    def honoured(self) -> bool:
        """Whether the broker honours every requested field."""
        return not self.mismatches


@dataclass(frozen=True, slots=True)
class ChannelObservation:
    """A channel's state: its first and last stream sequence, how many messages it
    holds, and its retention ('limits', 'interest', 'workqueue', ...)."""

    first_seq: int
    last_seq: int
    messages: int
    retention: str

    def __post_init__(self) -> None:
        _require_counts("ChannelObservation", self, ("first_seq", "last_seq", "messages"))
        _require_text("ChannelObservation", "retention", self.retention)


@dataclass(frozen=True, slots=True)
class SubscriptionObservation:
    """A subscription's work as the broker (and the ledger, via mark_exhausted) sees it.

    Arguments:
        available: messages not yet delivered.
        leased: delivered and not yet settled.
        unresolved: retained but exhausted — the broker will not redeliver them and
            nothing has terminated them (MSG-012).
        dropped: messages this subscription will never see (evicted, or refused by
            its admission filter).
    """

    available: int
    leased: int
    unresolved: int
    dropped: int = 0

    def __post_init__(self) -> None:
        _require_counts("SubscriptionObservation", self,
                        ("available", "leased", "unresolved", "dropped"))

    @property
    def nothing_pending(self) -> bool:
        """True only when nothing is available, leased or unresolved; unresolved work is
        never "nothing pending" (MSG-012)."""
        return self.available == 0 and self.leased == 0 and self.unresolved == 0


@dataclass(frozen=True, slots=True)
class LeaseObservation:
    """What renewing a delivery's lease achieved.

    Arguments:
        state: 'extended' (the broker was asked to extend it), 'stale' (the token is
            superseded; nothing sent — MSG-011) or 'unknown' (the request failed).
        reason: why, for 'stale' and 'unknown'; required for 'unknown'.
    """

    state: LeaseState
    reason: str = ""

    def __post_init__(self) -> None:
        if self.state not in ("extended", "stale", "unknown"):
            raise ValueError(f"LeaseObservation.state must be extended, stale or unknown, "
                             f"got {self.state!r}")
        if self.state == "unknown":
            _require_text("LeaseObservation", "reason", self.reason)


@dataclass(frozen=True, slots=True)
class CleanupObservation:
    """What a cleanup removed.

    Arguments:
        removed: confirmed gone (one that was already gone counts).
        remaining: owned resources whose removal failed.
        complete: False whenever anything remains or the inventory could not be read
            — a failed listing removes nothing and is not "nothing to remove".
    """

    removed: tuple[str, ...]
    remaining: tuple[str, ...]
    complete: bool

    def __post_init__(self) -> None:
        object.__setattr__(self, "removed",
                           _require_names("CleanupObservation", "removed", self.removed))
        object.__setattr__(self, "remaining",
                           _require_names("CleanupObservation", "remaining", self.remaining))
        if self.complete and self.remaining:
            raise ValueError("CleanupObservation cannot be complete while resources remain: "
                             f"{self.remaining!r}")
