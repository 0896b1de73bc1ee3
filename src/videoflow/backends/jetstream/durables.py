"""Provisioning for the JetStream adapter: a channel's stream and a subscription's
durable, created or reconciled and read back, with whether this call created them.

Coroutines for the adapter's loop; the idempotent create-with-read-back itself is
streams.ensure_stream / ensure_consumer, shared with the provision entrypoint.
"""

from __future__ import annotations

import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, StreamConfig

from videoflow.backends.jetstream.specs import stream_config_for_spec, stream_of
from videoflow.backends.jetstream.streams import ensure_consumer, ensure_stream
from videoflow.backends.jetstream.verification import (
    VerifiedConsumer,
    VerifiedStream,
    profile_mismatches,
)
from videoflow.backends.messaging import ChannelSpec, IncompatibleProfile
from videoflow.broker.failures import JSErrorCode


def channel_findings(spec: ChannelSpec, effective: StreamConfig) -> list[str]:
    """The immutable ways a stream contradicts its spec: the profile's retention and
    discard (profile_mismatches) and the replica count."""
    findings = list(profile_mismatches(spec.profile, effective))
    if (effective.num_replicas or 1) != spec.replicas:
        findings.append(f"num_replicas: {effective.num_replicas} (requested {spec.replicas})")
    return findings


async def ensure_channel_stream(
    js: JetStreamContext, spec: ChannelSpec
) -> tuple[bool, VerifiedStream]:
    """Create or reconcile a channel's stream (stream_config_for_spec) and read it back.

    Returns:
        (created, verified): created is whether the stream was missing before this
        call; verified.effective is None when the read-back failed.

    Raises:
        IncompatibleProfile: a profile JetStream cannot promise, replicas the server
            cannot keep (REPLICAS_UNSUPPORTED), or an existing stream whose retention, discard or
            replicas contradict the spec (an update the broker refused).
        nats.js.errors.APIError and connection errors: the broker refused otherwise or
            did not answer.
    """
    config = stream_config_for_spec(spec)
    name = stream_of(spec.channel)
    try:
        await js.stream_info(name)
        created = False
    except nats.js.errors.NotFoundError as error:
        if error.err_code != JSErrorCode.STREAM_NOT_FOUND:
            raise
        created = True
    try:
        verified = await ensure_stream(js, config)
    except nats.js.errors.APIError as error:
        if error.err_code != JSErrorCode.REPLICAS_UNSUPPORTED:
            raise
        raise IncompatibleProfile(
            f"{name}: {error.description}", channel=spec.channel.node, profile=spec.profile,
            findings=(f"num_replicas: {spec.replicas} ({error.description})",),
        ) from error
    if verified.effective is not None:
        findings = channel_findings(spec, verified.effective)
        if findings:
            raise IncompatibleProfile(
                f"{name} does not carry {spec.profile}: {'; '.join(findings)}",
                channel=spec.channel.node, profile=spec.profile, findings=findings)
    return created, verified


async def ensure_durable(
    js: JetStreamContext, stream: str, durable: str, config: ConsumerConfig
) -> tuple[bool, VerifiedConsumer]:
    """Create or update a durable with add_consumer (never pull_subscribe, which binds
    an existing durable and ignores the config, NATS_FACTS S5) and read it back.

    Returns:
        (created, verified): created is whether the durable was missing before.

    Raises:
        nats.js.errors.NotFoundError: the stream does not exist (STREAM_NOT_FOUND).
    """
    try:
        await js.consumer_info(stream, durable)
        created = False
    except nats.js.errors.NotFoundError as error:
        if error.err_code == JSErrorCode.STREAM_NOT_FOUND:
            raise
        created = True
    return created, await ensure_consumer(js, stream, config)


__all__ = [
    "channel_findings",
    "ensure_channel_stream",
    "ensure_durable",
]
