"""JetStream's API error codes are named in one place: videoflow.broker.failures holds
them (JSErrorCode), and no other module of the package writes one as a number. Every
module is read with ast, so a code in a comparison, a tuple or a default is found
wherever it sits."""

from __future__ import annotations

import ast
from pathlib import Path

from videoflow.broker.failures import JSErrorCode

SOURCE = Path(__file__).resolve().parents[2] / "src" / "videoflow"

CODES_MODULE = SOURCE / "broker" / "failures.py"
"""The one module that writes JetStream error codes as numbers."""

JETSTREAM_CODES = range(10001, 11000)
"""Where the server's JetStream API error codes fall (its errors.json numbers them from
10002 up). 10000 itself is left out: elsewhere it is a round default (batch_max_msgs)."""


def bare_codes(path: Path) -> list[tuple[int, int]]:
    """(line, value) of every integer literal in path that falls where JetStream's
    error codes do."""
    tree = ast.parse(path.read_text(), str(path))
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and type(node.value) is int
            and node.value in JETSTREAM_CODES]


def test_the_scan_finds_every_code_in_the_codes_module() -> None:
    found = {value for _, value in bare_codes(CODES_MODULE)}
    assert JSErrorCode.STREAM_NOT_FOUND in found
    assert found == {code.value for code in JSErrorCode}


def test_no_other_module_writes_a_jetstream_error_code() -> None:
    modules = sorted(SOURCE.rglob("*.py"))
    assert CODES_MODULE in modules
    written = [f"{path.relative_to(SOURCE.parent)}:{line}: {value}"
               for path in modules if path != CODES_MODULE
               for line, value in bare_codes(path)]
    assert not written, ("name these with videoflow.broker.failures.JSErrorCode (add the "
                         f"code there if it is new): {written}")
