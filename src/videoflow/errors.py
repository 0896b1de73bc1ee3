"""The error tree: one root, a few families, codes carried as data."""


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


class EmbeddedServerError(VideoflowError, RuntimeError):
    """The embedded nats-server could not be found or did not start. The message
    quotes the server's own fatal log lines when it wrote any."""
