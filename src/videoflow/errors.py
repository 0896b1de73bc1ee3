"""The error tree: one root, a few families, codes carried as data."""

from collections.abc import Iterable


class VideoflowError(Exception):
    """Root of every error videoflow raises on purpose.

    Attributes:
        retryable: whether waiting and trying again can succeed; read by the retry ladder.
    """

    retryable: bool = False


class WireError(VideoflowError, ValueError):
    """Bytes that are not a valid envelope: truncated, mistyped, missing a field, or
    written by a future wire version. A ``ValueError`` so callers that only know the
    standard library still catch it."""


class CodecError(WireError):
    """An encoded array that cannot be read where it arrived: its codec's bytes do
    not decode, or the codec (or its library) is not installed on this reader. The
    input is dead-lettered with this reason, so it can be replayed once the reader
    can read it."""


class EmbeddedServerError(VideoflowError, RuntimeError):
    """The embedded nats-server could not be found or did not start. The message
    quotes the server's own fatal log lines when it wrote any."""


class BrokerUnavailable(VideoflowError, ConnectionError):
    """The broker cannot serve what was asked: it did not answer, or a resource the
    caller needs (a run's stream) does not exist there. Retryable: the remedy is
    usually to wait for the broker, or for provisioning, and try again.

    Attributes:
        code: the broker's own error code when it gave one (a JetStream err_code),
            else None.
    """

    retryable = True

    def __init__(self, message: str, *, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


class CredentialsRefused(BrokerUnavailable):
    """The broker refused this client's credentials (an authorization violation): a
    wrong or missing password, token, nkey or creds file, or a user the broker does not
    know. Not retryable: waiting does not make the credentials right. The message never
    holds the secret."""

    retryable = False


class MissingDependency(VideoflowError, ImportError):
    """An optional package a feature needs is not installed; the message names the
    package to install (``pip install nkeys``), whichever way videoflow was installed."""


class NodeNotRunning(VideoflowError, RuntimeError):
    """A node's run-time state (``node.context``) was read outside a run: the replica
    running the node sets it before open(), so it is there in open(), next(),
    process(), consume() and close(), and nowhere else (in ``__init__``, say, or
    on a node the flow only describes). The message names the node."""


class TLSRefused(CredentialsRefused):
    """A TLS connection that cannot be made as it was asked for, and that waiting will
    not mend: the broker does not offer TLS although a tls:// URL or TLS files ask for
    it (nothing is sent to it then, credentials least of all), its certificate is not
    trusted, or it asks for a client certificate that was not given or refuses the one
    given. A CredentialsRefused, the refusal of an identity by either side, so that
    whatever ends at once on refused credentials (the commands' one error line, the
    connects that otherwise retry) ends at once on it too."""


class RunNotKept(VideoflowError, ValueError):
    """A resume named a run whose streams are not on the broker: it never ran there,
    it was torn down, or it is another flow's. Nothing is started: a fresh start
    under that id would publish every output again."""


class StartMethodError(VideoflowError, ValueError):
    """The local engine cannot start replicas as asked: VIDEOFLOW_START_METHOD names a
    start method this platform lacks, or the replica server imported videoflow under
    another pure-Python switch than the engine now sets (videoflow.native)."""


class PayloadsElsewhere(VideoflowError, RuntimeError):
    """A replica was asked to join a run whose payloads are in shared memory it cannot
    see: the run was provisioned with its payloads in one host's /dev/shm, and this
    process runs on another host (or in another mount namespace). It would publish
    refs no other replica could read, and wait for ones it can never read. Nothing is
    started; the message names the remedy."""


class RunExists(VideoflowError, ValueError):
    """A new run was given the id of a run that holds it on the broker: its streams are
    there (running, or kept after it ended), its record has not ended (starting,
    running, or its engine ended without a word), or another run claimed the id at the
    same moment. Started afresh it would take the other's durables over, or mix the
    kept one's messages into its own. Nothing is started."""


class JoinIncomplete(VideoflowError, RuntimeError):
    """A join gave up on the group an input was in (missing='dead_letter'): its dead
    letter's error, saying why."""


class IncompatibleProfile(VideoflowError, ValueError):
    """A channel definitely does not carry the messaging profile asked of it: its
    effective configuration contradicts the profile (an immutable mismatch such as
    retention or replicas), or the profile is not one this broker can promise.
    Not retryable: waiting does not change a stream's retention.

    Attributes:
        channel: the channel (node name) the request was for, or "" when unknown.
        profile: the profile that was requested.
        findings: each way the effective configuration contradicts the profile.
    """

    def __init__(
        self,
        message: str,
        *,
        channel: str = "",
        profile: str = "",
        findings: Iterable[str] = (),
    ) -> None:
        super().__init__(message)
        self.channel = channel
        self.profile = profile
        self.findings = tuple(findings)


class PayloadMissing(VideoflowError, KeyError):
    """A payload ref the store does not hold: never put there, reclaimed when its last
    obligation was released, or lapsed with its TTL. A ``KeyError`` so callers of the
    older BlobStore contract still catch it. Not retryable: a reclaimed payload does
    not come back.

    Attributes:
        ref: the ref that was asked for.
    """

    def __init__(self, message: str, *, ref: str = "") -> None:
        super().__init__(message)
        self.ref = ref

    def __str__(self) -> str:
        # KeyError.__str__ quotes its argument; this one is a sentence, not a key.
        return str(self.args[0]) if self.args else ""


class UnobservableState(VideoflowError, RuntimeError):
    """Something that had to be observed could not be: the broker did not answer, or
    answered with something unreadable, so no guarantee can be claimed. Retryable:
    a later read may succeed.

    Attributes:
        reason: the Unknown vocabulary's reason (timeout, auth, unreachable, api,
            malformed, unread, missing).
        detail: what the failed read reported.
    """

    retryable = True

    def __init__(self, message: str, *, reason: str = "", detail: str = "") -> None:
        super().__init__(message)
        self.reason = reason
        self.detail = detail


class LedgerError(VideoflowError, RuntimeError):
    """A runtime ledger (videoflow.core.runtime.FlowRuntime) write was refused. The
    family of RevisionConflict, SupersededOwner and DurabilityUnavailable."""


class RevisionConflict(LedgerError):
    """A compare-and-swap on a ledger record lost: the record was created or updated
    by someone else since the caller read it (or already existed on a create).
    Retryable: read the record again and redo the change.

    Attributes:
        key: the store key of the record.
        expected_revision: the revision the write was conditioned on; None for a
            create-only write.
    """

    retryable = True

    def __init__(self, message: str, *, key: str = "",
                 expected_revision: int | None = None) -> None:
        super().__init__(message)
        self.key = key
        self.expected_revision = expected_revision


class SupersededOwner(LedgerError):
    """A newer owner claimed this node replica's ledger, so this runtime may no longer
    write to it (RFC 0006 RUN-023). Not retryable: the process holding the old epoch
    must stop acting as the owner.

    Attributes:
        epoch: the epoch this runtime claimed (None when it never claimed one).
        current_epoch: the newest epoch in the ledger.
    """

    def __init__(self, message: str, *, epoch: int | None = None,
                 current_epoch: int | None = None) -> None:
        super().__init__(message)
        self.epoch = epoch
        self.current_epoch = current_epoch


class DurabilityUnavailable(LedgerError):
    """A write that promises durability was asked of a ledger whose records die with
    the process (a memory store): refused rather than faked (RFC 0006 RUN-022). Not
    retryable: configure a durable, shared store."""
