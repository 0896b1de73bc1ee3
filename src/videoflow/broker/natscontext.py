"""The nats CLI's contexts: a named JSON file under the user's configuration directory
(``$XDG_CONFIG_HOME/nats/context/NAME.json``, else ``~/.config/nats/context``) holding a
broker's URL and credentials. videoflow reads one only when it is named (--context or
VIDEOFLOW_NATS_CONTEXT): the nats CLI's selected context (``context.txt``) is never
applied behind the operator's back."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Final

CONTEXT_FIELDS: Final = ("url", "user", "password", "creds", "nkey", "token", "cert", "key",
                         "ca")
"""The fields of a context videoflow takes; the rest (description, jetstream_domain,
...) are left alone."""

FILE_FIELDS: Final = ("creds", "nkey", "cert", "key", "ca")
"""The fields that name a file: '~' in them is the home directory, as for the nats CLI."""


def context_directory(environ: Mapping[str, str] | None = None) -> Path:
    """Where the nats CLI keeps its contexts.

    Arguments:
        environ: the environment to read (XDG_CONFIG_HOME); os.environ when None.
    """
    environ = os.environ if environ is None else environ
    base = environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "nats" / "context"


def read_context(name: str, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The URL and credentials a named nats context holds.

    Arguments:
        name: the context's name, as `nats context ls` shows it.
        environ: the environment to read; os.environ when None.

    Returns:
        field -> value for each of CONTEXT_FIELDS the context sets (non-empty strings;
        files with '~' expanded).

    Raises:
        ValueError: a name that is not a plain file name, no such context, a file that
            cannot be read or is not a JSON object, or one that names its credentials
            through nsc (which videoflow does not resolve).
    """
    if not name or name in (".", "..") or "/" in name or os.sep in name:
        raise ValueError(f"not a nats context name: {name!r}")
    path = context_directory(environ) / f"{name}.json"
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ValueError(f"no nats context {name!r} (no file {path})") from None
    except OSError as error:
        raise ValueError(f"cannot read the nats context {name!r} ({path}): "
                         f"{error.strerror or error}") from None
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"the nats context {name!r} ({path}) is not JSON: {error.msg} "
                         f"(line {error.lineno})") from None
    if not isinstance(document, dict):
        raise ValueError(f"the nats context {name!r} ({path}) is not a JSON object")
    if document.get("nsc"):
        raise ValueError(f"the nats context {name!r} takes its credentials from nsc, which "
                         "videoflow does not read: give the creds file (--creds) instead")
    found: dict[str, str] = {}
    for field in CONTEXT_FIELDS:
        value = document.get(field)
        if value is None or value == "":
            continue
        if not isinstance(value, str):
            raise ValueError(f"the nats context {name!r} ({path}): {field} is not a string")
        found[field] = os.path.expanduser(value) if field in FILE_FIELDS else value
    return found


__all__ = ["CONTEXT_FIELDS", "FILE_FIELDS", "context_directory", "read_context"]
