"""The messaging layer: join assembly, broker backends, topology and the messenger."""
