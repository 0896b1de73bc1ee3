"""The package's import structure, read from its source (ast, never a runtime import):
imports point only down the layers, no two modules import each other round a circle,
and no module takes another's private name. TYPE_CHECKING and function-level imports
count as any other: a circle a lazy import hides is still a circle."""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parents[2] / "src" / "videoflow"

LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("ground", ("videoflow.errors", "videoflow.observation", "videoflow.native",
                "videoflow.core.constants", "videoflow.logs", "videoflow.clock")),
    ("broker", ("videoflow.broker",)),
    ("wire", ("videoflow.wire",)),
    ("core", ("videoflow.core",)),
    ("contract", ("videoflow.backends",)),
    ("jetstream", ("videoflow.backends.jetstream",)),
    ("messaging", ("videoflow.messaging",)),
    ("ops", ("videoflow.ops",)),
    ("io", ("videoflow.io",)),
    ("run", ("videoflow.run",)),
    ("facade", ("videoflow", "videoflow.flow", "videoflow.serialization")),
    ("testing", ("videoflow.testing",)),
    ("cli", ("videoflow.cli", "videoflow.__main__")),
]
"""The floors, from the ground up; a module's floor is its longest matching prefix."""

JETSTREAM_IN_MESSAGING = {
    "videoflow.messaging.jetstream_backend",  # the reference's path to the adapter
    "videoflow.messaging.topology",  # the reference's facade over provisioning
    "videoflow.messaging.nats_messenger",  # composes the messenger with the adapter
}
"""The messaging modules that may name the JetStream adapter; the messenger's parts
speak only the contract."""


NATS_CLIENT_FLOORS = ("broker", "jetstream", "ops", "io", "run")
"""The floors that may use the NATS client library itself; the rest reach the broker
only through the contract (or not at all)."""


@dataclass(frozen=True)
class Import:
    source: str
    target: str  # a module of the package
    name: str | None  # the name taken from target, None for a module import
    line: int


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SOURCE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    found = {module_name(p): p for p in SOURCE.rglob("*.py")}
    # Compiled modules are modules too (their .pyi stubs name them).
    found.update({module_name(p): p for p in SOURCE.rglob("*.pyi")})
    return found


def imports() -> Iterator[Import]:
    known = modules()
    for name, path in known.items():
        if path.suffix != ".py":
            continue
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "videoflow":
                        yield Import(name, alias.name, None, node.lineno)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                if target.split(".")[0] != "videoflow":
                    continue
                for alias in node.names:
                    submodule = f"{target}.{alias.name}"
                    if submodule in known:
                        yield Import(name, submodule, None, node.lineno)
                    else:
                        yield Import(name, target, alias.name, node.lineno)


def floor(module: str) -> int:
    best, depth = -1, -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > depth:
                best, depth = index, len(prefix)
    assert best >= 0, f"{module} is on no floor"
    return best


def where(found: Import) -> str:
    return f"{found.source}:{found.line} -> {found.target}" + (
        f".{found.name}" if found.name else "")


def test_every_module_is_on_a_floor() -> None:
    for module in modules():
        floor(module)


def test_imports_point_only_down() -> None:
    upward = [f"{where(i)} ({LAYERS[floor(i.source)][0]} -> {LAYERS[floor(i.target)][0]})"
              for i in imports() if floor(i.target) > floor(i.source)]
    assert upward == []


def test_the_messenger_speaks_only_the_contract() -> None:
    named = [where(i) for i in imports()
             if floor(i.source) == floor("videoflow.messaging")
             and i.source not in JETSTREAM_IN_MESSAGING
             and floor(i.target) == floor("videoflow.backends.jetstream")]
    assert named == []


def test_only_the_broker_floors_use_the_nats_client() -> None:
    users = []
    for module, path in modules().items():
        if path.suffix != ".py" or LAYERS[floor(module)][0] in NATS_CLIENT_FLOORS:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            users += [f"{module}:{node.lineno} {n}" for n in names
                      if n.split(".")[0] == "nats"]
    assert users == []


def test_compiled_code_is_imported_by_its_two_wrappers_alone() -> None:
    compiled = {name for name, path in modules().items() if path.suffix == ".pyi"}
    users = {i.source for i in imports() if i.target in compiled}
    assert users == {"videoflow.messaging.grouping", "videoflow.wire.serialization"}


def test_the_pure_python_switch_is_read_in_one_place() -> None:
    readers = sorted(module for module, path in modules().items()
                     if path.suffix == ".py" and "VIDEOFLOW_PURE_PYTHON" in path.read_text()
                     and "environ" in path.read_text())
    assert readers == ["videoflow.native"]


MAX_LINES = 700
"""Past this a module splits along its responsibilities, or says in its docstring
why it does not ("Over ~700 lines, ...")."""


def test_a_module_over_700_lines_says_why_in_its_docstring() -> None:
    unexplained = []
    for module, path in modules().items():
        if path.suffix != ".py":
            continue
        text = path.read_text()
        docstring = ast.get_docstring(ast.parse(text, str(path))) or ""
        if text.count("\n") > MAX_LINES and "Over ~700 lines" not in docstring:
            unexplained.append(module)
    assert unexplained == []


def test_no_import_circle() -> None:
    graph: dict[str, set[str]] = defaultdict(set)
    for found in imports():
        if found.target != found.source and found.target in modules():
            graph[found.source].add(found.target)
    circles = strongly_connected(graph)
    assert [sorted(c) for c in circles if len(c) > 1] == []


def test_no_private_name_crosses_a_module() -> None:
    crossing = []
    for found in imports():
        leaf = found.name if found.name is not None else found.target.rpartition(".")[2]
        if not leaf.startswith("_") or leaf.startswith("__"):
            continue
        # A package's own private compiled module (_grouping_core, _envelope) is its
        # implementation, imported by its one wrapper beside it.
        own_package = found.name is None and (
            found.target.rpartition(".")[0] == found.source.rpartition(".")[0])
        if not own_package:
            crossing.append(where(found))
    assert crossing == []


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components, iteratively."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in list(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                found.append(component)
    return found


@pytest.mark.parametrize("graph, circles", [
    ({"a": {"b"}, "b": {"a"}}, [["a", "b"]]),
    ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
])
def test_the_circle_finder_finds_circles_and_only_them(
    graph: dict[str, set[str]], circles: list[list[str]],
) -> None:
    found = [sorted(c) for c in strongly_connected(defaultdict(set, graph)) if len(c) > 1]
    assert found == circles


COMPOSED = ("videoflow.backends.jetstream", "videoflow.messaging")
"""The packages built of owned parts (the JetStream adapter, the messenger): a class
there has at most one base class of ours, so no base holds several parts' state."""


def top_level(module: str) -> ast.Module | None:
    path = modules().get(module)
    return None if path is None or path.suffix != ".py" else ast.parse(
        path.read_text(), str(path))


def is_our_class(tree: ast.Module, name: str, seen: frozenset[str] = frozenset()) -> bool:
    """Whether name, as a module's top level (tree) has it, is a class defined in the
    package: defined there, or imported there from a module of the package that has
    it (followed through re-exports)."""
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return True
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("videoflow"):
            for alias in node.names:
                if (alias.asname or alias.name) != name:
                    continue
                source = node.module or ""
                found = None if source in seen else top_level(source)
                return found is not None and is_our_class(found, alias.name, seen | {source})
    return False


def bases_of_ours(tree: ast.Module) -> Iterator[tuple[str, list[str]]]:
    """(class, the names of its base classes that are classes of the package) for every
    class a module (tree) defines, nested ones too."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef):
            continue
        names = []
        for base in node.bases:
            if isinstance(base, ast.Subscript):  # Generic-style: Base[T]
                base = base.value
            if isinstance(base, ast.Name) and is_our_class(tree, base.id):
                names.append(base.id)
        yield node.name, names


def test_no_class_of_the_adapter_or_the_messenger_has_two_bases_of_ours() -> None:
    mixed = []
    for module, path in modules().items():
        if path.suffix != ".py" or not any(
                module == p or module.startswith(p + ".") for p in COMPOSED):
            continue
        tree = top_level(module)
        assert tree is not None
        mixed += [f"{module}.{name}({', '.join(bases)})"
                  for name, bases in bases_of_ours(tree) if len(bases) > 1]
    assert mixed == []


def test_the_base_class_check_sees_a_mixin_imported_from_the_package() -> None:
    tree = ast.parse("from videoflow.backends.messaging import MessagingBackend\n"
                     "from videoflow.backends.jetstream.connection import Connection\n"
                     "class Part: ...\n"
                     "class Mixed(Part, Connection, MessagingBackend, Exception): ...\n")
    found = dict(bases_of_ours(tree))
    assert found == {"Part": [], "Mixed": ["Part", "Connection", "MessagingBackend"]}
