"""The `videoflow` command: main (run, worker, provision), ops (status, dlq, buckets,
teardown), demo (the command; its flow, nodes and ground truth in demo_flow,
demo_nodes, demo_truth), and what they share (common)."""
