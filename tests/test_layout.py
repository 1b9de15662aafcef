"""Floors of the source layout (issue 50): folders say what they hold.

In ``sglang_specopd/``, ``trainer/specopd_trainer/`` and ``kernels/specopd_kernels/`` (tests/ and benchmarks/ are
checked elsewhere):

* no flat family: at most 2 modules of one folder share a name prefix (the part before the first ``_``); a third
  makes the family a package;
* no module longer than 400 lines;
* every package has an ``__init__.py`` with a docstring;
* no import cycle between modules (every import grimp sees, function-level imports included).
"""

from __future__ import annotations

import ast
import sys
from collections import Counter
from pathlib import Path
from typing import Dict, List, Set

REPO = Path(__file__).resolve().parents[1]
TREES = {"sglang_specopd": REPO / "sglang_specopd", "specopd_trainer": REPO / "trainer" / "specopd_trainer",
         "specopd_kernels": REPO / "kernels" / "specopd_kernels"}
MAX_LINES = 400
MAX_FAMILY = 2
#: vendored stand-in of another package (the sgl_kernel module SGLang's CPU engine imports), not our layout
SKIP = {"sgl_kernel_standin", "__pycache__"}


def _dirs() -> List[Path]:
    out = []
    for root in TREES.values():
        for d in [root, *root.rglob("*")]:
            if d.is_dir() and not SKIP & set(d.relative_to(root).parts) and any(d.glob("*.py")):
                out.append(d)
    return out


def test_no_flat_family_of_modules() -> None:
    families = {}
    for d in _dirs():
        stems = [p.stem for p in d.glob("*.py") if p.stem not in ("__init__", "__main__")]
        for prefix, n in Counter(s.split("_")[0] for s in stems).items():
            if n > MAX_FAMILY:
                families[f"{d.relative_to(REPO)}/{prefix}_*"] = sorted(s for s in stems if s.split("_")[0] == prefix)
    assert families == {}, f"make these families packages: {families}"


def test_no_module_over_400_lines() -> None:
    long = {str(p.relative_to(REPO)): n for d in _dirs() for p in d.glob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_every_package_has_an_init_with_a_docstring() -> None:
    bad = []
    for d in _dirs():
        init = d / "__init__.py"
        if not init.is_file():
            bad.append(f"{d.relative_to(REPO)}: no __init__.py")
        elif not ast.get_docstring(ast.parse(init.read_text())):
            bad.append(f"{init.relative_to(REPO)}: no docstring")
    assert bad == []


def _cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """Strongly connected components of more than one module (or a module importing itself), Tarjan."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph[v]:
                found.append(sorted(comp))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(graph) + 1000))
    try:
        for v in sorted(graph):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return found


def test_no_import_cycle_between_modules() -> None:
    import grimp

    g = grimp.build_graph(*TREES, cache_dir=None)
    graph = {m: {w for w in g.find_modules_directly_imported_by(m) if w in g.modules} for m in g.modules}
    assert len(graph) > 100  # the three packages were found
    assert _cycles(graph) == []


def test_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
