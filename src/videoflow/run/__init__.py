"""The composition roots: the local engine (a flow's replicas as processes on this
host, supervised: local, processes), the worker (one replica, on any host), the run
spec a worker is started from, process supervision, and the live view."""
