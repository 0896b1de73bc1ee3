"""VIDEOFLOW_TRACING_SETUP that cannot give spans, through the real `videoflow run`: a
module or function that does not exist, opentelemetry-api (or the SDK) not installed,
a setup function that raises ImportError. The engine checks the setting once, before it
starts a replica: one line, the exit code of a usage error (2) or of a missing package
(1), no replica traceback. A function that fails only when called is caught by each
replica (the backstop): the run fails and its report says why, still no traceback.

"Not installed" is made real in the command's processes, the replicas it spawns
included: a sitecustomize on their PYTHONPATH puts a finder first on sys.meta_path
that answers ModuleNotFoundError for the packages named in VF_TEST_NOT_INSTALLED, as
an environment without them would."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from test_cli import HELPERS, command, environment

from videoflow.broker import server as embedded
from videoflow.messaging.tracing import SETUP_ENV

pytestmark = pytest.mark.timeout(120)

NOT_INSTALLED = '''
import importlib.abc
import os
import sys

_BLOCKED = tuple(os.environ.get("VF_TEST_NOT_INSTALLED", "").split(","))


class _NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if any(name == b or name.startswith(b + ".") for b in _BLOCKED if b):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _NotInstalled())
'''

LAZY_SETUP = '''
def install_sdk():
    from opentelemetry.sdk.trace import TracerProvider  # noqa: F401


def install_exporter():
    import videoflow_test_exporter_nowhere  # noqa: F401
'''


def run_traced(url: str, tmp_path: Path, setup: str, not_installed: str = ""
               ) -> subprocess.CompletedProcess[str]:
    """`videoflow run flows:chain --json` with VIDEOFLOW_TRACING_SETUP=setup, and the
    packages in not_installed (comma-separated) missing from every process it starts."""
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(NOT_INSTALLED)
    (site / "lazy_setup.py").write_text(LAZY_SETUP)
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    env = environment(out, count=5)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), env.get("PYTHONPATH")) if p)
    env["VF_TEST_NOT_INSTALLED"] = not_installed
    env[SETUP_ENV] = setup
    env.pop("VIDEOFLOW_TRACING", None)
    return subprocess.run(command("run", "flows:chain", "--nats-url", url, "--json"),
                          cwd=HELPERS, env=env, capture_output=True, text=True, timeout=100)


def one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.stdout == ""  # no report: nothing ran
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


@pytest.mark.parametrize("setup, message", [
    ("nowhere:install", "VIDEOFLOW_TRACING_SETUP='nowhere:install': cannot import "
                        "'nowhere': No module named 'nowhere'"),
    ("tracing_setup:missing", "VIDEOFLOW_TRACING_SETUP='tracing_setup:missing': "
                              "'tracing_setup' has no attribute 'missing'"),
    ("tracing_setup", "VIDEOFLOW_TRACING_SETUP must be 'module:function', got "
                      "'tracing_setup'"),
])
def test_a_setup_naming_no_function_is_one_usage_error_before_any_replica_starts(
        nats_server: embedded.EmbeddedServer, tmp_path: Path, setup: str,
        message: str) -> None:
    done = run_traced(nats_server.url, tmp_path, setup)
    assert done.returncode == 2, done.stderr
    assert one_error_line(done) == f"videoflow: error: {message}"


def test_without_opentelemetry_a_setup_asking_for_spans_is_one_error_naming_the_package(
        nats_server: embedded.EmbeddedServer, tmp_path: Path) -> None:
    done = run_traced(nats_server.url, tmp_path, "tracing_setup:install",
                      not_installed="opentelemetry")
    assert done.returncode == 1, done.stderr
    assert one_error_line(done) == (
        "videoflow: error: VIDEOFLOW_TRACING_SETUP='tracing_setup:install' asks for spans, "
        "but opentelemetry-api is not installed (No module named 'opentelemetry'): pip "
        "install opentelemetry-api, or unset VIDEOFLOW_TRACING_SETUP")


def test_without_opentelemetry_and_no_setup_a_run_writes_headers_only_and_completes(
        nats_server: embedded.EmbeddedServer, tmp_path: Path) -> None:
    # The control: the same blocking, nothing asked for, nothing said.
    done = run_traced(nats_server.url, tmp_path, "", not_installed="opentelemetry")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["outcome"] == "completed"
    assert done.stderr == ""


def test_a_setup_module_that_needs_the_sdk_not_installed_is_one_error_naming_it(
        nats_server: embedded.EmbeddedServer, tmp_path: Path) -> None:
    # tracing_setup imports the SDK as it is imported: the engine's import finds out.
    done = run_traced(nats_server.url, tmp_path, "tracing_setup:install",
                      not_installed="opentelemetry.sdk")
    assert done.returncode == 1, done.stderr
    assert one_error_line(done) == (
        "videoflow: error: VIDEOFLOW_TRACING_SETUP='tracing_setup:install': importing "
        "'tracing_setup' failed, ModuleNotFoundError: No module named 'opentelemetry.sdk': "
        "pip install opentelemetry-sdk")


@pytest.mark.parametrize("function, not_installed, why", [
    ("install_sdk", "opentelemetry.sdk",
     "No module named 'opentelemetry.sdk': pip install opentelemetry-sdk"),
    ("install_exporter", "",
     "No module named 'videoflow_test_exporter_nowhere'"),
])
def test_a_setup_function_raising_import_error_fails_each_replica_in_one_line_no_traceback(
        nats_server: embedded.EmbeddedServer, tmp_path: Path, function: str,
        not_installed: str, why: str) -> None:
    # The import is in the function's body: only calling it, in each replica, tells.
    done = run_traced(nats_server.url, tmp_path, f"lazy_setup:{function}", not_installed)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr and done.stderr == "", done.stderr
    report = json.loads(done.stdout)
    assert report["outcome"] == "failed"
    expected = (f"MissingDependency: VIDEOFLOW_TRACING_SETUP='lazy_setup:{function}': "
                f"calling {function}() failed, ModuleNotFoundError: {why}")
    errors = {node: entry.get("errors") for node, entry in report["nodes"].items()}
    assert errors and all(found == {f"{node}[0]": expected}
                          for node, found in errors.items()), errors
