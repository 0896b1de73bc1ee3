"""The messaging contract's value types: validation, identity, and the distinctions
the contract exists to keep (zero vs unknown, terminal only against a record)."""

from __future__ import annotations

import inspect
import re
from asyncio import AbstractEventLoop
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from reference_text import split_params

from videoflow.backends.messaging import (
    DURABLE_CONTROL,
    LIVE_LATEST,
    PROFILES,
    RELIABLE_WORK,
    REPLAY_ARCHIVE,
    STREAM_PROFILES,
    UNKNOWN_REASONS,
    Accepted,
    BrokerUnavailable,
    ChannelId,
    ChannelObservation,
    ChannelSpec,
    CleanupObservation,
    Completed,
    Delivery,
    DeliveryToken,
    Envelope,
    IncompatibleProfile,
    Known,
    LeaseObservation,
    MessagingBackend,
    MessagingCapabilities,
    ProfileRequest,
    PublicationUnknown,
    PublicationUnresolvable,
    Rejected,
    Retry,
    SettleConfirmed,
    SettleStale,
    SettleUnknown,
    SubscriptionId,
    SubscriptionObservation,
    SubscriptionSpec,
    Terminal,
    Unknown,
    UnobservableState,
    VerifiedChannel,
    VerifiedSubscription,
)
from videoflow.backends.messaging_types import (
    trusted_accepted,
    trusted_delivery,
    trusted_envelope,
)
from videoflow.errors import VideoflowError

CH = ChannelId("f", "r", "camera")
SUB = SubscriptionId("detector", CH, "data")


def test_profile_names_and_stream_level_subset() -> None:
    assert PROFILES == {"reliable_work", "live_latest", "durable_control", "replay_archive"}
    assert STREAM_PROFILES == {RELIABLE_WORK, LIVE_LATEST}
    assert DURABLE_CONTROL not in STREAM_PROFILES and REPLAY_ARCHIVE not in STREAM_PROFILES


def test_channel_id_refuses_empty_parts() -> None:
    with pytest.raises(ValueError, match="ChannelId.run"):
        ChannelId("f", "", "n")


def test_subscription_id_validates_kind_and_replica() -> None:
    with pytest.raises(ValueError, match="kind"):
        SubscriptionId("c", CH, "control")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="replica"):
        SubscriptionId("c", CH, "data", replica=-1)
    with pytest.raises(ValueError, match="ChannelId"):
        SubscriptionId("c", "f.r.camera", "data")  # type: ignore[arg-type]


def test_ids_are_hashable_and_equal_by_value() -> None:
    assert ChannelId("f", "r", "camera") == CH
    assert hash(ChannelId("f", "r", "camera")) == hash(CH)
    a = SubscriptionId("detector", ChannelId("f", "r", "camera"), "data", replica=2)
    b = SubscriptionId("detector", CH, "data", replica=2)
    assert a == b and len({a, b}) == 1
    assert a != SubscriptionId("detector", CH, "eos", replica=2)
    assert a != SubscriptionId("detector", CH, "data", replica=3)


def test_ids_are_frozen() -> None:
    with pytest.raises(AttributeError):
        CH.node = "other"  # type: ignore[misc]


def test_profile_request_validates_profile_and_knows_stream_level() -> None:
    assert ProfileRequest("camera", RELIABLE_WORK).stream_level
    assert not ProfileRequest("camera", REPLAY_ARCHIVE, requested_by="provision").stream_level
    with pytest.raises(ValueError, match="profile must be one of"):
        ProfileRequest("camera", "best_guess")
    with pytest.raises(ValueError, match="channel"):
        ProfileRequest("", RELIABLE_WORK)


def test_known_zero_and_unknown_are_different_types() -> None:
    zero: Known[int] | Unknown = Known(0)
    unread: Known[int] | Unknown = Unknown("unread")
    assert zero != unread
    assert isinstance(zero, Known) and not isinstance(zero, Unknown)
    assert isinstance(unread, Unknown) and not isinstance(unread, Known)
    assert Known(0) == Known(0) and hash(Known(0)) == hash(Known(0))


@pytest.mark.parametrize("observation", [Known(0), Known(5), Unknown("timeout", "slow")])
def test_observations_refuse_truth_testing(observation: Known[int] | Unknown) -> None:
    with pytest.raises(TypeError, match="not truth-testable"):
        bool(observation)


def test_unknown_reason_vocabulary() -> None:
    assert UNKNOWN_REASONS == {
        "missing", "timeout", "auth", "unreachable", "api", "malformed", "unread"
    }
    for reason in UNKNOWN_REASONS:
        assert Unknown(reason).reason == reason  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="Unknown.reason"):
        Unknown("zero")  # type: ignore[arg-type]


def test_terminal_requires_a_record_ref() -> None:
    assert Terminal("dlq/f/r/camera/7").record_ref == "dlq/f/r/camera/7"
    for bad in ("", "   "):
        with pytest.raises(ValueError, match="DELIV-15"):
            Terminal(bad)
    with pytest.raises(TypeError):
        Terminal()  # type: ignore[call-arg]


def test_channel_spec_defaults_and_validation() -> None:
    spec = ChannelSpec(CH, RELIABLE_WORK, required=[SUB])  # type: ignore[arg-type]
    assert spec.required == (SUB,) and spec.replicas == 1 and spec.max_bytes is None
    assert hash(spec) == hash(ChannelSpec(CH, RELIABLE_WORK, required=(SUB,)))
    with pytest.raises(ValueError, match="profile"):
        ChannelSpec(CH, "fast")
    with pytest.raises(ValueError, match="replicas"):
        ChannelSpec(CH, LIVE_LATEST, replicas=0)
    with pytest.raises(ValueError, match="max_bytes"):
        ChannelSpec(CH, LIVE_LATEST, max_bytes=0)
    other = SubscriptionId("detector", ChannelId("f", "r", "lidar"))
    with pytest.raises(ValueError, match="does not read"):
        ChannelSpec(CH, RELIABLE_WORK, required=(other,))


def test_subscription_spec_validation() -> None:
    assert SubscriptionSpec(SUB, 60, -1, 5).byte_credit == 0
    with pytest.raises(ValueError, match="ack_wait_seconds"):
        SubscriptionSpec(SUB, 0, 3, 5)
    with pytest.raises(ValueError, match="ack_wait_seconds"):
        SubscriptionSpec(SUB, float("inf"), 3, 5)
    with pytest.raises(ValueError, match="max_deliver"):
        SubscriptionSpec(SUB, 60, 0, 5)
    with pytest.raises(ValueError, match="credit"):
        SubscriptionSpec(SUB, 60, 3, 0)
    with pytest.raises(ValueError, match="byte_credit"):
        SubscriptionSpec(SUB, 60, 3, 1, byte_credit=-1)


def test_envelope_size_and_validation() -> None:
    env = Envelope(CH, "data", b"abc", msg_id="camera:0:1")
    assert env.size == 3
    with pytest.raises(ValueError, match="kind"):
        Envelope(CH, "ctl", b"")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="bytes"):
        Envelope(CH, "data", "abc")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="msg_id"):
        Envelope(CH, "data", b"", msg_id="")


def test_an_external_envelope_names_a_plain_subject_for_data() -> None:
    env = Envelope(CH, "data", b"x", subject="rig.out", headers={"Event-Time": "1.5"})
    assert (env.subject, dict(env.headers or {})) == ("rig.out", {"Event-Time": "1.5"})
    for subject in ("", "rig.*", "rig.>", "a b"):
        with pytest.raises(ValueError, match="subject"):
            Envelope(CH, "data", b"x", subject=subject)
    with pytest.raises(ValueError, match="subject"):
        Envelope(CH, "eos", b"x", subject="rig.out")  # only data goes outside
    with pytest.raises(ValueError, match="headers"):
        Envelope(CH, "data", b"x", headers={"n": 1})  # type: ignore[dict-item]


def test_delivery_tokens_equal_only_for_the_same_attempt_and_generation() -> None:
    token = DeliveryToken(SUB, stream_seq=7, attempt=1, generation=0)
    same = DeliveryToken(SubscriptionId("detector", ChannelId("f", "r", "camera")), 7, 1, 0)
    assert token == same and hash(token) == hash(same) and len({token, same}) == 1
    assert token != DeliveryToken(SUB, 7, 2, 0)  # a redelivery (MSG-011)
    assert token != DeliveryToken(SUB, 7, 1, 1)  # a rebind
    assert token != DeliveryToken(SUB, 8, 1, 0)
    # The same position through another subscription is another token, in a set too.
    other = DeliveryToken(SubscriptionId("tracker", ChannelId("f", "r", "camera")), 7, 1, 0)
    assert token != other and len({token, same, other}) == 2
    with pytest.raises(AttributeError):
        token.attempt = 2  # type: ignore[misc]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"stream_seq": 0}, "stream_seq"), ({"attempt": 0}, "attempt"),
     ({"generation": -1}, "generation"), ({"stream_seq": True}, "stream_seq")],
)
def test_delivery_token_validation(kwargs: dict[str, int], field: str) -> None:
    args = {"stream_seq": 1, "attempt": 1, "generation": 0} | kwargs
    with pytest.raises(ValueError, match=field):
        DeliveryToken(SUB, **args)


def test_delivery_agrees_with_its_token() -> None:
    token = DeliveryToken(SUB, 7, 2)
    delivery = Delivery(token, b"xyz", num_delivered=2, stream_seq=7)
    assert delivery.size == 3
    with pytest.raises(ValueError, match="agree"):
        Delivery(token, b"xyz", num_delivered=1, stream_seq=7)


def test_a_backend_built_delivery_is_the_one_its_constructors_would_build() -> None:
    built = trusted_delivery(SUB, 7, 2, 3, b"xyz", "00-" + "a" * 32 + "-" + "b" * 16 + "-01")
    checked = Delivery(DeliveryToken(SUB, 7, 2, 3), b"xyz", num_delivered=2, stream_seq=7,
                       traceparent="00-" + "a" * 32 + "-" + "b" * 16 + "-01")
    assert built == checked and built.token == checked.token
    assert hash(built.token) == hash(checked.token) and built.size == 3
    with pytest.raises(AttributeError):  # as frozen as a checked one
        built.token.attempt = 3  # type: ignore[misc]
    with pytest.raises(AttributeError):
        built.data = b""  # type: ignore[misc]


def test_a_messenger_built_envelope_and_a_backend_built_acceptance_are_the_checked_ones(
) -> None:
    tp = "00-" + "a" * 32 + "-" + "b" * 16 + "-01"
    assert trusted_envelope(CH, b"xyz", "n:1", tp) == Envelope(CH, "data", b"xyz", "n:1", tp)
    assert trusted_envelope(CH, b"xyz", "n:1", None) == Envelope(CH, "data", b"xyz", "n:1")
    assert trusted_accepted(7, True) == Accepted(7, duplicate=True)
    assert trusted_accepted(7, False) == Accepted(7)
    with pytest.raises(AttributeError):
        trusted_accepted(7, False).stream_seq = 8  # type: ignore[misc]


def test_publish_outcomes_are_distinct_types() -> None:
    outcomes = [Accepted(3), Accepted(3, duplicate=True), Rejected("no stream", False),
                PublicationUnknown("timeout"), PublicationUnresolvable()]
    assert len({type(o) for o in outcomes}) == 4
    assert Accepted(3) != Accepted(3, duplicate=True)
    with pytest.raises(ValueError, match="stream_seq"):
        Accepted(0)
    with pytest.raises(ValueError, match="reason"):
        Rejected("", True)
    with pytest.raises(ValueError, match="reason"):
        PublicationUnknown("")


def test_settle_outcomes_and_results() -> None:
    assert Completed() == Completed()
    assert Retry().delay == 0.0 and Retry(1.5).delay == 1.5
    with pytest.raises(ValueError, match="delay"):
        Retry(-1)
    with pytest.raises(ValueError, match="delay"):
        Retry(float("nan"))
    results = [SettleConfirmed(), SettleUnknown("no ack reply"), SettleStale()]
    assert len({type(r) for r in results}) == 3
    with pytest.raises(ValueError, match="reason"):
        SettleUnknown("")


def test_capabilities_default_to_unread_observations() -> None:
    caps = MessagingCapabilities("jetstream", frozenset(STREAM_PROFILES), durable=True)
    assert caps.max_payload == Unknown("unread") and caps.storage == Unknown("unread")
    read = MessagingCapabilities("jetstream", STREAM_PROFILES, True, max_payload=Known(1 << 20))
    assert read.max_payload == Known(1048576)
    with pytest.raises(ValueError, match="profile"):
        MessagingCapabilities("memory", frozenset({"fast"}), durable=False)
    with pytest.raises(ValueError, match="Known or Unknown"):
        MessagingCapabilities("memory", PROFILES, False, max_payload=1024)  # type: ignore[arg-type]


def test_verified_channel_and_subscription_report_mismatches() -> None:
    spec = ChannelSpec(CH, RELIABLE_WORK, replicas=3)
    assert VerifiedChannel(spec, "vf-f-r-camera", created=True).honoured
    clamped = VerifiedChannel(spec, "vf-f-r-camera", mismatches=["num_replicas: 1 < 3"])  # type: ignore[arg-type]
    assert clamped.mismatches == ("num_replicas: 1 < 3",) and not clamped.honoured
    with pytest.raises(ValueError, match="sequence of names"):
        VerifiedChannel(spec, "vf-f-r-camera", mismatches="num_replicas")  # type: ignore[arg-type]
    sub = VerifiedSubscription(SubscriptionSpec(SUB, 60, 3, 4), "detector-camera", generation=2)
    assert sub.honoured and sub.generation == 2
    with pytest.raises(ValueError, match="generation"):
        VerifiedSubscription(SubscriptionSpec(SUB, 60, 3, 4), "d", generation=-1)


def test_channel_observation_validation() -> None:
    assert ChannelObservation(1, 0, 0, "interest").messages == 0
    with pytest.raises(ValueError, match="messages"):
        ChannelObservation(1, 5, -1, "limits")
    with pytest.raises(ValueError, match="retention"):
        ChannelObservation(1, 5, 5, "")


def test_unresolved_work_is_never_nothing_pending() -> None:
    assert SubscriptionObservation(0, 0, 0, dropped=4).nothing_pending
    assert not SubscriptionObservation(0, 0, 1).nothing_pending  # MSG-012
    assert not SubscriptionObservation(0, 2, 0).nothing_pending
    assert not SubscriptionObservation(1, 0, 0).nothing_pending
    with pytest.raises(ValueError, match="unresolved"):
        SubscriptionObservation(0, 0, -1)


def test_lease_observation_states() -> None:
    assert LeaseObservation("extended").reason == ""
    assert LeaseObservation("stale").state == "stale"
    with pytest.raises(ValueError, match="reason"):
        LeaseObservation("unknown")
    with pytest.raises(ValueError, match="state"):
        LeaseObservation("renewed")  # type: ignore[arg-type]


def test_cleanup_cannot_be_complete_with_remainders() -> None:
    done = CleanupObservation(["a", "b"], [], complete=True)  # type: ignore[arg-type]
    assert done.removed == ("a", "b") and done.remaining == ()
    assert not CleanupObservation((), (), complete=False).complete  # unreadable inventory
    with pytest.raises(ValueError, match="complete"):
        CleanupObservation(("a",), ("b",), complete=True)


# --------------------------------------------------------------- the abstract contract

# Every public member the reference documents for JetStreamMessagingBackend
# (messaging-api-reference, videoflow.messaging.jetstream_backend), constructor aside.
REFERENCE_MEMBERS = {
    "budget_waits", "capabilities", "close", "connected", "ensure_channel",
    "ensure_subscription", "loop", "mark_exhausted", "observe_ack_floor", "observe_channel",
    "observe_publication", "observe_subscription", "prefetched", "publish", "receive",
    "receive_any", "renew", "resident_bytes", "set_admission", "settle", "shutdown",
    "skipped", "start", "stop_receiving", "subject_for", "subscribe_control", "supersede",
}
# Members the reference gives a default behaviour for ("0 when the backend keeps none",
# "Returns False when the backend keeps no such filter", "The default is a no-op").
DEFAULTED = {"budget_waits", "prefetched", "receive", "set_admission", "skipped", "supersede"}
# Members the contract adds to the reference, each with a default built on a reference
# member: the pipelined forms of settle and publish (issue 3, section 7), and the
# subscription counts read together (issue 10).
ADDITIONS = {"backlog", "observe_subscriptions", "publish_async", "settle_async",
             "settle_many", "settle_many_async"}
# Additions every adapter implements itself: the flow's dead-letter stream (STREAM-8),
# which the reference's provisioning creates but no reference member binds.
ABSTRACT_ADDITIONS = {"ensure_dead_letters"}
# Additions whose default does nothing: the moment a caller that hands work over and
# then runs code of its own gives an adapter whose loop runs on the caller's thread
# (issue 10), and how many deliveries an adapter that parks ahead may park (issue 40).
IDLE_ADDITIONS = {"catch_up", "set_receive_depth"}
# Additions whose default declines: making a durable's leases lapse at once, for an
# adapter whose deliveries can be cut off in flight by a broker failover (issue 44).
DECLINING_ADDITIONS = {"lapse_leases"}
# Additions whose defaults extend nothing and give nothing up: how long a broker outage
# lets the publication ladder go on, for an adapter whose broker can go away (issue 12),
# and why it gave its broker up for good, which ends the ladder at once.
OUTAGE_ADDITIONS = {"pursue_until", "given_up"}

# The shared design folder sits beside the repository (in every session and in CI).
REFERENCE = Path(__file__).resolve().parents[3] / "shared" / "spec" / "messaging-api-reference.txt"


def _declared_members() -> set[str]:
    return {name for name in vars(MessagingBackend) if not name.startswith("_")}


def test_backend_declares_exactly_the_reference_members_and_the_pipelined_additions() -> None:
    assert _declared_members() == (REFERENCE_MEMBERS | ADDITIONS | ABSTRACT_ADDITIONS
                                   | IDLE_ADDITIONS | OUTAGE_ADDITIONS | DECLINING_ADDITIONS)


def test_backend_abstract_members_are_all_but_the_documented_defaults() -> None:
    assert MessagingBackend.__abstractmethods__ == (
        (REFERENCE_MEMBERS | ABSTRACT_ADDITIONS) - DEFAULTED)


def test_backend_cannot_be_instantiated() -> None:
    with pytest.raises(TypeError, match="abstract"):
        MessagingBackend()  # type: ignore[abstract]


def test_backend_members_all_carry_a_promise() -> None:
    for name in (REFERENCE_MEMBERS | ADDITIONS | ABSTRACT_ADDITIONS | IDLE_ADDITIONS
                 | OUTAGE_ADDITIONS | DECLINING_ADDITIONS):
        member = vars(MessagingBackend)[name]
        doc = (member.fget if isinstance(member, property) else member).__doc__
        assert doc and doc.strip(), name


def _reference_signatures() -> dict[str, list[tuple[str, str | None]] | None]:
    """name -> [(parameter, default text or None)], or None for a property."""
    text = REFERENCE.read_text(encoding="utf-8")
    start = text.index("class videoflow.messaging.jetstream_backend.JetStreamMessagingBackend(")
    end = text.index("videoflow.messaging.jetstream_backend.channel_spec_for(", start)
    found: dict[str, list[tuple[str, str | None]] | None] = {}
    for line in text[start:end].splitlines()[1:]:
        if match := re.match(r"^property (\w+): ", line):
            found[match.group(1)] = None
        elif match := re.match(r"^(\w+)\((.*)\) \u2192 ", line):
            params = []
            for param in split_params(match.group(2)):
                head, _, default = param.partition(" = ")
                params.append((head.split(":")[0].strip(), default or None))
            found[match.group(1)] = params
    return found


@pytest.mark.skipif(not REFERENCE.exists(), reason="the shared API reference is not present")
def test_backend_matches_the_reference_signatures() -> None:
    reference = _reference_signatures()
    assert set(reference) == REFERENCE_MEMBERS
    for name, params in reference.items():
        member = vars(MessagingBackend)[name]
        if params is None:
            assert isinstance(member, property), name
            continue
        declared = [
            (p.name, None if p.default is inspect.Parameter.empty else repr(p.default))
            for p in list(inspect.signature(member).parameters.values())[1:]  # without self
        ]
        assert declared == params, name


class _Minimal(MessagingBackend):
    """Implements only the abstract members, to exercise the defaults."""

    def start(self) -> None: ...
    @property
    def connected(self) -> bool:
        return False
    @property
    def loop(self) -> AbstractEventLoop:
        raise RuntimeError("no loop")
    def stop_receiving(self) -> int:
        return 0
    def shutdown(self, hand_back: bool = True) -> None: ...
    def close(self, owned: Sequence[ChannelId], expected_generation: str) -> Any: ...
    def capabilities(self) -> Any: ...
    def subject_for(self, channel: ChannelId, kind: str) -> str:
        return ""
    def ensure_channel(self, spec: ChannelSpec, operation_id: str) -> Any: ...
    def ensure_dead_letters(self, operation_id: str) -> None: ...
    def ensure_subscription(self, spec: SubscriptionSpec, operation_id: str) -> Any: ...
    def subscribe_control(self, callback: Callable[[], None]) -> None: ...
    def publish(self, envelope: Envelope, deadline: float) -> Any: ...
    def observe_publication(self, envelope: Envelope) -> Any: ...
    def receive(self, subscription: SubscriptionId, item_credit: int, byte_credit: int,
                deadline: float) -> list[Delivery]:
        return []
    def receive_any(self, subscriptions: Sequence[SubscriptionId], item_credit: int,
                    byte_credit: int, deadline: float) -> list[tuple[SubscriptionId, Delivery]]:
        return []
    def resident_bytes(self) -> int:
        return 0
    def settle(self, token: DeliveryToken, outcome: Any, settlement_id: str) -> Any: ...
    def renew(self, token: DeliveryToken) -> Any: ...
    def mark_exhausted(self, subscription: SubscriptionId, stream_sequence: int | None) -> None:
        ...
    def observe_channel(self, channel: ChannelId) -> Any: ...
    def observe_subscription(self, subscription: SubscriptionId) -> Any: ...
    def observe_ack_floor(self, subscription: SubscriptionId) -> Any: ...


def test_defaults_report_no_local_machinery() -> None:
    backend = _Minimal()
    token = DeliveryToken(SUB, 1, 1)
    assert backend.set_admission(SUB, lambda _d: True) is False
    assert backend.prefetched(SUB) == 0 and backend.skipped(SUB) == 0
    assert backend.budget_waits() == 0
    assert backend.supersede(token) is False
    assert backend.lapse_leases(SUB) is False


def test_errors_are_families_under_the_root_with_codes_as_data() -> None:
    unavailable = BrokerUnavailable("stream vf-f-r-camera not found", code=10059)
    assert isinstance(unavailable, VideoflowError) and isinstance(unavailable, ConnectionError)
    assert unavailable.code == 10059 and unavailable.retryable
    incompatible = IncompatibleProfile("camera is not reliable_work", channel="camera",
                                       profile=RELIABLE_WORK, findings=["discard: old"])
    assert isinstance(incompatible, ValueError) and not incompatible.retryable
    assert incompatible.findings == ("discard: old",)
    unobservable = UnobservableState("camera unread", reason="timeout", detail="30 s")
    assert isinstance(unobservable, VideoflowError) and unobservable.retryable
    assert (unobservable.reason, unobservable.detail) == ("timeout", "30 s")
    with pytest.raises(VideoflowError, match="camera unread"):
        raise unobservable
