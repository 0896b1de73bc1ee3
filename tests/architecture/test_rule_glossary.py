"""Every rule identifier the code cites is looked up in docs/RULES.md, and every entry
there names tests that exist.

An identifier is a rule id (MSG-011, DELIV-15, and A/B pairs such as MSG-013/014), a
decision (D11), a design document (RFC 0006) or a broker fact (NATS_FACTS S4, §8).
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GLOSSARY = ROOT / "docs" / "RULES.md"
THIS = Path(__file__).resolve()

_RULE = re.compile(r"\b([A-Z]{2,})-(\d+)((?:/\d+)*)\b")
# Hyphenated names that are not rule ids: encodings, and NATS's own design records.
_NOT_RULES = {"SHA", "UTF", "ADR"}
_DECISION = re.compile(r"\bD\d{1,2}\b")
_RFC = re.compile(r"\bRFC \d{4}\b")
# S<n> and §<n> of the broker facts; "|S3" is a numpy dtype, not a fact.
_FACT = re.compile(r"(?<![|\w])S\d{1,2}\b|§\s?\d+")
_ROW = re.compile(r"^\| *([^|]+?) *\| *(.+?) *\| *(.+?) *\|$")
_TEST = re.compile(r"`([\w/.]+\.py)::(\w+)`")


def ids_in(text: str) -> set[str]:
    found: set[str] = set()
    for match in _RULE.finditer(text):
        prefix, first, more = match.groups()
        if prefix in _NOT_RULES:
            continue
        found.add(f"{prefix}-{first}")
        found.update(f"{prefix}-{n}" for n in more.split("/")[1:])
    found.update(_DECISION.findall(text))
    found.update(_RFC.findall(text))
    found.update(m.replace(" ", "") for m in _FACT.findall(text))
    return found


def test_ids_in_reads_the_citation_forms() -> None:
    text = ("(MSG-013/014) `# DELIV-15` decision D11, RFC 0006 CTRL-4; NATS_FACTS S4, § 8 "
            "'|S3' SHA-256 UTF-8 ADR-60 K-1")
    assert ids_in(text) == {"MSG-013", "MSG-014", "DELIV-15", "D11", "RFC 0006", "CTRL-4",
                            "S4", "§8"}


@cache
def cited() -> dict[str, list[str]]:
    """Every identifier cited in src/videoflow and tests, with the files citing it."""
    files = sorted((ROOT / "src" / "videoflow").rglob("*.py"))
    files += sorted(p for p in (ROOT / "tests").rglob("*.py") if p.resolve() != THIS)
    where: dict[str, list[str]] = {}
    for path in files:
        for rule in ids_in(path.read_text(encoding="utf-8")):
            where.setdefault(rule, []).append(str(path.relative_to(ROOT)))
    return where


@cache
def glossary() -> dict[str, list[tuple[str, str]]]:
    """docs/RULES.md's entries: id -> the (file, test) pairs it names."""
    entries: dict[str, list[tuple[str, str]]] = {}
    for line in GLOSSARY.read_text(encoding="utf-8").splitlines():
        row = _ROW.match(line)
        if row is None or row[1] in ("Id", "---"):
            continue
        rule = row[1]
        assert rule not in entries, f"docs/RULES.md defines {rule} twice"
        assert ids_in(rule) == {rule}, f"docs/RULES.md: {rule!r} is not an identifier"
        entries[rule] = _TEST.findall(row[3])
    return entries


@cache
def functions_in(path: Path) -> frozenset[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return frozenset(node.name for node in ast.walk(tree)
                     if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)))


def test_the_scan_finds_the_rules_the_code_cites() -> None:
    found = cited()
    assert len(found) > 40, sorted(found)
    for rule in ("MSG-011", "DELIV-15", "RUN-030", "STREAM-15", "PAY-006", "BLOB-7",
                 "MSGID-5", "D11", "S4", "§8"):
        assert rule in found, rule
    assert len(glossary()) > 40


def test_every_cited_identifier_is_in_the_glossary() -> None:
    missing = {rule: files for rule, files in cited().items() if rule not in glossary()}
    assert not missing, f"cited but not defined in docs/RULES.md: {missing}"


def test_every_glossary_entry_is_cited_somewhere() -> None:
    unused = sorted(set(glossary()) - set(cited()))
    assert not unused, f"docs/RULES.md defines ids nothing cites: {unused}"


def test_every_glossary_entry_names_tests_that_exist() -> None:
    problems = []
    for rule, tests in glossary().items():
        if not tests:
            problems.append(f"{rule}: names no test")
        for file, name in tests:
            path = ROOT / file
            if not file.startswith("tests/") or not path.is_file():
                problems.append(f"{rule}: {file} does not exist")
            elif name not in functions_in(path):
                problems.append(f"{rule}: {file} defines no {name}")
    assert not problems, "\n".join(problems)


def test_the_architecture_page_points_at_the_glossary() -> None:
    assert "docs/RULES.md" in (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
