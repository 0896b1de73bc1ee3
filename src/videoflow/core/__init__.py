"""What a flow is made of, with no broker in sight: node and policy types, the task
loops and the Messenger interface they drive, the compiler (flow graph to node specs),
naming (subjects, streams, durables, buckets), credit (windows and prefetch), the
runtime ledger (runtime, its keys and records in runtime_records) over its
RuntimeStore interface, and the run report. Imports nothing of videoflow above it."""
