"""The suite's own rules (docs/testing.md): no test module imports another test module (shared fakes live in
``tests/fakes/``, shared fixtures and helpers in ``tests/support/`` and ``tests/_*.py``), so what one module defines
or leaves behind cannot change what another sees; every module under tests/ parses."""

from __future__ import annotations

import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
# an import of a test module, in code or inside a script string run in a subprocess
IMPORT_OF_TEST_MODULE = re.compile(r"^\s*(?:from\s+(test_\w+)\s+import|import\s+(test_\w+))", re.MULTILINE)


def _modules():
    return sorted(p for p in TESTS.rglob("*.py") if "fixtures" not in p.relative_to(TESTS).parts)


def test_no_test_module_imports_another_test_module() -> None:
    found = []
    for path in _modules():
        text = path.read_text()
        ast.parse(text, filename=str(path))
        for m in IMPORT_OF_TEST_MODULE.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            found.append(f"{path.relative_to(TESTS)}:{line}: imports {m.group(1) or m.group(2)}")
    assert not found, "test modules imported by other modules (move what they share to tests/fakes/ or " \
                      "tests/support/):\n" + "\n".join(found)


def test_the_rule_catches_both_import_forms() -> None:
    text = "import os\nfrom test_x import y\n    import test_z\nfrom fakes.fleet import FakeWorker\n"
    assert [m.group(1) or m.group(2) for m in IMPORT_OF_TEST_MODULE.finditer(text)] == ["test_x", "test_z"]
