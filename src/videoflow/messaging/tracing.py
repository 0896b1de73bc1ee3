"""Tracing: the W3C trace context every published envelope carries, and OpenTelemetry
spans for a node's receive, process, publish and settle (the optional ``tracing``
extra: ``pip install opentelemetry-api``).

The header. Every envelope a node publishes carries a ``traceparent`` NATS header
(``00-<32 hex trace id>-<16 hex span id>-<2 hex flags>``, W3C Trace Context), whether
or not anything records spans, so any reader of the stream -- a videoflow node or not
-- can continue the trace. A producer's output starts a trace; a processor's output
continues its input's; a join's output continues one member's: its first parent's in
wiring order (the first member present, for a quorum group), and its spans link every
member's context. A dead letter carries its input's header as it came, and an end
marker a trace of its own (NodeTracing.marker). The header is the only change on the
wire: the envelope (msgpack) is untouched, so every reader decodes it as before.

Trace ids. The envelope's own ``trace_id`` is videoflow's lineage id -- what trace
joins group by -- and not always a W3C trace id: a live producer mints 32 hex digits,
which are used as they are; a replayable producer mints '<node>:src:<offset>' and a
time join 'tg-<16 hex>', which map to the first 128 bits of their BLAKE2b digest
(w3c_trace_id: deterministic, so the same lineage gets the same trace id in every
process). The lineage id is never changed; the W3C ids travel beside it in the header.

Two paths, chosen once per node replica when its messenger is built (NodeTracing):

- no tracer provider configured -- opentelemetry-api not installed, or installed with
  its default provider (the proxy, or the no-op one): no span is made, and the header
  costs one string format per output (and a parse per input group). A producer's
  output gets the trace id of its lineage (above) and a random span id; a processor's
  output the trace id and flags of its input's header and a random span id (the
  lineage's trace id when the input came without a header). The flags of a trace
  started here say sampled, so that a reader whose tracer samples by its parent
  records it.
- a real provider (an SDK's TracerProvider set with ``trace.set_tracer_provider``):
  spans per the OpenTelemetry messaging conventions (messaging.system 'nats'), named
  '<operation> <node>' (the node publishing, or the node receiving: low cardinality;
  the subject is messaging.destination.name), with the node, replica, flow and run as
  videoflow.* attributes:

  ``publish`` (PRODUCER): one per output, from its encoding until it is handed to the
  backend (its receipt resolves later, in the publication window); its context is the
  output's header. A producer's is a root, or a child of the span current around its
  next(); a processor's is a child of its group's ``process``.
  ``receive`` (CLIENT): one per input group, from its first member's arrival to its
  hand-out (for a join: the assembly), a child of the continued member's publish span,
  linked to every member's.
  ``process`` (CONSUMER): the node's work on the group, from its hand-out until it is
  acknowledged or failed; a child of the continued member's publish span, linked to
  every member's; current (context.attach) while the node runs, so a span the node
  starts is its child.
  ``settle`` (CLIENT): a child of ``process``. For an acknowledged group, from the
  node's done until the broker confirmed every ack (acks wait for the group's outputs
  to be accepted and go in batches; messaging.operation.name 'ack',
  videoflow.settle.result 'confirmed' or 'unknown'); for a failed group, the delivery
  policy's verdicts (messaging.operation.name 'nak').

  A member without a header (a publisher that does not trace) is continued from ids
  derived from its lineage (w3c_trace_id, and a span id from the same digest), so the
  trace id matches what the fast path would have given it.

VIDEOFLOW_TRACING=off turns both off: no header, no span (a flow whose readers must
not see trace ids, or a measurement of what tracing costs).

Replicas that run as processes of their own (flow.run spawns them) configure their
tracer at start: VIDEOFLOW_TRACING_SETUP='module:function' names a function of no
arguments that sets a provider; it is called once per process, before the first node
replica looks for one. Whoever sets it asked for spans, so a setting that cannot give
any is an error, never a silent run without them: the engine checks it once before it
starts a replica (check_setup: its module imported, the function found, not called;
opentelemetry-api installed), and each replica checks it again as it calls the
function (active_tracer), which also turns an ImportError the function raises into a
MissingDependency naming what is missing.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import random
import re
import time
from collections.abc import Callable, Sequence
from typing import Any, Final, Protocol

from videoflow.backends.messaging import Delivery
from videoflow.errors import MissingDependency, VideoflowError

TRACEPARENT_HEADER: Final = "traceparent"
"""The NATS header the trace context travels in (W3C Trace Context's name)."""

TRACING_ENV: Final = "VIDEOFLOW_TRACING"
"""'off' (or 0, false, no): no traceparent header and no span, in every node replica
that starts with it set."""

SETUP_ENV: Final = "VIDEOFLOW_TRACING_SETUP"
"""'module:function': called once per process to configure a tracer provider."""

INSTRUMENTATION_NAME: Final = "videoflow"
"""The tracer's (instrumentation scope's) name."""

API_INSTALL: Final = "pip install opentelemetry-api"
"""What installs the OpenTelemetry API the spans are made with (the tracing extra)."""


class TracingSetupError(VideoflowError, ValueError):
    """VIDEOFLOW_TRACING_SETUP names no function that can be called: it is not
    'module:function', its module is not found or raised as it was imported, or the
    module has no such function. A ValueError, as the videoflow command's other usage
    errors (one line, exit code 2). Not retryable."""

_HEX32 = re.compile(r"[0-9a-f]{32}")
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")
# Version 00, exactly: what every input group's header is read with first (half the
# cost of the general pattern and its checks, once per group on a processor).
_TRACEPARENT_00 = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_ZERO_TRACE, _ZERO_SPAN = "0" * 32, "0" * 16
_getrandbits = random.getrandbits
_set_up = False
_provider: Any = None  # use_tracer_provider's, over OpenTelemetry's global one


def use_tracer_provider(provider: Any) -> None:
    """Send the spans of the messengers made from now on in this process to provider
    instead of OpenTelemetry's global one (which can be set only once per process);
    None goes back to the global one. As instrumentation libraries take a
    tracer_provider: for a program, or a test, that keeps its own."""
    global _provider
    _provider = provider


def w3c_trace_id(lineage: str) -> str:
    """The W3C trace id of a videoflow lineage id (an envelope's trace_id).

    Arguments:
        lineage: the envelope's trace_id.

    Returns:
        lineage itself when it is 32 lowercase hex digits (not all zero), else the
        first 32 hex digits of its BLAKE2b digest: the same in every process.
    """
    if len(lineage) == 32 and lineage != _ZERO_TRACE and _HEX32.fullmatch(lineage):
        return lineage
    return _digest(lineage)[:32]


def _digest(lineage: str) -> str:
    """48 hex digits: a lineage's trace id (the first 32), then its span id."""
    digest = hashlib.blake2b(lineage.encode(), digest_size=24).hexdigest()
    if digest[:32] == _ZERO_TRACE or digest[32:] == _ZERO_SPAN:  # never in practice
        digest = hashlib.blake2b(digest.encode(), digest_size=24).hexdigest()
    return digest


def new_span_id() -> str:
    """A random span id: 16 hex digits, never all zero."""
    # to_bytes().hex() costs about half of a 016x format, and this is per output.
    return (_getrandbits(64) or 1).to_bytes(8, "little").hex()


def format_traceparent(trace_id: str, span_id: str, flags: str = "01") -> str:
    """A version 00 traceparent header value.

    Arguments:
        trace_id / span_id: 32 and 16 lowercase hex digits.
        flags: 2 hex digits ('01': sampled).
    """
    return f"00-{trace_id}-{span_id}-{flags}"


def parse_traceparent(value: str | None) -> tuple[str, str, str] | None:
    """The (trace id, span id, flags) of a traceparent header value, or None when it is
    absent or not valid W3C Trace Context (version ff, a version 00 value with more
    fields, an all-zero id, upper-case or short hex)."""
    if value is None:
        return None
    match = _TRACEPARENT_00.fullmatch(value)
    if match is not None:
        trace_id, span_id, flags = match.groups()
    else:
        match = _TRACEPARENT.fullmatch(value)
        if match is None:
            return None
        version, trace_id, span_id, flags, rest = match.groups()
        if version == "ff" or (version == "00" and rest is not None):
            return None
    if trace_id == _ZERO_TRACE or span_id == _ZERO_SPAN:
        return None
    return trace_id, span_id, flags


def _continued(traceparent: str | None, lineage: str) -> tuple[str, str, str]:
    """The context a member continues: its header's, else one derived from its lineage
    (w3c_trace_id, and a span id from the same digest), sampled."""
    parsed = parse_traceparent(traceparent)
    if parsed is not None:
        return parsed
    return w3c_trace_id(lineage), _digest(lineage)[32:], "01"


def tracing_off() -> bool:
    """Whether VIDEOFLOW_TRACING turns the header and the spans off."""
    return os.environ.get(TRACING_ENV, "").strip().lower() in ("off", "0", "false", "no")


def check_setup() -> None:
    """Check, without calling it, that VIDEOFLOW_TRACING_SETUP names a function the
    node replicas can call and that spans can be made: the engine does, once, before it
    starts a replica, so that a mistake is one error rather than one traceback per
    replica. Nothing is checked when the variable is unset or empty, or with tracing
    off (VIDEOFLOW_TRACING), when the replicas do not call it.

    Imports the function's module (what its import does, it does in this process
    too) and opentelemetry-api.

    Raises:
        TracingSetupError: not 'module:function'; the module is not found or raised
            as it was imported; it has no such function.
        MissingDependency: opentelemetry-api is not installed, or the module imports
            a package that is not.
    """
    setup = os.environ.get(SETUP_ENV, "").strip()
    if not setup or tracing_off():
        return
    _require_api(setup)
    _setup_function(setup)


def _require_api(setup: str) -> None:
    """Raises MissingDependency when opentelemetry-api cannot be imported."""
    try:
        from opentelemetry import trace  # noqa: F401
    except ImportError as error:
        raise MissingDependency(
            f"{SETUP_ENV}={setup!r} asks for spans, but opentelemetry-api is not "
            f"installed ({error}): {API_INSTALL}, or unset {SETUP_ENV}") from error


def _setup_function(setup: str) -> Callable[[], Any]:
    """The function setup ('module:function') names, its module imported.

    Raises:
        TracingSetupError / MissingDependency: as check_setup.
    """
    module_name, sep, name = setup.partition(":")
    if not sep or not module_name.strip() or not name.strip():
        raise TracingSetupError(f"{SETUP_ENV} must be 'module:function', got {setup!r}")
    module_name, name = module_name.strip(), name.strip()
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        missing = error.name or ""
        if missing and (module_name == missing or module_name.startswith(missing + ".")):
            raise TracingSetupError(f"{SETUP_ENV}={setup!r}: cannot import "
                                    f"{module_name!r}: {error}") from error
        raise _missing(setup, f"importing {module_name!r}", error) from error
    except Exception as error:  # the module's own code raised as it was imported
        raise TracingSetupError(f"{SETUP_ENV}={setup!r}: cannot import {module_name!r}: "
                                f"{type(error).__name__}: {error}") from error
    function = getattr(module, name, None)
    if function is None:
        raise TracingSetupError(f"{SETUP_ENV}={setup!r}: {module_name!r} has no "
                                f"attribute {name!r}")
    if not callable(function):
        raise TracingSetupError(f"{SETUP_ENV}={setup!r}: {module_name}.{name} is a "
                                f"{type(function).__name__}, not a function")
    return function


def _missing(setup: str, doing: str, error: ImportError) -> MissingDependency:
    """The error for an ImportError the setup's module or function raised: what is
    missing, and what installs it when it is OpenTelemetry's."""
    # The first missing module of a dotted import is the one named: 'opentelemetry.sdk'
    # when the SDK is not installed, whatever was imported from it.
    hint = {"opentelemetry": f": {API_INSTALL}",
            "opentelemetry.sdk": ": pip install opentelemetry-sdk"}.get(error.name or "", "")
    return MissingDependency(f"{SETUP_ENV}={setup!r}: {doing} failed, "
                             f"{type(error).__name__}: {error}{hint}")


def active_tracer() -> Any | None:
    """The OpenTelemetry tracer to make spans with, or None for the fast path: when
    no real provider is configured (after calling the VIDEOFLOW_TRACING_SETUP
    function, the first time), or opentelemetry-api is not installed and the variable
    is not set.

    Raises:
        TracingSetupError: VIDEOFLOW_TRACING_SETUP is not 'module:function', or names
            a module or function that does not exist (check_setup).
        MissingDependency: it is set but opentelemetry-api is not installed, or its
            module or function raised an ImportError (a package not installed).
    """
    global _set_up
    setup = os.environ.get(SETUP_ENV, "").strip() if not _set_up else ""
    try:
        from opentelemetry import trace
    except ImportError:
        if setup:
            _require_api(setup)  # raises: spans were asked for
        return None
    if not _set_up:
        _set_up = True
        if setup:
            function = _setup_function(setup)
            try:
                function()
            except ImportError as error:
                raise _missing(setup, f"calling {setup.partition(':')[2].strip()}()",
                               error) from error
    provider = _provider or trace.get_tracer_provider()
    if isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider)):
        return None
    return provider.get_tracer(INSTRUMENTATION_NAME)


class Member(Protocol):
    """What the messenger holds for one delivery of a group (its assembler handle)."""

    parent: str
    delivery: Delivery
    arrived: float  # time.monotonic() when it reached the assembler


class GroupSpans:
    """The spans of one input group (a real tracer's path).

    Attributes:
        process: its process span.
        context: the OpenTelemetry context of process (its outputs' parent).
        token: the attach token of context, detached when the group is done.
    """

    __slots__ = ("context", "process", "token")

    def __init__(self, process: Any, context: Any, token: Any) -> None:
        self.process, self.context, self.token = process, context, token


class GroupTrace:
    """One input group's trace, from its hand-out to its settlement (NodeTracing).

    Attributes:
        header / lineage: the continued member's traceparent and the group's lineage.
        trace_id / flags: what its outputs' headers continue; on the fast path None
            until continued() reads them from header (or lineage) at the first
            output: a consumer, which publishes nothing, never parses a header.
        spans: its spans; None on the fast path.
    """

    # One per input group on every node: positional and five slots, which costs a
    # third of what keyword arguments to seven did.
    __slots__ = ("flags", "header", "lineage", "spans", "trace_id")

    def __init__(self, header: str | None, lineage: str, trace_id: str | None = None,
                 flags: str = "01", spans: GroupSpans | None = None) -> None:
        self.header, self.lineage, self.trace_id, self.flags = header, lineage, trace_id, flags
        self.spans = spans

    def continued(self) -> tuple[str, str]:
        """(trace id, flags) the group's outputs continue: its member's header's, or its
        lineage's trace id, sampled, when that header is absent or not valid."""
        if self.trace_id is None:
            parsed = parse_traceparent(self.header)
            if parsed is not None:
                self.trace_id, self.flags = parsed[0], parsed[2]
            else:
                self.trace_id, self.flags = w3c_trace_id(self.lineage), "01"
        return self.trace_id, self.flags


class NodeTracing:
    """One node replica's tracing (see the module docstring): the outputs' headers, and
    spans when a real tracer provider is configured.

    Arguments:
        node_name / replica_id / flow_id / run_id: the node replica and its run.
        subject: the subject its outputs are published on.
        parent_subjects: {parent: subject} of its inputs, in wiring order.
        tracer: the tracer to use; active_tracer() when None. False: none (the fast
            path whatever is configured).

    Attributes:
        enabled: spans are made (a real provider was configured).
    """

    def __init__(self, node_name: str, replica_id: int, flow_id: str, run_id: str,
                 subject: str, parent_subjects: dict[str, str], tracer: Any = None) -> None:
        self.node_name, self.subject = node_name, subject
        self._rank = {parent: index for index, parent in enumerate(parent_subjects)}
        self.off = tracing_off()
        self.tracer = None if self.off else (
            active_tracer() if tracer is None else (tracer or None))
        self.enabled = self.tracer is not None
        self.attributes: dict[str, Any] = {
            "messaging.system": "nats", "videoflow.node": node_name,
            "videoflow.replica": replica_id, "videoflow.flow": flow_id,
            "videoflow.run": run_id}
        self._consumer = {**self.attributes, "messaging.consumer.group.name": node_name}
        if len(parent_subjects) == 1:
            self._consumer["messaging.destination.name"] = next(iter(parent_subjects.values()))
        elif parent_subjects:
            self._consumer["videoflow.parents"] = list(parent_subjects)

    # ------------------------------------------------------------------ outputs

    def output(self, lineage: str, group: GroupTrace | None, msg_id: str,
               w3c_lineage: bool = False) -> tuple[str | None, Any]:
        """The traceparent of one output (None with tracing off), and its publish span
        (None on the fast path), to be ended with published once it is handed to the
        backend.

        Arguments:
            lineage: the output's envelope trace_id.
            group: its input group's trace; None for a producer's output.
            msg_id: its message id.
            w3c_lineage: the caller made lineage a valid W3C trace id (a live
                producer's), so it is not checked again.
        """
        if self.tracer is None:
            if self.off:
                return None, None
            if group is None:
                trace_id = lineage if w3c_lineage else w3c_trace_id(lineage)
                return f"00-{trace_id}-{new_span_id()}-01", None
            trace_id, flags = group.continued()
            return f"00-{trace_id}-{new_span_id()}-{flags}", None
        from opentelemetry.trace import SpanKind
        spans = None if group is None else group.spans
        span = self.tracer.start_span(
            f"publish {self.node_name}", None if spans is None else spans.context,
            SpanKind.PRODUCER, attributes={
                **self.attributes, "messaging.operation.type": "send",
                "messaging.operation.name": "publish",
                "messaging.destination.name": self.subject, "messaging.message.id": msg_id,
                "videoflow.trace_id": lineage})
        context = span.get_span_context()
        return format_traceparent(f"{context.trace_id:032x}", f"{context.span_id:016x}",
                                  f"{int(context.trace_flags):02x}"), span

    def marker(self, lineage: str) -> str | None:
        """The traceparent of an end marker (None with tracing off): a trace of its
        own, from its lineage (its message id), as any output carries one."""
        if self.off:
            return None
        return f"00-{w3c_trace_id(lineage)}-{new_span_id()}-01"

    @staticmethod
    def published(span: Any, size: int) -> None:
        """End an output's publish span (output) once it was handed to the backend."""
        if span is not None:
            span.set_attribute("messaging.message.body.size", size)
            span.end()

    # ------------------------------------------------------------------ input groups

    def begin_group(self, lineage: str, members: Sequence[Member]) -> GroupTrace:
        """An input group is handed to the node: what its outputs continue, and (with a
        tracer) its receive span, ended, and its process span, started and current.

        Arguments:
            lineage: the group's trace_id.
            members: every delivery backing the group (members and collect samples).
        """
        if self.off:
            return _UNTRACED
        first = members[0]
        if len(members) > 1:  # the first parent's, in wiring order
            rank = self._rank
            first = min(members, key=lambda m: rank.get(m.parent, len(rank)))
        if self.tracer is None:
            return GroupTrace(first.delivery.traceparent, lineage)
        return self._begin_spans(lineage, members, first)

    def _begin_spans(self, lineage: str, members: Sequence[Member], first: Member
                     ) -> GroupTrace:
        from opentelemetry import context as otel_context
        from opentelemetry import trace
        from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, SpanKind

        def remote(member: Member) -> Any:
            trace_id, span_id, flags = _continued(member.delivery.traceparent, lineage)
            return SpanContext(int(trace_id, 16), int(span_id, 16), is_remote=True,
                               trace_flags=trace.TraceFlags(int(flags, 16)))

        parent = trace.set_span_in_context(NonRecordingSpan(remote(first)))
        links = [Link(remote(member), {"videoflow.parent": member.parent})
                 for member in members]
        attributes = {**self._consumer, "videoflow.trace_id": lineage,
                      "messaging.batch.message_count": len(members)}
        now_ns, now = time.time_ns(), time.monotonic()
        arrived = min(member.arrived for member in members)
        tracer = self.tracer
        assert tracer is not None
        receive = tracer.start_span(
            f"receive {self.node_name}", parent, SpanKind.CLIENT, links=links,
            attributes={**attributes, "messaging.operation.type": "receive",
                        "messaging.operation.name": "receive"},
            start_time=now_ns - max(int((now - arrived) * 1e9), 0))
        receive.end(now_ns)
        process = tracer.start_span(
            f"process {self.node_name}", parent, SpanKind.CONSUMER, links=links,
            attributes={**attributes, "messaging.operation.type": "process",
                        "messaging.operation.name": "process"}, start_time=now_ns)
        context = trace.set_span_in_context(process)
        ids = process.get_span_context()
        return GroupTrace(first.delivery.traceparent, lineage, f"{ids.trace_id:032x}",
                          f"{int(ids.trace_flags):02x}",
                          GroupSpans(process, context, otel_context.attach(context)))

    def end_group(self, group: GroupTrace | None, operation: str) -> Any:
        """The node is done with a group: end its process span, and start its settle
        span (returned; None on the fast path), to be ended with settled.

        Arguments:
            operation: 'ack' (completed) or 'nak' (failed: the policy decides).
        """
        spans = None if group is None else group.spans
        if spans is None:
            return None
        from opentelemetry import context as otel_context
        from opentelemetry.trace import SpanKind, StatusCode
        if spans.token is not None:
            otel_context.detach(spans.token)
            spans.token = None
        if operation != "ack":
            spans.process.set_status(StatusCode.ERROR)
        spans.process.end()
        tracer = self.tracer
        assert tracer is not None
        return tracer.start_span(
            f"settle {self.node_name}", spans.context, SpanKind.CLIENT,
            attributes={**self._consumer, "messaging.operation.type": "settle",
                        "messaging.operation.name": operation})


_UNTRACED: Final = GroupTrace(None, "", "0" * 32, "00")
"""The trace of every input group with tracing off (never written anywhere)."""


def settled(span: Any, result: str) -> None:
    """End a settle span (NodeTracing.end_group), saying how it ended.

    Arguments:
        result: 'confirmed', 'unknown' (the broker did not confirm: redelivered later)
            or 'failed' (the group failed after all: its publication).
    """
    if span is not None:
        span.set_attribute("videoflow.settle.result", result)
        span.end()


__all__ = ["API_INSTALL", "INSTRUMENTATION_NAME", "SETUP_ENV", "TRACEPARENT_HEADER",
           "TRACING_ENV", "GroupSpans", "GroupTrace", "Member", "NodeTracing",
           "TracingSetupError", "active_tracer", "check_setup", "format_traceparent",
           "new_span_id", "parse_traceparent", "settled", "tracing_off",
           "use_tracer_provider", "w3c_trace_id"]
