"""The composition roots: the local engine (a flow's replicas as processes on this
host, supervised: local, processes, supervision), the worker (one replica, on any
host), the run spec a worker is started from, the /metrics endpoint (metrics) and the
live view (progress)."""
