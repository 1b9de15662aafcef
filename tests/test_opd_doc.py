"""docs/opd.md quotes only numbers that are in committed result files: every decimal number in a paragraph must be
a value (to the quoted precision) of a ``benchmarks/results/*.json`` file named in the same paragraph."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NUMBER = re.compile(r"(?<![\w.])([-+]?\d+\.\d+)(?!\w)(?!\.\d)")
RESULT = re.compile(r"benchmarks/results/[\w.\-]+\.json")


def _values(obj, out):
    if isinstance(obj, dict):
        for v in obj.values():
            _values(v, out)
    elif isinstance(obj, list):
        for v in obj:
            _values(v, out)
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool):
        out.append(float(obj))
    return out


def unsupported(text: str, root: Path = ROOT):
    """``[(number, reason)]`` for every decimal number of ``text`` no committed file of its paragraph holds."""
    bad = []
    for para in re.split(r"\n\s*\n", text):
        if para.lstrip().startswith("```"):
            continue
        nums = NUMBER.findall(para)
        if not nums:
            continue
        files = [root / f for f in RESULT.findall(para) if (root / f).is_file()]
        values = [v for f in files for v in _values(json.loads(f.read_text()), [])]
        for n in nums:
            tol = 0.5 * 10 ** -len(n.split(".")[1]) + 1e-12
            if not any(abs(v - float(n)) <= tol for v in values):
                bad.append((n, "no committed result file in its paragraph holds it" if files else
                            "its paragraph names no committed result file"))
    return bad


def test_every_number_in_opd_md_is_in_a_committed_result_file_named_beside_it():
    text = (ROOT / "docs" / "opd.md").read_text()
    assert NUMBER.findall(text), "the page quotes the committed evidence"
    assert unsupported(text) == []
    assert "## Not yet measured" in text and "opd_regimes_smollm2_cpu.json" in text


def test_the_check_catches_an_invented_or_unsourced_number(tmp_path):
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    (tmp_path / "benchmarks" / "results" / "x.json").write_text(json.dumps({"a": {"b": [-0.0236, 71.62]}}))
    ok = "In `benchmarks/results/x.json` the gain is -0.024 and the wall 71.6 s."
    assert unsupported(ok, tmp_path) == []
    assert unsupported("In `benchmarks/results/x.json` the gain is -0.030.", tmp_path)[0][0] == "-0.030"
    assert "names no committed" in unsupported("A gain of -0.024.\n\nSee benchmarks/results/x.json.", tmp_path)[0][1]
