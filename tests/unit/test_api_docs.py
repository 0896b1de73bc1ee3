"""The API reference built from the code (docs/, Sphinx autodoc): it builds with warnings
as errors and every cross-reference resolved, and it documents every public name of
the messaging API reference, with the reference's parameters and defaults.

The reference is read from ../shared/spec/messaging-api-reference.txt beside the
repository when it is there, and otherwise from api_reference_entries.txt beside this
file: the reference's entry lines without their prose, made by running this file
(``python tests/unit/test_api_docs.py``), and checked against the reference whenever
both are present.

Annotations are not compared: the reference prints them as its build resolved them
(``JoinPolicy``, ``nats.js.api.StreamConfig``), and a name, its parameters' names and
order, and their defaults are what a caller's code depends on.
"""

from __future__ import annotations

import re
import subprocess
import sys
import zlib
from dataclasses import dataclass, replace
from html.parser import HTMLParser
from pathlib import Path

import pytest
from reference_text import split_params

REPO_ROOT = Path(__file__).resolve().parents[2]
REFERENCE = REPO_ROOT.parent / "shared" / "spec" / "messaging-api-reference.txt"
KEPT = Path(__file__).with_name("api_reference_entries.txt")

_MODULE = re.compile(r"^(videoflow(?:\.\w+)*) (?:module|package)$")
_TOP = re.compile(r"^(?:(?P<mods>(?:class|exception|async) ))?(?P<name>videoflow(?:\.\w+)+)"
                  r"(?:\((?P<params>.*)\)(?: → .+)?| = (?P<value>.+))?$")
_MEMBER = re.compile(r"^(?P<mods>(?:(?:abstractmethod|async|classmethod|property|staticmethod) )*)"
                     r"(?P<name>\w+)(?:\((?P<params>.*)\)(?: → .+)?"
                     r"|: (?P<type>.+?)(?: = (?P<value>.+))?)?$")
# Inventory roles by what the reference shows: a member that became a property, or a
# function a staticmethod, still answers to the same code.
_ROLES = {
    "module": {"py:module"},
    "class": {"py:class", "py:exception"},
    "function": {"py:function"},
    "method": {"py:method", "py:classmethod", "py:staticmethod"},
    "attribute": {"py:attribute", "py:property", "py:data"},
}


@dataclass(frozen=True)
class Entry:
    """One documented object of the reference."""

    name: str
    kind: str
    params: tuple[str, ...] | None  # None: no parameter list shown
    value: str | None  # what "= ..." shows, for data and attributes
    line: str
    described: bool = False  # the reference gives it text of its own


def parse_reference(text: str) -> list[Entry]:
    """The reference's documented objects, from its entry lines; members belong to the
    class above them, and any other line but a class's "Bases:" is an entry's text."""
    entries: list[Entry] = []
    owner: str | None = None
    for line in (raw.strip() for raw in text.splitlines()):
        if not line or line.startswith(("#", "Bases: ")):
            continue
        if match := _MODULE.match(line):
            owner = None
            entries.append(Entry(match.group(1), "module", None, None, line))
        elif match := _TOP.match(line):
            mods, name, params = match["mods"] or "", match["name"], match["params"]
            owner = name if mods.strip() in ("class", "exception") else None
            kind = "class" if owner else ("function" if params is not None else "attribute")
            entries.append(Entry(name, kind, None if params is None else split_params(params),
                                 match["value"], line))
        elif owner and (match := _MEMBER.match(line)) and match["name"] not in ("Bases", "Type"):
            params = match["params"]
            kind = "method" if params is not None else "attribute"
            entries.append(Entry(f"{owner}.{match['name']}", kind,
                                 None if params is None else split_params(params),
                                 match["value"], line))
        elif entries:
            entries[-1] = replace(entries[-1], described=True)
    return entries


def reference_text() -> str:
    return (REFERENCE if REFERENCE.exists() else KEPT).read_text(encoding="utf-8")


def parameter(text: str) -> tuple[str, str | None]:
    """(name with its stars, or the * and / markers; default text or None)."""
    head, _, default = text.partition(" = ")
    default = default.strip() or None
    # A default factory: the reference's Sphinx printed <factory>, ours prints the call
    # (docs/conf.py, _python_defaults).
    if default is not None and (default == "<factory>" or re.fullmatch(r"\w+\(\)", default)):
        default = "<factory>"
    return head.split(":")[0].strip(), default


def compatible(reference: tuple[str, ...], built: tuple[str, ...]) -> bool:
    """The built parameters are the reference's, in order and with the same defaults,
    followed by none or only optional ones (a keyword-only addition with a default)."""
    ref, now = [parameter(p) for p in reference], [parameter(p) for p in built]
    extra = now[len(ref):]
    return now[:len(ref)] == ref and all(
        default is not None or name in ("*", "/") or name.startswith("*")
        for name, default in extra)


# ------------------------------------------------------------------- the built docs


def read_inventory(path: Path) -> dict[str, str]:
    """objects.inv: name -> role (e.g. 'py:method'), from its zlib-compressed body."""
    data = path.read_bytes()
    header_end = 0
    for _ in range(4):  # "# Sphinx inventory version 2", project, version, compression
        header_end = data.index(b"\n", header_end) + 1
    found = {}
    for line in zlib.decompress(data[header_end:]).decode().splitlines():
        if match := re.match(r"(.+?)\s+(\S+:\S+)\s+-?\d+\s", line):
            found.setdefault(match.group(1), match.group(2))
    return found


@dataclass(frozen=True)
class Shown:
    """What the built docs show of one object."""

    params: tuple[str, ...]  # each <em class="sig-param"> of its signature line
    signature: str  # the signature line's text
    text: str = ""  # its own description (its members' aside), "Bases:" line aside


class _Pages(HTMLParser):
    """Every documented object: its signature line, <dt class="sig" id=name>, and the
    <dd> after it up to the members' own <dl>s."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.found: dict[str, Shown] = {}
        self._depth = 0  # <dl> nesting
        self._name: str | None = None  # in its <dt>
        self._params: list[str] = []
        self._param: list[str] | None = None
        self._signature: list[str] = []
        self._open: list[tuple[str, int, list[str]]] = []  # <dd>s: name, depth, text

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        classes = (attributes.get("class") or "").split()
        self._depth += tag == "dl"
        if tag == "dt" and "sig" in classes and attributes.get("id"):
            self._name, self._params, self._signature = attributes["id"], [], []
        elif tag == "em" and "sig-param" in classes and self._name:
            self._param = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "em" and self._param is not None:
            self._params.append("".join(self._param).strip())
            self._param = None
        elif tag == "dt" and self._name:
            signature = "".join(self._signature).replace("¶", "").strip()
            self.found[self._name] = Shown(tuple(self._params), signature)
            self._open.append((self._name, self._depth, []))
            self._name = None
        elif tag == "dd" and self._open and self._open[-1][1] == self._depth:
            name, _, text = self._open.pop()
            own = re.sub(r"^\s*Bases:[^\n]*", "", "".join(text)).strip()
            self.found[name] = replace(self.found[name], text=own)
        self._depth -= tag == "dl"

    def handle_data(self, data: str) -> None:
        if self._name:
            self._signature.append(data)
            if self._param is not None:
                self._param.append(data)
        elif self._open and self._open[-1][1] == self._depth:
            self._open[-1][2].append(data)


@dataclass(frozen=True)
class Built:
    inventory: dict[str, str]  # name -> role
    shown: dict[str, Shown]  # name -> what its entry shows


def build_docs(out: Path) -> Built:
    """The docs, built as the README says: warnings are errors, references nitpicked."""
    result = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "-n", "-q", "-b", "html",
         "-d", str(out / "doctrees"), str(REPO_ROOT / "docs"), str(out / "html")],
        capture_output=True, text=True, cwd=out, timeout=600)
    if result.returncode != 0:
        pytest.fail(f"sphinx-build failed ({result.returncode}):\n{result.stdout}\n"
                    f"{result.stderr}", pytrace=False)
    pages = _Pages()
    for page in sorted((out / "html" / "api").glob("*.html")):
        pages.feed(page.read_text(encoding="utf-8"))
    return Built(read_inventory(out / "html" / "objects.inv"), pages.found)


def undocumented(built: Built, entries: list[Entry]) -> list[str]:
    return [f"{e.name}: {built.inventory.get(e.name, 'not in objects.inv')}, "
            f"the reference shows a {e.kind}"
            for e in entries if built.inventory.get(e.name) not in _ROLES[e.kind]]


def undescribed(built: Built, entries: list[Entry]) -> list[str]:
    return [f"{e.name}: no docstring, the reference has text for it" for e in entries
            if e.described and e.kind != "module" and e.name in built.shown
            and not built.shown[e.name].text]


def changed_signatures(built: Built, entries: list[Entry]) -> list[str]:
    return [f"{e.name}\n    reference: ({', '.join(e.params)})"
            f"\n    built:     ({', '.join(shown.params)})"
            for e in entries if e.params is not None and (shown := built.shown.get(e.name))
            and not compatible(e.params, shown.params)]


def changed_values(built: Built, entries: list[Entry]) -> list[str]:
    return [f"{e.name}: the reference shows = {e.value}, the docs {shown.signature!r}"
            for e in entries if e.value is not None and (shown := built.shown.get(e.name))
            and not shown.signature.endswith(f"= {e.value}")]


# ------------------------------------------------------------------------- tests


def test_the_reference_is_read_whole() -> None:
    entries = parse_reference(reference_text())
    kinds = {kind: sum(e.kind == kind for e in entries) for kind in _ROLES}
    assert kinds["module"] == 6  # the package and its five modules
    assert kinds["class"] >= 11 and kinds["method"] >= 60 and kinds["function"] >= 35
    assert "videoflow.messaging.nats_messenger.NATSMessenger.receive_message" in {
        e.name for e in entries}


@pytest.mark.skipif(not REFERENCE.exists(), reason="the API reference is not beside the repo")
def test_the_kept_entries_are_the_reference_s() -> None:
    kept = parse_reference(KEPT.read_text(encoding="utf-8"))
    assert kept == parse_reference(REFERENCE.read_text(encoding="utf-8")), (
        "the reference changed: run `python tests/unit/test_api_docs.py`")


def test_the_docs_build_and_keep_every_reference_name_signature_and_value(
        tmp_path: Path) -> None:
    # One test, so the build (several seconds) runs once even when xdist spreads tests.
    pytest.importorskip("sphinx", reason="the docs extra is not installed")
    built, entries = build_docs(tmp_path), parse_reference(reference_text())
    problems = [*undocumented(built, entries), *undescribed(built, entries),
                *changed_signatures(built, entries), *changed_values(built, entries)]
    assert not problems, "the docs no longer match the API reference:\n" + "\n".join(problems)


if __name__ == "__main__":
    # Keeps the reference's entry lines, for checkouts without ../shared.
    entries = parse_reference(REFERENCE.read_text(encoding="utf-8"))
    KEPT.write_text(
        "# The entry lines of the messaging API reference\n"
        "# (../shared/spec/messaging-api-reference.txt), for test_api_docs.py where the\n"
        "# reference is not beside the repository; '...' stands for an entry's text.\n"
        "# Made by `python tests/unit/test_api_docs.py`; do not edit.\n"
        + "".join(e.line + "\n" + "...\n" * e.described for e in entries),
        encoding="utf-8")
    print(f"{KEPT}: {len(entries)} entries")
