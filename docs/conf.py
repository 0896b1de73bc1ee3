"""Sphinx configuration: the API reference, built from the docstrings by autodoc.

Build with ``sphinx-build -W -n docs docs/_build/html`` (warnings are errors, every
cross-reference must resolve); tests/unit/test_api_docs.py builds it the same way.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import sys
from pathlib import Path
from typing import Any

# Document the videoflow that is installed (CI installs it, compiled cores included);
# only a checkout with nothing installed falls back to its own src/.
try:
    import videoflow
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    import videoflow

project = "videoflow"
author = "The videoflow authors"
copyright = "the videoflow authors"  # noqa: A001 (the name Sphinx reads)
release = version = videoflow.__version__

# autodoc reads the docstrings; napoleon reads their Arguments/Returns/Raises sections.
# Nothing else: the build runs inside the test suite, and must stay quick.
extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon"]
napoleon_google_docstring = True
napoleon_numpy_docstring = False
# Arguments render as one list, not as :param: fields: our docstrings name several
# parameters in one entry ("flow_id / run_id: the run"), which a :param: field would
# misread as a type followed by a name.
napoleon_use_param = False
# Attributes sections render the same way, as a list in their class's text: as
# attribute entries they would collide with those autodoc makes for the same fields.
napoleon_custom_sections = [("Attributes", "params_style")]

autodoc_member_order = "alphabetical"  # the reference's order
autodoc_typehints = "signature"
autodoc_class_signature = "mixed"
exclude_patterns = ["_build"]
html_theme = "alabaster"

nitpicky = True
# Standard-library and third-party names: they would resolve only through intersphinx,
# which fetches the other projects' inventories over the network, and the build must
# work offline.
nitpick_ignore_regex = [
    ("py:(class|exc)", r"(abc|asyncio|collections\.abc|concurrent\.futures|os|pathlib)(\.\w+)+"),
    ("py:(class|exc)", r"(msgspec|nats|numpy|pytest|pytest_benchmark)(\.\w+)*"),
    # pytest-benchmark's, imported under TYPE_CHECKING (testing/bench.py): a signature
    # shows it bare.
    ("py:class", r"BenchmarkFixture"),
    # Type variables (Known[T]) are parameters, not documented objects.
    ("py:(class|obj)", r"videoflow(\.\w+)*\.T"),
]


def _public_bases(app: Any, name: str, obj: Any, options: Any, bases: list[Any]) -> None:
    """Shows only public bases: a private mixin (grouping's _ByKey) is no API."""
    bases[:] = [base for base in bases if not getattr(base, "__name__", "").startswith("_")]


def _factories(obj: Any) -> dict[str, Any]:
    """Field name -> default factory, for a dataclass or a msgspec Struct."""
    if dataclasses.is_dataclass(obj):
        return {f.name: f.default_factory for f in dataclasses.fields(obj)}
    import msgspec

    if isinstance(obj, type) and issubclass(obj, msgspec.Struct):
        return {f.name: f.default_factory for f in msgspec.structs.fields(obj)}
    return {}


def _as_python(default: Any, factory: Any) -> str:
    """A default as the Python that makes it: ``dict()``, ``time.monotonic``."""
    made = getattr(factory, "__name__", "")
    if made.isidentifier():
        return f"{made}()"
    module, name = getattr(default, "__module__", None), getattr(default, "__qualname__", "")
    return f"{module}.{name}" if module and name.isidentifier() else "..."


def _python_defaults(app: Any, what: str, name: str, obj: Any, options: Any,
                     signature: str | None, return_annotation: str | None) -> Any:
    """Shows a default that prints as ``<...>`` (``<factory>``, ``<built-in function
    time>``) as the Python that makes it.

    ``<...>`` is no Python: Sphinx would then split the signature at every comma,
    annotations (``dict[str, float]``) included.
    """
    if not signature or "<" not in signature:
        return None
    try:
        params = inspect.signature(obj).parameters.values()
    except (TypeError, ValueError):  # no signature to read: leave Sphinx's
        return None
    factories = _factories(obj)
    for param in params:
        if param.default is not param.empty and repr(param.default).startswith("<"):
            python = _as_python(param.default, factories.get(param.name))
            signature = re.sub(rf"\b({param.name}(?:: [^=]*)?\s*=\s*)<[^>]*>",
                               rf"\g<1>{python}", signature)
    return signature, return_annotation


def _bare_names(app: Any, env: Any, node: Any, contnode: Any) -> Any:
    """A name imported only for type checking (flow.py keeps the engine unloaded until
    it is used) reaches a signature bare, "RunReport": resolve it as Sphinx resolves a
    docstring field's type, by the one documented object of that name."""
    if node.get("refdomain") != "py" or node.get("refspecific"):
        return None
    node["refspecific"] = True
    # As any object: a type alias (testing.bench.Figure) is documented as data.
    return env.get_domain("py").resolve_xref(
        env, node["refdoc"], app.builder, "obj", node["reftarget"], node, contnode)


def _home_docstring(app: Any, what: str, name: str, obj: Any, options: Any,
                    lines: list[str]) -> None:
    """A constant a module re-exports (topology's DEFAULT_PREFETCH) gets the docstring
    of the module that assigns it (videoflow.core.credit's), not its type's (int's)."""
    if what != "data" or " ".join(lines).split() != (type(obj).__doc__ or "").split():
        return
    from sphinx.pycode import ModuleAnalyzer

    module, _, attr = name.rpartition(".")
    seen: set[str] = set()
    while module in sys.modules and module not in seen:
        seen.add(module)
        found = ModuleAnalyzer.for_module(module).find_attr_docs().get(("", attr))
        if found:
            lines[:] = list(found)
            return
        tree = ast.parse(inspect.getsource(sys.modules[module]))
        module = next((node.module for node in ast.walk(tree)
                       if isinstance(node, ast.ImportFrom) and node.module
                       and any(alias.name == attr for alias in node.names)), "")


def setup(app: Any) -> None:
    app.connect("autodoc-process-bases", _public_bases)
    app.connect("autodoc-process-signature", _python_defaults)
    app.connect("missing-reference", _bare_names)
    app.connect("autodoc-process-docstring", _home_docstring, priority=400)  # before napoleon
