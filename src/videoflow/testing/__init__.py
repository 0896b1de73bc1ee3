"""Testing and benchmarking flows: the in-process simulation (videoflow.testing.simulate),
the pytest plugin's fixtures (videoflow.testing.plugin) and the benchmark helper
(videoflow.testing.bench)."""
