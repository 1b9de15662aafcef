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


class _Item:
    """What :func:`_servers.group_modules` reads of a pytest item: nodeid, fixture names, markers."""

    def __init__(self, nodeid: str, fixtures=(), ends=False, server=False):
        self.nodeid, self.fixturenames, self._ends, self._server = nodeid, list(fixtures), ends, server

    def get_closest_marker(self, name: str):
        return object() if (name == "ends_module" and self._ends) or (name == "server" and self._server) else None


def test_tests_that_end_a_module_run_last_in_it_and_shared_server_modules_stay_together() -> None:
    from _servers import group_modules

    items = [_Item("tests/test_a.py::stop", ends=True), _Item("tests/test_b.py::x"),
             _Item("tests/test_a.py::one"), _Item("tests/test_c.py::y", ["tiny_admin_server"]),
             _Item("tests/test_a.py::two"), _Item("tests/test_d.py::z", ["tiny_admin_server"]),
             _Item("tests/test_c.py::w", ["tiny_admin_server"])]
    group_modules(items)
    assert [i.nodeid for i in items] == [
        "tests/test_a.py::one", "tests/test_a.py::two", "tests/test_a.py::stop", "tests/test_b.py::x",
        "tests/test_c.py::y", "tests/test_c.py::w", "tests/test_d.py::z"]


def test_groups_that_start_servers_are_handed_out_first_in_the_order_drawn() -> None:
    """xdist (``--no-loadscope-reorder``) hands groups out in this order: the server groups first, so the long
    units are shared out first; inside each part, and inside each group, the random order is kept."""
    from _servers import group_modules

    items = [_Item("tests/test_a.py::x"), _Item("tests/test_b.py::s", server=True), _Item("tests/test_c.py::y"),
             _Item("tests/test_d.py::t", ["tiny_admin_server"]), _Item("tests/test_e.py::u", ["tiny_admin_server"],
                                                                        server=True),
             _Item("tests/test_b.py::q"), _Item("tests/test_f.py::z", server=True)]
    group_modules(items)
    assert [i.nodeid for i in items] == [
        "tests/test_b.py::s", "tests/test_b.py::q", "tests/test_d.py::t", "tests/test_e.py::u", "tests/test_f.py::z",
        "tests/test_a.py::x", "tests/test_c.py::y"]
