"""The messenger: a node replica's side of the broker, speaking only the messaging
contract (videoflow.backends.messaging). Join assembly over the grouping cores
(grouping, grouping_core, the compiled _grouping_core and its _grouping_ref), the
delivery-policy ladder, the publication window, dead letters and payload obligations.
Also the reference's module paths: nats_messenger (the messenger composed with the
JetStream adapter), jetstream_backend and topology (re-exports of the adapter and of
provisioning)."""
