"""The JetStream adapter of the messaging contract (videoflow.backends.messaging): the
backend, a facade over the parts it owns (connection, bindings, publisher, settler,
receiver, provisioner), a binding's pull loop with its prefetch queue and delivery
leases; stream, consumer and DLQ configurations and their read-back; provisioning a
flow's streams; the KV ledger and the object-store payloads. The memory adapter
(videoflow.backends.memory) is its twin under the same conformance suite."""
