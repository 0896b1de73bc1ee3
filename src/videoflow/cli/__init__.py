"""The `videoflow` command: main (run, replay, worker, provision), ops (status, dlq,
buckets, teardown), ls (the flows and runs on a broker), edges (tap and hz: what flows
on an edge), demo (the command; its flow, nodes and ground truth in demo_flow,
demo_nodes, demo_truth), and what they share (common)."""
