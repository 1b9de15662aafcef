"""README.md and benchmarks/REPORT.md say what the committed result files say (issue 40 part 6).

* Regenerated from ``benchmarks/results/`` (into a temporary copy), the README's generated blocks and REPORT.md are
  byte-identical to the committed ones: every number in them comes from a committed result file, none is stale.
* Every table in them has rows, and agrees with the summary item generated beside it: each headline row's numbers
  appear in the item of the file it names; each serving table's speedups are the item's list, in order.
* The headline never leads with a drafter from the git-ignored ``runs/`` folder.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Dict, List

import pytest

from sglang_specopd.app.bench.report.readme import BLOCKS

REPO = Path(__file__).resolve().parents[1]
NUM = re.compile(r"(?<![\d.])[-+]?\d+(?:\.\d+)?")  # "1.3-3.8x": 1.3 and 3.8


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, str]:
    """README.md and REPORT.md as `specopd bench report --readme README.md` writes them from the committed results
    (run from the repository root, written into a temporary copy)."""
    import os

    from sglang_specopd.app.bench.report.build import build_report

    tmp = tmp_path_factory.mktemp("report")
    shutil.copy(REPO / "README.md", tmp / "README.md")
    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        build_report(Path("benchmarks/results"), tmp / "benchmarks" / "REPORT.md", tmp / "README.md")
    finally:
        os.chdir(cwd)
    return {"README.md": (tmp / "README.md").read_text(), "REPORT.md": (tmp / "benchmarks" / "REPORT.md").read_text()}


def _blocks(text: str) -> List[str]:
    return [text[text.index(start): text.index(end)] for start, end in BLOCKS]


def test_committed_readme_and_report_are_what_the_results_generate(regenerated) -> None:
    assert _blocks((REPO / "README.md").read_text()) == _blocks(regenerated["README.md"]), \
        "README's generated blocks are stale: run `specopd bench report --readme README.md`"
    assert (REPO / "benchmarks" / "REPORT.md").read_text() == regenerated["REPORT.md"], \
        "benchmarks/REPORT.md is stale: run `specopd bench report --readme README.md`"


def _tables(text: str) -> List[List[str]]:
    """Every markdown table (its lines), indented ones included."""
    out, cur = [], []
    for line in text.splitlines() + [""]:
        if line.strip().startswith("|"):
            cur.append(line.strip())
        elif cur:
            out.append(cur)
            cur = []
    return out


def _items(report: str) -> Dict[str, str]:
    """REPORT.md's summary items by the result file they name: the item's text with its indented lines (tables)."""
    summary = report[report.index("Every result file, one item each:"): report.index("## Serving throughput")]
    items: Dict[str, str] = {}
    for chunk in re.split(r"\n(?=- \*\*)", summary):
        m = re.match(r"- \*\*[^*]+\*\* \(`([\w.-]+\.json)`", chunk)
        if m:
            items[m.group(1)] = items.get(m.group(1), "") + chunk
    return items


def test_every_table_has_rows(regenerated) -> None:
    for name, text in (("README.md", (REPO / "README.md").read_text()), ("REPORT.md", regenerated["REPORT.md"])):
        for table in _tables(text):
            assert len(table) >= 3, (name, table)  # header, separator, at least one row


def test_headline_rows_agree_with_the_summary_items(regenerated) -> None:
    items = _items(regenerated["REPORT.md"])
    readme = (REPO / "README.md").read_text()
    head = readme[readme.index(BLOCKS[1][0]): readme.index(BLOCKS[1][1])]
    rows = [r for r in _tables(head)[0][2:]]
    assert len(rows) >= 8
    for row in rows:
        what, setup, value, file = [c.strip() for c in row.strip("|").split("|")]
        assert "?" not in setup, (file, setup)  # machine kind, dtype and model on every row
        name = file.strip("`")
        assert name in items, (name, sorted(items))
        for number in NUM.findall(value):
            assert number.lstrip("+") in items[name], (name, number, value)
        assert "runs/" not in value
    adapt = ("| `traffic_shift_smollm2_cpu.json` |", "| `main_job_smollm2_cpu.json` |")
    lead = [r for r in rows if r.endswith(adapt)]
    assert rows[:len(lead)] == lead  # adapting to served traffic (the product's reason to exist) leads, when measured
    assert rows[len(lead)].endswith("| `concurrency_reference_smollm2_cpu.json` |")  # then the shipped drafter


def test_serving_tables_agree_with_their_summary_items(regenerated) -> None:
    report = regenerated["REPORT.md"]
    items = _items(report)
    serving = report[report.index("## Serving throughput"): report.index("## Other results")]
    for section in re.split(r"\n(?=### `)", serving):
        m = re.match(r"### `([\w.-]+\.json)`", section)
        if not m:
            continue
        name = m.group(1)
        rows = _tables(section)[0][2:]
        assert rows, name
        if "| T | concurrency |" in section:  # concurrency_reference.py: per temperature, speedups in order
            by_t: Dict[str, List[str]] = {}
            for row in rows:
                cells = [c.strip() for c in row.strip("|").split("|")]
                by_t.setdefault(cells[0], []).append(cells[4])
            for t, speeds in by_t.items():
                assert f"{t}: {' / '.join(speeds)} at concurrency" in items[name], (name, t, speeds)
        else:  # specopd bench serve: one row per level
            speeds = [[c.strip() for c in row.strip("|").split("|")][3] for row in rows]
            assert f"output tokens/s {' / '.join(speeds)} at concurrency" in items[name], (name, speeds)
