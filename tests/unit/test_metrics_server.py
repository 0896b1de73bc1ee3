"""The /metrics server (videoflow.run.metrics.MetricsServer): a scrape under way when
the process closes it and exits gets its whole answer, never a cut one."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import urllib.request
from typing import Any

import pytest

pytest.importorskip("prometheus_client")

# A collector that takes its time, and says when a scrape is inside it; once one is,
# the process closes the server and exits at once (as a worker does at its end).
SERVER = textwrap.dedent("""
    import sys, threading, time
    from prometheus_client.core import GaugeMetricFamily
    from videoflow.run.metrics import MetricsServer

    inside = threading.Event()

    class Slow:
        def collect(self):
            inside.set()
            time.sleep(0.5)
            yield GaugeMetricFamily("vf_probe", "a probe", value=1.0)

    server = MetricsServer(Slow(), 0)
    print(server.url, flush=True)
    inside.wait(30)
    server.close()
""")


@pytest.mark.timeout(60)
def test_a_scrape_under_way_at_close_gets_its_whole_answer() -> None:
    process = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE,
                               text=True)
    assert process.stdout is not None
    url = process.stdout.readline().strip()
    got: dict[str, Any] = {}

    def scrape() -> None:
        with urllib.request.urlopen(url, timeout=10) as answer:
            got["type"] = answer.headers["Content-Type"]
            got["body"] = answer.read().decode()

    scraper = threading.Thread(target=scrape)
    scraper.start()
    scraper.join(30)
    assert process.wait(30) == 0
    assert got["type"].startswith("text/plain"), got
    assert "vf_probe 1.0" in got["body"], got
