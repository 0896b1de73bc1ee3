"""videoflow: dataflow pipelines over NATS JetStream with an event-time join node."""

__version__ = "0.1.0"
