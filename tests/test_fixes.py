"""sglang_specopd.server.fixes.extend_kwargs_in_model_dtype: DFLASH draft input embeddings in the model's dtype, not bf16.

SGLang 0.5.23's ``ModelRunner._extend_forward_kwargs`` casts ``forward_batch.input_embeds`` with a hard-coded
``.bfloat16()``; under ``--dtype float32`` the DFLASH draft layers then crashed on a dtype mismatch.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
import torch

from sglang_specopd.server.fixes import extend_kwargs_in_model_dtype

REPO = Path(__file__).resolve().parents[1]


def _batch(embeds, replace_embeds=None):
    return types.SimpleNamespace(input_embeds=embeds, replace_embeds=replace_embeds, replace_positions=None)


def _original_result(embeds) -> dict:
    return {"input_embeds": embeds.bfloat16()}  # what SGLang's _extend_forward_kwargs returns


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_non_bf16_runner_gets_embeds_in_its_dtype(dtype) -> None:
    embeds = torch.randn(5, 16, dtype=torch.float32) * 1.2345
    out = extend_kwargs_in_model_dtype(_original_result(embeds), types.SimpleNamespace(dtype=dtype), _batch(embeds))
    assert out["input_embeds"].dtype == dtype
    # cast from the batch's own embeddings, not from the bf16-rounded copy
    assert torch.equal(out["input_embeds"], embeds.to(dtype))
    if dtype == torch.float32:
        assert not torch.equal(out["input_embeds"], embeds.bfloat16().float())


def test_bf16_runner_unchanged() -> None:
    embeds = torch.randn(5, 16)
    result = _original_result(embeds)
    before = result["input_embeds"]
    out = extend_kwargs_in_model_dtype(result, types.SimpleNamespace(dtype=torch.bfloat16), _batch(embeds))
    assert out is result and out["input_embeds"] is before


def test_no_input_embeds_unchanged() -> None:
    result = {"get_embedding": True}
    out = extend_kwargs_in_model_dtype(result, types.SimpleNamespace(dtype=torch.float32), _batch(None))
    assert out == {"get_embedding": True}


def test_replace_embeds_path_left_to_sglang() -> None:
    """With token-embedding overrides SGLang already wrote into the bf16 tensor; the fix does not touch it."""
    embeds = torch.randn(3, 8)
    result = _original_result(embeds)
    out = extend_kwargs_in_model_dtype(result, types.SimpleNamespace(dtype=torch.float32),
                                       _batch(embeds, replace_embeds=torch.zeros(1, 8)))
    assert out["input_embeds"].dtype == torch.bfloat16


@pytest.mark.slow
def test_hook_fixes_sglangs_own_method() -> None:
    """The real ModelRunner._extend_forward_kwargs: bf16 for an fp32 runner before the plugin loads, fp32 after."""
    from sglang_specopd.app.launch.process import server_env

    code = textwrap.dedent('''
        import json, types, torch
        from sglang.srt.model_executor.model_runner import ModelRunner
        runner = types.SimpleNamespace(dtype=torch.float32, is_generation=True, _pp_kwargs=lambda pp: {})
        embeds = torch.randn(4, 8) * 1.2345
        batch = types.SimpleNamespace(input_embeds=embeds, replace_embeds=None, replace_positions=None)
        out = {}
        kw = ModelRunner._extend_forward_kwargs(runner, batch, None)
        out["before"] = str(kw["input_embeds"].dtype)
        from sglang.srt.plugins import load_plugins
        load_plugins()
        kw = ModelRunner._extend_forward_kwargs(runner, batch, None)
        out["after"] = str(kw["input_embeds"].dtype)
        out["exact"] = bool(torch.equal(kw["input_embeds"], embeds))
        runner.dtype = torch.bfloat16
        out["bf16_runner"] = str(ModelRunner._extend_forward_kwargs(runner, batch, None)["input_embeds"].dtype)
        print(json.dumps(out))
    ''')
    env = server_env("cpu")
    env["SGLANG_PLUGINS"] = "specopd"
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, env=env,
                          timeout=300, cwd=str(REPO))
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    out = json.loads(lines[-1])
    assert out == {"before": "torch.bfloat16", "after": "torch.float32", "exact": True,
                   "bf16_runner": "torch.bfloat16"}
