"""The `videoflow` command: main (run, worker, provision), ops (status, dlq, buckets,
teardown), demo, and what they share (common)."""
