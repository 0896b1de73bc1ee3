"""Talking to NATS, below every videoflow concept: the loop thread a synchronous caller
runs the client on, the one connect that rides out broker outages (server lists, the
outage budget, which failures are transient), listing KV keys and objects, and the
embedded nats-server, and the TLS and credentials every connection presents. Imports
nothing of videoflow but its errors and its logs' redaction."""
