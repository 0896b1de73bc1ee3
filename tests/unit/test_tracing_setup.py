"""VIDEOFLOW_TRACING_SETUP checked in process: check_setup (what the engine runs once
before it starts a replica) and active_tracer (each replica's backstop, which calls the
function). The same through the real command and its replica processes:
tests/e2e/test_tracing_setup_errors.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from videoflow.errors import MissingDependency
from videoflow.messaging import tracing
from videoflow.messaging.tracing import (
    SETUP_ENV,
    TRACING_ENV,
    TracingSetupError,
    active_tracer,
    check_setup,
)


@pytest.fixture
def modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory on sys.path for the setup modules a test writes; tracing's
    once-per-process flag cleared, and tracing on."""
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(tracing, "_set_up", False)
    monkeypatch.delenv(TRACING_ENV, raising=False)
    return tmp_path


def write(directory: Path, name: str, source: str) -> None:
    (directory / f"{name}.py").write_text(source)
    sys.modules.pop(name, None)


def test_nothing_is_checked_when_the_setup_is_unset_empty_or_tracing_is_off(
        modules: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SETUP_ENV, raising=False)
    check_setup()
    monkeypatch.setenv(SETUP_ENV, "  ")
    check_setup()
    monkeypatch.setenv(SETUP_ENV, "nowhere_vf_setup:install")
    monkeypatch.setenv(TRACING_ENV, "off")
    check_setup()  # the replicas do not call it either


@pytest.mark.parametrize("setup, message", [
    ("install", "must be 'module:function', got 'install'"),
    (":install", "must be 'module:function'"),
    ("nowhere_vf_setup:", "must be 'module:function'"),
    ("nowhere_vf_setup:install", "cannot import 'nowhere_vf_setup': No module named "
                                 "'nowhere_vf_setup'"),
    ("nowhere_vf_setup.sub:install", "cannot import 'nowhere_vf_setup.sub': No module "
                                     "named 'nowhere_vf_setup'"),
])
def test_a_setup_naming_no_module_is_a_usage_error(
        modules: Path, monkeypatch: pytest.MonkeyPatch, setup: str, message: str) -> None:
    monkeypatch.setenv(SETUP_ENV, setup)
    with pytest.raises(TracingSetupError, match=message) as raised:
        check_setup()
    assert isinstance(raised.value, ValueError)  # the command's usage errors: exit 2


def test_a_missing_or_uncallable_function_is_a_usage_error_and_none_is_called(
        modules: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(modules, "vf_setup_present", "CALLS = []\nVALUE = 3\n"
                                       "def install():\n    CALLS.append(1)\n")
    monkeypatch.setenv(SETUP_ENV, "vf_setup_present:absent")
    with pytest.raises(TracingSetupError, match="'vf_setup_present' has no attribute 'absent'"):
        check_setup()
    monkeypatch.setenv(SETUP_ENV, "vf_setup_present:VALUE")
    with pytest.raises(TracingSetupError, match=r"vf_setup_present\.VALUE is a int, not a "):
        check_setup()
    monkeypatch.setenv(SETUP_ENV, "vf_setup_present:install")
    check_setup()
    assert sys.modules["vf_setup_present"].CALLS == []  # checked, never called


def test_a_module_whose_own_code_raises_as_it_is_imported_is_a_usage_error(
        modules: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(modules, "vf_setup_raising", "raise RuntimeError('no collector configured')\n")
    monkeypatch.setenv(SETUP_ENV, "vf_setup_raising:install")
    with pytest.raises(TracingSetupError, match="cannot import 'vf_setup_raising': "
                                                "RuntimeError: no collector configured"):
        check_setup()


def test_a_module_that_imports_a_package_not_installed_is_a_missing_dependency(
        modules: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(modules, "vf_setup_needing", "import vf_exporter_not_installed\n")
    monkeypatch.setenv(SETUP_ENV, "vf_setup_needing:install")
    with pytest.raises(MissingDependency, match="importing 'vf_setup_needing' failed, "
                       "ModuleNotFoundError: No module named 'vf_exporter_not_installed'$"):
        check_setup()


def test_without_opentelemetry_a_setup_is_a_missing_dependency_and_no_setup_is_fine(
        modules: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # None in sys.modules: every import of it fails, as when it is not installed.
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    monkeypatch.delenv(SETUP_ENV, raising=False)
    check_setup()
    assert active_tracer() is None  # the header alone, as without the extra
    monkeypatch.setenv(SETUP_ENV, "tracing_setup_anything:install")
    for check in (check_setup, active_tracer):
        with pytest.raises(MissingDependency,
                           match="asks for spans, but opentelemetry-api is not installed "
                                 r".*: pip install opentelemetry-api, or unset "):
            check()


@pytest.mark.parametrize("missing, hint", [
    ("opentelemetry.sdk", ": pip install opentelemetry-sdk"),
    ("vf_exporter_not_installed", ""),
])
def test_a_setup_function_raising_import_error_when_called_is_a_missing_dependency(
        modules: Path, monkeypatch: pytest.MonkeyPatch, missing: str, hint: str) -> None:
    write(modules, "vf_setup_lazy", f"def install():\n    raise ModuleNotFoundError("
                                    f"\"No module named '{missing}'\", name={missing!r})\n")
    monkeypatch.setenv(SETUP_ENV, "vf_setup_lazy:install")
    check_setup()  # the module imports: only calling the function tells
    expected = (f"VIDEOFLOW_TRACING_SETUP='vf_setup_lazy:install': calling install() "
                f"failed, ModuleNotFoundError: No module named '{missing}'{hint}")
    with pytest.raises(MissingDependency) as raised:
        active_tracer()
    assert str(raised.value) == expected


def test_active_tracer_calls_the_setup_function_once_per_process(
        modules: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(modules, "vf_setup_counted", "CALLS = []\ndef install():\n    CALLS.append(1)\n")
    monkeypatch.setenv(SETUP_ENV, "vf_setup_counted:install")
    active_tracer()
    active_tracer()
    assert sys.modules["vf_setup_counted"].CALLS == [1]
