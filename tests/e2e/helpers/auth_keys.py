"""NATS credentials made in the test, with the nkeys package: user nkey seeds, and for
a creds file the decentralized setup nats-server requires for one (a creds file is a
user JWT and its seed; the server takes a JWT only from an operator it trusts, with the
account's JWT preloaded: `resolver: MEMORY`). A JWT is base64url JSON, header and
claims, signed (ed25519) by the issuer's nkey."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

import nkeys


def key_pair(prefix: int) -> tuple[Any, str]:
    """A fresh key pair of the kind prefix names (nkeys.PREFIX_BYTE_USER, ...) and its
    seed as text."""
    seed = nkeys.encode_seed(os.urandom(32), prefix)
    return nkeys.from_seed(bytearray(seed)), seed.decode()


def public(pair: Any) -> str:
    return pair.public_key.decode()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def jwt(issuer: Any, subject: str, name: str, nats: dict[str, Any]) -> str:
    """A JWT for subject, with the claims nats-server reads, signed by issuer."""
    claims: dict[str, Any] = {"iat": int(time.time()), "iss": public(issuer), "name": name,
                              "sub": subject, "nats": {**nats, "version": 2}}
    claims["jti"] = base64.b32encode(
        hashlib.sha256(json.dumps(claims, sort_keys=True).encode()).digest()
    ).decode().rstrip("=")
    header = _b64(json.dumps({"typ": "JWT", "alg": "ed25519-nkey"}).encode())
    body = _b64(json.dumps(claims).encode())
    signature = _b64(issuer.sign(f"{header}.{body}".encode()))
    return f"{header}.{body}.{signature}"


UNLIMITED = {"subs": -1, "data": -1, "payload": -1}
ACCOUNT_LIMITS = {**UNLIMITED, "imports": -1, "exports": -1, "wildcards": True, "conn": -1,
                  "leaf": -1, "mem_storage": -1, "disk_storage": -1, "streams": -1,
                  "consumer": -1}


class Operator:
    """An operator, its system account (JetStream will not start without one) and one
    account with JetStream, as nats-server's config preloads them; users of the account
    are made with user_creds."""

    def __init__(self) -> None:
        self.operator, _ = key_pair(nkeys.PREFIX_BYTE_OPERATOR)
        self.account, _ = key_pair(nkeys.PREFIX_BYTE_ACCOUNT)
        self.system, _ = key_pair(nkeys.PREFIX_BYTE_ACCOUNT)
        self.operator_jwt = jwt(self.operator, public(self.operator), "videoflow-test",
                                {"type": "operator"})
        self.account_jwt = jwt(self.operator, public(self.account), "flows",
                               {"type": "account", "limits": ACCOUNT_LIMITS,
                                "default_permissions": {"pub": {}, "sub": {}}})
        self.system_jwt = jwt(self.operator, public(self.system), "SYS",
                              {"type": "account", "limits": {**UNLIMITED, "conn": -1}})

    def server_config(self) -> str:
        return (f"operator: {self.operator_jwt}\n"
                f"system_account: {public(self.system)}\n"
                "resolver: MEMORY\n"
                "resolver_preload: {\n"
                f"  {public(self.account)}: {self.account_jwt}\n"
                f"  {public(self.system)}: {self.system_jwt}\n"
                "}\n")

    def user_creds(self, path: Path, signer: Any | None = None) -> str:
        """Write a creds file for a fresh user of the account (signed by signer, the
        account's key unless given) to path; returns the user's seed."""
        user, seed = key_pair(nkeys.PREFIX_BYTE_USER)
        token = jwt(signer or self.account, public(user), "vf",
                    {"type": "user", "pub": {}, "sub": {}, **UNLIMITED})
        path.write_text(
            "-----BEGIN NATS USER JWT-----\n"
            f"{token}\n"
            "------END NATS USER JWT------\n\n"
            "************************* IMPORTANT *************************\n"
            "NKEY Seed printed below can be used to sign and prove identity.\n\n"
            "-----BEGIN USER NKEY SEED-----\n"
            f"{seed}\n"
            "------END USER NKEY SEED------\n")
        return seed
