"""README.md: numbers in its prose come from result files.

Outside the blocks ``specopd bench report --readme`` generates (which read every number from a result file) and
outside code, a number may appear only in a paragraph, list item or table row that names the file it comes from
(a path with an extension: ``specopd_smollm2_cpu.json``, ``server_configs/cpu-smollm2.yaml``). A heuristic:
numbers glued to letters (``Qwen3-8B``, ``SmolLM2``, ``bf16``, ``H200``), after ``=`` or ``#`` (``T=0``,
``#20``) or inside identifiers in inline code (``sglang==0.5.23``, ``--steps 256``) are names, not measurements.
Inline code that is only a measurement (``1.42x``) still counts.

Issue 50: in README prose and docs/*.md (the journal excepted) every measurement-shaped number (a ratio ``1.23x``,
a rate ``N tokens/s``, an interval ``[a, b]`` and the value given with it) must also be a value of a result file
under benchmarks/results/ (or history/) that its unit names, a table row also through its caption or header row.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import List

from sglang_specopd.app.bench.report.readme import BLOCKS

README = Path(__file__).resolve().parents[1] / "README.md"
NUMBER = re.compile(r"(?<![\w.\-/#=~^])\d+(?:[.,]\d+)*(?:x|%|s|ms|min|h|k|GB|GiB|MB|MiB)?(?![\w])")
MEASUREMENT_CODE = re.compile(r"`\s*[~+-]?\d+(?:[.,]\d+)*\s*(?:x|%|s|ms|min|h|k|GB|GiB|MB|MiB)?\s*`")
FILE_REF = re.compile(r"[\w./-]+\.(?:json|jsonl|png|py|yaml|yml|md|toml|sh)\b")
LIST_ITEM = re.compile(r"^(\s*)(?:[-*+]|\d+[.)])\s+")


def _strip_generated_and_code(text: str) -> str:
    for start, end in BLOCKS:
        while start in text and end in text[text.index(start):]:
            i = text.index(start)
            j = text.index(end, i) + len(end)
            text = text[:i] + text[j:]
    text = re.sub(r"^```.*?^```[^\n]*$", "", text, flags=re.S | re.M)  # fenced code
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)  # comments
    return re.sub(r"\]\([^)]*\)", "]", text)  # link targets


def _units(text: str) -> List[str]:
    """Paragraphs, list items (with their continuation lines) and table rows, list markers removed."""
    units: List[str] = []
    cur: List[str] = []

    def flush() -> None:
        if cur:
            units.append(" ".join(cur))
            cur.clear()

    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            flush()
            if line.strip():
                units.append(line.lstrip("# "))  # a heading is its own unit
        elif line.lstrip().startswith("|"):
            flush()
            units.append(line)
        elif LIST_ITEM.match(line):
            flush()
            cur.append(LIST_ITEM.sub("", line))
        else:
            cur.append(line)
    flush()
    return units


def unsourced_numbers(text: str) -> List[str]:
    """The units of ``text`` (outside generated blocks and code) with a number but no file named."""
    bad = []
    for unit in _units(_strip_generated_and_code(text)):
        measurement_code = MEASUREMENT_CODE.findall(unit)
        prose = re.sub(r"`[^`]*`", " ", unit)  # identifiers, flags, paths in inline code
        if (NUMBER.search(prose) or measurement_code) and not FILE_REF.search(unit):
            bad.append(unit.strip())
    return bad


def test_checker_flags_unsourced_numbers_and_accepts_sourced_ones() -> None:
    start, end = BLOCKS[0]
    flagged = unsourced_numbers(
        "# Title\n\nSpecOPD is 1.42x faster.\n\n- coding tau 1.57\n  over 8 prompts\n\n| arm | 1.409 |\n\n"
        "It took 20 minutes.\n\nA speed-up of `7.3x`.\n\n1. first step\n2. then 3 more\n")
    assert flagged == ["SpecOPD is 1.42x faster.", "coding tau 1.57   over 8 prompts", "| arm | 1.409 |",
                       "It took 20 minutes.", "A speed-up of `7.3x`.", "then 3 more"]
    assert unsourced_numbers(
        "SpecOPD 1.409 / 1.283 (`specopd_smollm2_cpu.json`).\n\n- block 8 (server_configs/cpu-smollm2.yaml)\n\n"
        f"{start}\n| 1 | 13.05 | 1.02x |\n{end}\n\n```bash\nspecopd train --steps 256\n```\n\n"
        "Qwen3-8B, SmolLM2-135M, bf16, an H200, T=0, T0/T1, issue #20, `sglang==0.5.23`, `--lr 1e-3`, E2E-TV.\n"
        "[link](https://example.org/v1/2024)\n\n1. a numbered step\n") == []


def test_readme_numbers_outside_generated_blocks_name_their_file() -> None:
    text = README.read_text()
    for start, end in BLOCKS:
        assert text.count(start) == 1 and text.count(end) == 1 and text.index(start) < text.index(end)
    assert unsourced_numbers(text) == []


def test_readme_keeps_the_two_setup_commands() -> None:
    text = README.read_text()
    assert "```bash\nbash scripts/main.sh\n```" in text and "```bash\nbash scripts/test.sh\n```" in text
    assert len(text.splitlines()) < 250
    for doc in ("docs/journal.md", "docs/score_trees.md", "docs/prefix_cache.md", "docs/hot_swap.md",
                "docs/cpu_adaptations.md", "docs/sampled_drafts.md", "docs/architecture.md"):
        assert f"]({doc})" in text and (README.parent / doc).is_file(), doc


def _json_numbers(value) -> set:
    if isinstance(value, dict):
        return set().union(*(_json_numbers(v) for v in value.values())) if value else set()
    if isinstance(value, list):
        return set().union(*(_json_numbers(v) for v in value)) if value else set()
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return {f"{value:.{d}f}" for d in (0, 1, 2, 3)} | {str(value)}
    return set()


def test_server_config_comments_quote_only_numbers_of_the_result_file_they_name() -> None:
    """Every ratio or rate (``1.23x``, ``104 supervised tokens/s``) in a comment of server_configs/*.yaml is a value
    of a result file the same comment names (issue 50: the configs' ITL figure had drifted from its file)."""
    import json

    shaped = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)(?:x\b|\s+(?:supervised\s+)?tokens/s)")
    for config in sorted((README.parent / "server_configs").glob("*.yaml")):
        for line in config.read_text().splitlines():
            comment = line.split("#", 1)[1] if "#" in line else ""
            numbers = shaped.findall(comment)
            if not numbers:
                continue
            files = re.findall(r"[\w.-]+\.json", comment)
            assert files, (config.name, comment)
            known = set().union(*(_json_numbers(json.loads((README.parent / "benchmarks" / "results" / f).read_text()))
                                  for f in files))
            for n in numbers:
                assert n in known, (config.name, n, files)


# --- issue 50: measurement-shaped numbers in README prose and docs/ are values of the result file they name ---

RESULTS = README.parent / "benchmarks" / "results"
_NUM = r"[+-]?\d+(?:\.\d+)?"
SHAPED = re.compile(
    rf"(?<![\w.])(?P<ratio>{_NUM}(?:x?\s*[-–]\s*{_NUM})?)x(?![\w])"  # 1.23x, 1.3-3.8x, 0.51x-0.80x
    rf"|(?<![\w.])(?P<rate>{_NUM})\s*(?:supervised\s+|output\s+)?(?:tokens/s|tok/s)\b"  # 104 supervised tokens/s
    rf"|(?<![\w.])(?P<tau>{_NUM})?\s*\[\s*(?P<lo>{_NUM})\s*,\s*(?P<hi>{_NUM})\s*\]")  # 1.727 [1.670, 1.796]
RESULT_REF = re.compile(r"[\w.-]+\.json\b")


def _doc_units(text: str) -> List[tuple]:
    """``(unit, context)`` pairs: paragraphs, list items and table rows; a table row's context is the unit right
    above its table (the caption) and the table's header row, where it may find the file it comes from."""
    units = _units(text)
    out = []
    caption, header, in_table = "", "", False
    for unit in units:
        if unit.lstrip().startswith("|"):
            if not in_table:
                header, in_table = unit, True
            out.append((unit, caption + " " + header))
        else:
            in_table = False
            caption = unit
            out.append((unit, ""))
    return out


def _result_values(names: List[str]) -> tuple:
    """The files of ``names`` committed under benchmarks/results/ (or history/), and the values they hold."""
    import json

    found, values = [], set()
    for name in names:
        base = name.rsplit("/", 1)[-1]
        for path in (RESULTS / base, RESULTS / "history" / base):
            if path.is_file():
                found.append(base)
                values |= _json_numbers(json.loads(path.read_text()))
                break
    return found, values


def _shaped_numbers(prose: str) -> List[str]:
    numbers = []
    for m in SHAPED.finditer(prose):
        if m.group("ratio"):
            numbers += re.findall(r"(?:^[+-])?\d+(?:\.\d+)?", m.group("ratio"))  # 1.3-3.8: 1.3 and 3.8
        elif m.group("rate"):
            numbers.append(m.group("rate"))
        else:
            numbers += [n for n in (m.group("tau"), m.group("lo"), m.group("hi")) if n]
    return [n.lstrip("+") if not n.startswith("-") else n for n in (s.strip() for s in numbers)]


def unchecked_measurements(text: str) -> List[str]:
    """The units of ``text`` (outside generated blocks and code) holding a ratio, a rate, an interval or a value
    given with an interval that is not a value (at 0-3 decimals) of a result file the unit, or its table's caption
    or header row, names."""
    for start, end in BLOCKS:
        while start in text and end in text[text.index(start):]:
            i = text.index(start)
            text = text[:i] + text[text.index(end, i) + len(end):]
    text = re.sub(r"^```.*?^```[^\n]*$", "", text, flags=re.S | re.M)
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    bad = []
    for unit, context in _doc_units(text):
        prose = re.sub(r"\]\([^)]*\)", "]", unit)
        prose = re.sub(r"`([^`]*)`", lambda m: m.group(1) if MEASUREMENT_CODE.fullmatch(m.group(0)) else " ", prose)
        numbers = _shaped_numbers(prose)
        if not numbers:
            continue
        files, values = _result_values(RESULT_REF.findall(unit) or RESULT_REF.findall(context))
        missing = [n for n in numbers if n not in values and n.lstrip("-") not in values]
        if not files or missing:
            bad.append(f"{unit.strip()[:160]} -> files {files}, not in them: {missing}")
    return bad


def test_measurement_checker_on_a_made_up_doc() -> None:
    ok = ("The shipped drafter serves at 0.65x plain, tau 1.727 [1.670, 1.796] "
          "(`concurrency_reference_smollm2_cpu.json`).\n\n"
          "Goodput over plain (`goodput_smollm2_cpu.json`):\n\n| concurrency | goodput / plain |\n|---|---|\n"
          "| 1 | 1.17x |\n| 2 | 1.14x |\n\nA name such as Qwen3-8B or an H200 or `--steps 256` is no measurement.\n")
    assert unchecked_measurements(ok) == []
    bad = unchecked_measurements(
        "SpecOPD is 1.42x faster.\n\n"
        "Goodput is 9.99x plain (`goodput_smollm2_cpu.json`).\n\n## Without a caption\n\n"
        "| concurrency | goodput / plain |\n|---|---|\n| 1 | 1.17x |\n")
    assert [b.split(" -> ")[0] for b in bad] == [
        "SpecOPD is 1.42x faster.", "Goodput is 9.99x plain (`goodput_smollm2_cpu.json`).", "| 1 | 1.17x |"]
    assert "['9.99']" in bad[1] and "files []" in bad[0]


def test_readme_prose_measurements_are_values_of_the_file_they_name() -> None:
    assert unchecked_measurements(README.read_text()) == []


def test_docs_measurements_are_values_of_the_result_file_they_name() -> None:
    """docs/*.md except the journal (history): ratios, rates, intervals and values with an interval come from a
    committed result file named in the same paragraph, list item, table row or the table's caption / header."""
    bad = {}
    for doc in sorted((README.parent / "docs").glob("*.md")):
        if doc.name != "journal.md":
            found = unchecked_measurements(doc.read_text())
            if found:
                bad[doc.name] = found
    assert bad == {}
