"""The JetStream adapter of the messaging contract (videoflow.backends.messaging): the
backend and its receive, settle and outcome paths; stream, consumer and DLQ
configurations and their read-back; provisioning a flow's streams; the KV ledger and
the object-store payloads. The memory adapter (videoflow.backends.memory) is its twin
under the same conformance suite."""
