"""Broker addresses: a server list split into its servers, and a URL fit to print.

A password or token may hold any character, so both err on the side of the secret:
a comma or '@' inside one stays inside it.
"""

from __future__ import annotations

import re
from typing import Final
from urllib.parse import urlsplit

_SCHEME: Final = re.compile(r"^[a-z][a-z0-9+.-]*://", re.IGNORECASE)


_BOUNDARY: Final = re.compile(r",(?=\s*[a-z][a-z0-9+.-]*://)", re.IGNORECASE)
"""A comma that surely separates two servers: the next one starts with a scheme."""

_AUTHORITY_START: Final = re.compile(r"^\s*(?:[a-z][a-z0-9+.-]*://)?", re.IGNORECASE)

_PLAIN_SERVER: Final = re.compile(
    r"\s*(?:[a-z][a-z0-9+.-]*://)?(?:[a-z0-9._-]+|\[[0-9a-f:.]+\])(?::\d*)?/?\s*",
    re.IGNORECASE)
"""A server with no user part: [scheme://]host[:port]."""


def redact_url(url: str) -> str:
    """A broker address fit to print or log: in each of its servers, a password is
    replaced by '***' (nats://user:***@host), and so is a token (nats://***@host: a
    user part with no password is how a URL carries a token).

    A password may hold any character, ',' and '@' included, so what is masked errs
    wide: a server's user part runs to the last '@' before the next server that starts
    with a scheme (',nats://'), which is the only comma taken to surely separate two
    servers; the user name is kept only when it holds no '@' or ',' (else it may be
    another server's token, and all of it is masked). A list without schemes whose
    servers carry credentials shows the last host only.

    Arguments:
        url: one server URL or several, comma-separated (servers_of); anything else is
            returned with the same masking applied wherever an '@' follows a user part.
    """
    if not isinstance(url, str):
        return repr(url)
    return ",".join(_redact_server(chunk) for chunk in _BOUNDARY.split(url))


def _redact_server(text: str) -> str:
    start = _AUTHORITY_START.match(text)
    begin = start.end() if start else 0
    at = text.rfind("@", begin)
    if at < 0:
        return text
    user, colon, _ = text[begin:at].partition(":")
    shown = f"{user}:***" if colon and not any(c in user for c in "@,") else "***"
    return f"{text[:begin]}{shown}{text[at:]}"


def servers_of(url: str) -> list[str]:
    """The server URLs of a broker address: one URL, or several separated by commas
    (and optional spaces), as the NATS tools take them — a cluster's seed servers.

    A comma inside a password stays in it: a server with a scheme and no user part
    yet, or that is no plain host[:port], takes in the pieces after it up to the first
    with an '@' ('nats://u:a,b@h' is one server), as long as none starts with a scheme.

    Arguments:
        url: e.g. 'nats://a:4222' or 'nats://a:4222,nats://b:4222'; a server without
            a scheme is taken as nats://.

    Returns:
        The URLs, in the order given.

    Raises:
        ValueError: no server at all, or an empty entry ('a,,b'); a server that is no
            broker URL (check_server): its message names the server and what is wrong.
    """
    if not isinstance(url, str) or not url.strip():
        raise ValueError(f"a broker URL is required, got {redact_url(url)!r}")
    pieces = url.split(",")
    servers: list[str] = []
    i = 0
    while i < len(pieces):
        server, i = pieces[i], i + 1
        if "@" not in server and (_SCHEME.match(server.strip())
                                  or not _PLAIN_SERVER.fullmatch(server)):
            j = i
            while j < len(pieces) and "@" not in pieces[j] and not _SCHEME.match(
                    pieces[j].strip()):
                j += 1
            if j < len(pieces) and not _SCHEME.match(pieces[j].strip()):
                server, i = ",".join(pieces[i - 1:j + 1]), j + 1
        servers.append(server.strip())
    if any(not part for part in servers):
        raise ValueError(f"empty server in the URL list {redact_url(url)!r}")
    for server in servers:
        check_server(server)
    servers = [part if _SCHEME.match(part) else f"nats://{part}" for part in servers]
    if len({urlsplit(server).scheme.lower() in _WEBSOCKET for server in servers}) > 1:
        raise ValueError(f"the URL list {redact_url(url)!r} mixes websocket (ws://, "
                         f"wss://) and other servers; a connection takes one kind")
    return servers


SCHEMES: Final = ("nats", "tls", "ws", "wss")
"""The schemes a broker URL may have, as nats-py takes them."""

_WEBSOCKET: Final = ("ws", "wss")

_HOST: Final = re.compile(r"[a-z0-9._~%-]+", re.IGNORECASE)


def check_server(server: str) -> None:
    """Refuse a server URL nats-py would not reach, before anything connects to it: it
    would take 'http://h:4222' for the host 'http' and 'not a url' for a host name with
    spaces in it, and report only that the name did not resolve.

    Arguments:
        server: one server; without a scheme, nats:// is meant.

    Raises:
        ValueError: the scheme is not one of SCHEMES, the host is missing or no host
            name (spaces, quotes, ...), or the port is not a number from 0 to 65535;
            the message names the server (its secrets masked) and what is wrong.
    """
    shown = redact_url(server)
    if not _SCHEME.match(server):
        server = f"nats://{server}"
    scheme = server.partition("://")[0]
    if scheme.lower() not in SCHEMES:
        raise ValueError(f"the broker URL {shown!r} has the scheme {scheme + '://'!r}; a "
                         f"NATS server is reached by nats://, tls://, ws:// or wss://")
    try:
        parts = urlsplit(server)
        host, _port = parts.hostname, parts.port
    except ValueError as error:  # a port that is no number, or out of range; bad IPv6
        raise ValueError(f"the broker URL {shown!r} is malformed: {error}") from None
    if not host:
        raise ValueError(f"the broker URL {shown!r} names no host")
    if ":" not in host and not _HOST.fullmatch(host):  # an IPv6 address has colons
        what = ("a host name holds no spaces" if any(c.isspace() for c in host)
                else f"{host!r} is not a host name")
        raise ValueError(f"the broker URL {shown!r} is malformed: {what}")


__all__ = ["SCHEMES", "check_server", "redact_url", "servers_of"]
