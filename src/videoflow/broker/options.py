"""Keyword arguments for nats.connect: the short-lived observation connections of the
operator commands and read-backs (NATS_FACTS §8), and the TLS and credentials every
connection of a process presents (auth_options)."""

from __future__ import annotations

import os
import ssl
from collections.abc import Awaitable, Callable
from typing import Any, Final
from urllib.parse import urlsplit

from videoflow.broker.natscontext import read_context
from videoflow.broker.urls import servers_of
from videoflow.errors import MissingDependency
from videoflow.logs import keep_secret

TLS_CA_ENV: Final = "VIDEOFLOW_NATS_TLS_CA"
"""A PEM file of the certificate authorities that sign the broker's certificate."""
TLS_CERT_ENV: Final = "VIDEOFLOW_NATS_TLS_CERT"
"""A PEM file of this client's certificate, for a broker that verifies its clients."""
TLS_KEY_ENV: Final = "VIDEOFLOW_NATS_TLS_KEY"
"""The PEM file of that certificate's private key."""
CREDS_ENV: Final = "VIDEOFLOW_NATS_CREDS"
"""A NATS credentials file (a user JWT and its nkey seed, as nsc writes it)."""
NKEY_ENV: Final = "VIDEOFLOW_NATS_NKEY"
"""A file holding a user's nkey seed, for a broker that lists its users' nkeys."""
USER_ENV: Final = "VIDEOFLOW_NATS_USER"
PASSWORD_ENV: Final = "VIDEOFLOW_NATS_PASSWORD"
"""A user name and its password (both, or neither)."""
TOKEN_ENV: Final = "VIDEOFLOW_NATS_TOKEN"
"""A broker's authorization token."""
CONTEXT_ENV: Final = "VIDEOFLOW_NATS_CONTEXT"
"""The name of a nats CLI context: the URL and credentials used where none are given."""

NKEYS_INSTALL: Final = "pip install nkeys"

SETTING_ENV: Final = {
    "creds": CREDS_ENV, "nkey": NKEY_ENV, "user": USER_ENV, "password": PASSWORD_ENV,
    "token": TOKEN_ENV, "ca": TLS_CA_ENV, "cert": TLS_CERT_ENV, "key": TLS_KEY_ENV,
}
"""Each connection setting and the variable that gives it (the videoflow command's
flags write them, so the replicas and workers it starts connect the same way)."""

CREDENTIAL_FIELDS: Final[tuple[str, ...]] = ("creds", "nkey", "user", "password", "token")
TLS_FIELDS: Final[tuple[str, ...]] = ("ca", "cert", "key")


def tls_options() -> dict[str, Any]:
    """nats.connect's ``tls`` from the environment alone (auth_options also takes a
    named context's files): the videoflow command's --tls-ca / --tls-cert / --tls-key
    write it. Empty when none is set (a tls:// URL then uses the system's authorities).

    Raises:
        ValueError: a certificate without its key or a key without its certificate; a
            file that cannot be read, holds no certificate or key, or a key that is
            not the certificate's (the message names the file).
    """
    return _tls({field: value for field in TLS_FIELDS
                 if (value := os.environ.get(SETTING_ENV[field]))})


class AskedTls(ssl.SSLContext):
    """The TLS settings of a connection that asked for TLS (a tls:// URL, or TLS files
    given), with what asked, for the refusal of a broker that does not offer it
    (client.TlsClient: nats-py alone would send CONNECT to it in clear).

    Attributes:
        asked_by: what asked for TLS, in words.
        has_certificate: whether a client certificate was loaded into it.
    """

    asked_by = "the TLS settings given"
    has_certificate = False


def _tls(settings: dict[str, str], required: bool = False) -> dict[str, Any]:
    """``tls`` for nats.connect: an AskedTls with the CA and client certificate given
    (the system's authorities without a CA), when TLS files are given or required says
    a tls:// URL asks for TLS; else nothing."""
    ca, cert, key = (settings.get(field) for field in TLS_FIELDS)
    if ca is None and cert is None and key is None and not required:
        return {}
    if (cert is None) != (key is None):
        raise ValueError(f"{TLS_CERT_ENV} and {TLS_KEY_ENV} go together: a client "
                         "certificate needs its key")
    # What ssl.create_default_context(SERVER_AUTH, cafile=ca) makes (the hostname is
    # checked, a certificate required), as an AskedTls.
    context = AskedTls(ssl.PROTOCOL_TLS_CLIENT)
    if ca is not None:
        _load_authorities(context, ca)
    else:
        context.load_default_certs(ssl.Purpose.SERVER_AUTH)
    if cert is not None and key is not None:
        _load_certificate(context, cert, key)
        context.has_certificate = True
    return {"tls": context}


def _load_authorities(context: ssl.SSLContext, ca: str) -> None:
    """context.load_verify_locations(ca), a failure a ValueError naming the file."""
    try:
        context.load_verify_locations(ca)
    except ssl.SSLError as error:
        raise ValueError(f"the CA file {ca!r} ({TLS_CA_ENV}, --tls-ca) holds no PEM "
                         f"certificate ({error.reason or error})") from None
    except OSError as error:
        raise ValueError(f"cannot read the CA file {ca!r} ({TLS_CA_ENV}, --tls-ca): "
                         f"{error.strerror or error}") from None


def _load_certificate(context: ssl.SSLContext, cert: str, key: str) -> None:
    """context.load_cert_chain(cert, key), a failure a ValueError naming the file at
    fault: OpenSSL says 'PEM lib' alike for a cert and a key it cannot read, so each
    file is first looked at for what it should hold."""
    cert_text = _read(cert, f"client certificate ({TLS_CERT_ENV}, --tls-cert)")
    key_text = _read(key, f"client key ({TLS_KEY_ENV}, --tls-key)")
    if b"-----BEGIN CERTIFICATE-----" not in cert_text:
        raise ValueError(f"the client certificate {cert!r} ({TLS_CERT_ENV}, --tls-cert) "
                         "holds no PEM certificate")
    if b"PRIVATE KEY-----" not in key_text:
        raise ValueError(f"the client key {key!r} ({TLS_KEY_ENV}, --tls-key) holds no "
                         "PEM private key")

    def no_passphrase() -> str:
        # Without a password callback OpenSSL would prompt on the terminal.
        raise ValueError(f"the client key {key!r} ({TLS_KEY_ENV}, --tls-key) is "
                         "encrypted: give it unencrypted (openssl pkey -in KEY -out "
                         "PLAIN)")

    try:
        context.load_cert_chain(cert, key, password=no_passphrase)
    except ssl.SSLError as error:
        if error.reason == "KEY_VALUES_MISMATCH":
            raise ValueError(f"the client key {key!r} ({TLS_KEY_ENV}, --tls-key) is not "
                             f"the key of the certificate {cert!r}") from None
        raise ValueError(f"cannot load the client certificate {cert!r} with the key "
                         f"{key!r}: {error.reason or error}") from None
    except OSError as error:
        raise ValueError(f"cannot read the client certificate {cert!r} or its key "
                         f"{key!r}: {error.strerror or error}") from None


_TLS_SCHEMES: Final = ("tls", "wss")


def tls_required(url: str | None, settings: dict[str, str]) -> bool:
    """Whether a connection to url must be TLS: a server of it named tls:// (or wss://),
    or a TLS file given (settings: connection_settings's). nats-py itself goes by the
    server's INFO alone, and would send CONNECT in clear to a server that does not
    offer TLS; the Go client refuses ('secure connection required'), and so does
    videoflow (auth_options)."""
    if any(field in settings for field in TLS_FIELDS):
        return True
    return any(urlsplit(server).scheme.lower() in _TLS_SCHEMES for server in _servers(url))


def _servers(url: str | None) -> list[str]:
    if not url:
        return []
    try:
        return servers_of(url)
    except ValueError:
        return []


def context_name() -> str | None:
    """The nats context VIDEOFLOW_NATS_CONTEXT names, None when it names none."""
    return os.environ.get(CONTEXT_ENV) or None


def context_url() -> str | None:
    """The URL of the named nats context (context_name), None without one.

    Raises:
        ValueError: as natscontext.read_context.
    """
    name = context_name()
    return read_context(name).get("url") if name else None


def url_has_credentials(url: str | None) -> bool:
    """Whether a server of url (one, or several comma-separated) carries a user,
    password or token before its host."""
    if not url:
        return False
    for server in url.split(","):
        authority = server.strip().partition("://")[2] or server.strip()
        if "@" in authority.partition("/")[0]:
            return True
    return False


def connection_settings(url: str | None = None) -> tuple[dict[str, str], str]:
    """The TLS files and credentials a connection to url presents, and where the
    credentials come from: the variables (the command's flags), else the named nats
    context. Credentials given in any way (a variable, or the URL) replace the
    context's as a whole; a TLS file given replaces the context's one.

    Returns:
        (field -> value for the fields set among CREDENTIAL_FIELDS and TLS_FIELDS,
        'given' or "the nats context 'NAME'").

    Raises:
        ValueError: a named context that cannot be read (natscontext.read_context).
    """
    given = {field: value for field, variable in SETTING_ENV.items()
             if (value := os.environ.get(variable))}
    name = context_name()
    if name is None:
        return given, "given"
    context = read_context(name)
    settings = {field: context[field] for field in TLS_FIELDS if field in context}
    settings.update({field: given[field] for field in TLS_FIELDS if field in given})
    credentials_given = url_has_credentials(url) or any(
        field in given for field in CREDENTIAL_FIELDS)
    source = given if credentials_given else context
    settings.update({field: source[field] for field in CREDENTIAL_FIELDS if field in source})
    return settings, "given" if credentials_given else f"the nats context {name!r}"


_METHOD_NAMES: Final = {
    "creds": f"a creds file (--creds, {CREDS_ENV})",
    "nkey": f"an nkey seed (--nkey, {NKEY_ENV})",
    "user": f"a user and password (--user/--password, {USER_ENV}/{PASSWORD_ENV})",
    "token": f"a token (--token, {TOKEN_ENV})",
    "url": "credentials in the URL",
}


def auth_options(url: str | None = None) -> dict[str, Any]:
    """nats.connect's keyword arguments for the TLS and credentials every connection of
    this process presents (connection_settings: the variables the videoflow command's
    flags write, else the named nats context): ``tls``, and one of
    ``user_credentials`` (a creds file), ``nkeys_seed`` (an nkey seed file), ``user``
    with ``password``, or ``token``. Empty when nothing is set.

    Arguments:
        url: the broker the connection is for, when known: credentials in it are one
            way of authenticating (a second one given with them is refused).

    Raises:
        ValueError: two ways of authenticating at once (a creds file and an nkey seed,
            a token and a user, credentials in the URL and a flag), a user without its
            password or a password without its user, a creds or nkey file that cannot
            be read or does not hold what it should, a certificate without its key, a
            named context that cannot be read.
        MissingDependency: a creds file or nkey seed without the nkeys package.
        OSError / ssl.SSLError: a TLS file that cannot be read or is not PEM.
    """
    settings, source = connection_settings(url)
    where = "" if source == "given" else f" ({source})"
    if ("user" in settings) != ("password" in settings):
        raise ValueError(f"a user and its password go together{where}: give both "
                         f"--user and --password ({USER_ENV}, {PASSWORD_ENV})")
    methods: list[str] = [method for method in ("creds", "nkey", "user", "token")
                          if method in settings]
    if url_has_credentials(url):
        methods.append("url")
    if len(methods) > 1:
        chosen = " and ".join(_METHOD_NAMES[method] for method in methods)
        raise ValueError(f"conflicting broker credentials{where}: {chosen}; give one way "
                         "of authenticating")
    options = _tls(settings, tls_required(url, settings))
    if "creds" in settings:
        _check_creds_file(settings["creds"])
        options["user_credentials"] = settings["creds"]
    elif "nkey" in settings:
        _check_nkey_seed(settings["nkey"])
        options["nkeys_seed"] = settings["nkey"]
    elif "user" in settings:
        keep_secret(settings["password"])
        options["user"], options["password"] = settings["user"], settings["password"]
    elif "token" in settings:
        keep_secret(settings["token"])
        options["token"] = settings["token"]
    context = options.get("tls")
    if isinstance(context, AskedTls):
        context.asked_by = _why_tls(url, settings)
    return options


def _why_tls(url: str | None, settings: dict[str, str]) -> str:
    files = [field for field in TLS_FIELDS if field in settings]
    if files:
        return f"the TLS {'/'.join(files)} file{'s' if len(files) > 1 else ''} given"
    return "the tls:// URL" if url and "tls://" in url.lower() else "the URL"


def presented_credentials(url: str | None = None) -> str:
    """What a connection to url presents to the broker, in words fit to print: the kind
    of credentials, the file or user name, and where they come from, never the secret
    itself."""
    try:
        settings, source = connection_settings(url)
    except ValueError as error:
        return f"credentials that cannot be read ({error})"
    where = "" if source == "given" else f", from {source}"
    if "creds" in settings:
        return f"the creds file {settings['creds']}{where}"
    if "nkey" in settings:
        return f"the nkey seed in {settings['nkey']}{where}"
    if "user" in settings:
        return f"user {settings['user']!r} and a password{where}"
    if "token" in settings:
        return f"a token{where}"
    if url_has_credentials(url):
        return "the credentials in the URL"
    return ("no credentials (give --creds, --nkey, --user/--password, --token or "
            "--context)")


def _nkeys() -> Any:
    try:
        import nkeys
    except ImportError:
        raise MissingDependency("a creds file or an nkey seed needs the nkeys package: "
                                f"{NKEYS_INSTALL}") from None
    return nkeys


def _read(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as file:
            return file.read()
    except OSError as error:
        raise ValueError(f"cannot read the {what} {path!r}: "
                         f"{error.strerror or error}") from None


def _check_nkey_seed(path: str) -> None:
    """Refuse a seed file that is not one now, rather than at every connect attempt
    (never quoting what the file holds)."""
    nkeys = _nkeys()
    seed = bytearray(_read(path, "nkey seed file").strip())
    try:
        pair = nkeys.from_seed(seed)
    except (nkeys.NkeysError, ValueError, TypeError):
        raise ValueError(f"{path!r} does not hold an nkey seed (a line starting with "
                         "'SU', as `nk -gen user` writes)") from None
    finally:
        seed[:] = bytes(len(seed))
    pair.wipe()


def _check_creds_file(path: str) -> None:
    """Refuse a file that is not a creds file now: nats-py reads it at every connect
    attempt and, without its JWT marker, reads it for ever (aio/client.py
    _read_creds_user_jwt loops past the end of the file)."""
    _nkeys()
    text = _read(path, "creds file")
    if b"BEGIN NATS USER JWT" not in text or b"BEGIN USER NKEY SEED" not in text:
        raise ValueError(f"{path!r} is not a NATS creds file (a user JWT and its nkey "
                         "seed, as `nsc generate creds` writes)")


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
    url: str | None = None,
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
        url: the broker, when known (auth_options).

    Returns:
        A fresh dict of keyword arguments, without servers (the caller passes the URL).

    Raises:
        ValueError: if timeout is not a finite number > 0; as auth_options.
        MissingDependency: as auth_options.
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
            **auth_options(url),
        }
    return {
        "allow_reconnect": True,
        "max_reconnect_attempts": RETRY_RECONNECT_ATTEMPTS,
        "reconnect_time_wait": RETRY_RECONNECT_WAIT,
        "connect_timeout": min(FAIL_FAST_CONNECT_TIMEOUT, float(timeout)),
        "error_cb": error_cb,
        **auth_options(url),
    }


async def quiet_error_cb(_e: BaseException) -> None:
    """Silences the client's per-attempt error logging; the read-back reports the failure
    itself."""
    return None


__all__ = [
    "CONTEXT_ENV",
    "CREDENTIAL_FIELDS",
    "CREDS_ENV",
    "FAIL_FAST_CONNECT_TIMEOUT",
    "FAIL_FAST_RECONNECT_ATTEMPTS",
    "FAIL_FAST_RECONNECT_WAIT",
    "RETRY_RECONNECT_ATTEMPTS",
    "NKEYS_INSTALL",
    "NKEY_ENV",
    "PASSWORD_ENV",
    "RETRY_RECONNECT_WAIT",
    "SETTING_ENV",
    "TLS_CA_ENV",
    "TLS_CERT_ENV",
    "TLS_FIELDS",
    "TLS_KEY_ENV",
    "TOKEN_ENV",
    "USER_ENV",
    "AskedTls",
    "auth_options",
    "connect_options_for",
    "connection_settings",
    "presented_credentials",
    "context_name",
    "context_url",
    "quiet_error_cb",
    "tls_options",
    "tls_required",
    "url_has_credentials",
]
