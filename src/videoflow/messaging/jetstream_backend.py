"""The reference's path to the JetStream adapter: JetStreamMessagingBackend and the
spec helpers the reference lists under this module. The adapter itself lives in
videoflow.backends.jetstream, beside the memory adapter, under the contract."""

from videoflow.backends.jetstream.backend import (
    ACK_CONFIRM_SECONDS,
    FETCH_TIMEOUT_SECONDS,
    JetStreamMessagingBackend,
    channel_spec_for,
    stream_config_for_spec,
    subscription_spec_for,
)
from videoflow.core.credit import consumer_credit

__all__ = [
    "ACK_CONFIRM_SECONDS",
    "FETCH_TIMEOUT_SECONDS",
    "JetStreamMessagingBackend",
    "channel_spec_for",
    "consumer_credit",
    "stream_config_for_spec",
    "subscription_spec_for",
]
