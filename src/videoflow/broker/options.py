"""Keyword arguments for nats.connect: the short-lived observation connections of the
operator commands and read-backs (NATS_FACTS §8), and the TLS every connection of a
process makes (tls_options)."""

from __future__ import annotations

import os
import ssl
from collections.abc import Awaitable, Callable
from typing import Any, Final

TLS_CA_ENV: Final = "VIDEOFLOW_NATS_TLS_CA"
"""A PEM file of the certificate authorities that sign the broker's certificate."""
TLS_CERT_ENV: Final = "VIDEOFLOW_NATS_TLS_CERT"
"""A PEM file of this client's certificate, for a broker that verifies its clients."""
TLS_KEY_ENV: Final = "VIDEOFLOW_NATS_TLS_KEY"
"""The PEM file of that certificate's private key."""


def tls_options() -> dict[str, Any]:
    """nats.connect's ``tls`` for every connection of this process, from the
    environment: the videoflow command's --tls-ca / --tls-cert / --tls-key write it, so
    the replicas and workers it starts connect the same way. Empty when none is set
    (a tls:// URL then uses the system's authorities).

    Raises:
        ValueError: a certificate without its key or a key without its certificate.
        OSError / ssl.SSLError: a file that cannot be read or is not PEM.
    """
    ca, cert, key = (os.environ.get(name) or None
                     for name in (TLS_CA_ENV, TLS_CERT_ENV, TLS_KEY_ENV))
    if ca is None and cert is None and key is None:
        return {}
    if (cert is None) != (key is None):
        raise ValueError(f"{TLS_CERT_ENV} and {TLS_KEY_ENV} go together: a client "
                         "certificate needs its key")
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca)
    if cert is not None:
        context.load_cert_chain(cert, key)
    return {"tls": context}

FAIL_FAST_RECONNECT_ATTEMPTS: Final = 1
"""max_reconnect_attempts of a fail-fast connect: 0 would loop forever on a refused
connect (NATS_FACTS S4); 1 gives up after two attempts with NoServersError."""
FAIL_FAST_RECONNECT_WAIT: Final = 0.1
FAIL_FAST_CONNECT_TIMEOUT: Final = 2.0
RETRY_RECONNECT_ATTEMPTS: Final = 60
RETRY_RECONNECT_WAIT: Final = 2.0


def connect_options_for(
    timeout: float,
    fail_fast: bool,
    error_cb: Callable[[BaseException], Awaitable[None]],
) -> dict[str, Any]:
    """nats.connect keyword arguments for a short-lived observation connection.

    fail_fast (the operator's machine) disables reconnects; note that nats-py 2.15.0
    still cycles the server pool on a refused connect (nats/aio/client.py
    _select_next_server loops until a server answers, and max_reconnect_attempts = 0
    never discards one), so the caller bounds the connect with asyncio.wait_for and
    reads the refusal out of error_cb — which is also where a server-side permissions
    violation on a JetStream API subject arrives (client.py _process_err), while the
    request itself merely times out. Without fail_fast (an in-cluster entrypoint whose
    broker may still be starting) the client's own retry schedule applies: 60 attempts
    two seconds apart.

    Arguments:
        timeout (float): the caller's overall bound in seconds (> 0); a single connect
            attempt never waits longer than it.
        fail_fast (bool): see above.
        error_cb: the client's error callback (always the caller's own: the default one
            logs a traceback per attempt).

    Returns:
        A fresh dict of keyword arguments (no servers: the caller passes the URL).

    Raises:
        ValueError: if timeout is not a finite number > 0.
    """
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, (int, float))
        or not timeout > 0
        or timeout == float("inf")
    ):
        raise ValueError(f"timeout must be a finite number > 0, got {timeout!r}")
    if fail_fast:
        # NATS_FACTS §8 fail-fast recipe: NoServersError in ~0.1 s when refused,
        # asyncio.TimeoutError after connect_timeout when the server hangs.
        return {
            "allow_reconnect": False,
            "max_reconnect_attempts": FAIL_FAST_RECONNECT_ATTEMPTS,
            "reconnect_time_wait": FAIL_FAST_RECONNECT_WAIT,
            "connect_timeout": min(FAIL_FAST_CONNECT_TIMEOUT, float(timeout)),
            "error_cb": error_cb,
            **tls_options(),
        }
    return {
        "allow_reconnect": True,
        "max_reconnect_attempts": RETRY_RECONNECT_ATTEMPTS,
        "reconnect_time_wait": RETRY_RECONNECT_WAIT,
        "connect_timeout": min(FAIL_FAST_CONNECT_TIMEOUT, float(timeout)),
        "error_cb": error_cb,
        **tls_options(),
    }


async def quiet_error_cb(_e: BaseException) -> None:
    """Silences the client's per-attempt error logging; the read-back reports the failure
    itself."""
    return None


__all__ = [
    "FAIL_FAST_CONNECT_TIMEOUT",
    "FAIL_FAST_RECONNECT_ATTEMPTS",
    "FAIL_FAST_RECONNECT_WAIT",
    "RETRY_RECONNECT_ATTEMPTS",
    "RETRY_RECONNECT_WAIT",
    "connect_options_for",
    "quiet_error_cb",
]
