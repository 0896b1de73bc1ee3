"""The messaging contract (messaging, messaging_types) and what implements it
without a broker: the memory adapter (memory, memory_broker); the payload stores that
keep obligations (payload: the contract and the memory store; filesystem_payload: a
directory; shm_payload: shared memory on one host). The JetStream adapter is the
jetstream subpackage."""
