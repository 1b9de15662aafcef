"""Serving checks shared by the serving tests: :func:`check_trace` (every invariant of a traced SPECOPD response;
test_serve_tiny.py, test_serve_dflash2.py, test_serve_dspark.py) and :func:`specopd_exe` (the installed console
script; test_serve_cli.py, test_fleet_server.py)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import List, Optional

import pytest

TRACE_KEY = "specopd_trace"


def check_trace(resp: dict, block_size: int, max_new_tokens: int, output_ids: Optional[List[int]] = None) -> list:
    """Assert every invariant of a traced response (see the module docstring); return the trace."""
    meta = resp["meta_info"]
    out = resp["output_ids"] if output_ids is None else output_ids
    trace = meta.get(TRACE_KEY)
    assert isinstance(trace, list) and trace, f"trace asked for but missing: {sorted(meta)}"
    completion = meta["completion_tokens"]
    assert completion == len(out)
    assert len(trace) == meta["spec_verify_ct"]
    prompt_tokens = meta["prompt_tokens"]
    for rec in trace:
        assert set(rec) == {"anchor", "proposed", "accepted", "drafter_version"}, rec
        assert isinstance(rec["drafter_version"], str) and rec["drafter_version"], rec
        assert len(rec["proposed"]) == block_size - 1, rec
        assert all(isinstance(t, int) for t in rec["proposed"])
        assert 0 <= rec["accepted"] <= block_size - 1, rec
    anchors = [r["anchor"] for r in trace]
    accepted = [r["accepted"] for r in trace]
    assert anchors[0] == prompt_tokens, "the first verify step is anchored at the prefill's token"
    assert all(b > a for a, b in zip(anchors, anchors[1:])), "anchors strictly increase"
    for i in range(len(trace) - 1):
        assert anchors[i + 1] == anchors[i] + accepted[i] + 1, (i, trace[i], trace[i + 1])
    # Accepted drafts are the output's next tokens; the first rejected draft is not.
    for rec in trace:
        base = rec["anchor"] - prompt_tokens + 1
        for k in range(rec["accepted"]):
            if base + k < completion:
                assert out[base + k] == rec["proposed"][k], (rec, out)
        k = rec["accepted"]
        if k < block_size - 1 and base + k < completion:
            assert out[base + k] != rec["proposed"][k], (rec, out)
    produced = 1 + sum(a + 1 for a in accepted)
    assert completion == min(produced, max_new_tokens), (completion, produced, max_new_tokens)
    assert produced - (accepted[-1] + 1) < max_new_tokens, "a verify step ran after the limit was reached"
    assert meta["finish_reason"]["type"] == "length"
    assert meta["spec_accept_length"] == pytest.approx(completion / meta["spec_verify_ct"])
    # SGLang's own counters agree with the trace (both keep the last step's full ``accepted``); its histogram
    # stops at the highest bin reached.
    hist = meta["spec_correct_drafts_histogram"]
    assert 1 <= len(hist) <= block_size, hist
    assert hist + [0] * (block_size - len(hist)) == [accepted.count(k) for k in range(block_size)], (hist, accepted)
    assert meta["spec_num_correct_drafts"] == sum(accepted)
    return trace


def specopd_exe() -> str:
    exe = Path(sys.executable).with_name("specopd")
    if exe.is_file():
        return str(exe)
    found = shutil.which("specopd")
    assert found, "the specopd console script is not installed"
    return found
