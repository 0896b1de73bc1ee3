"""Adapters the messaging layer composes: brokers and payload stores."""
