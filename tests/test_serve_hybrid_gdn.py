"""A real SGLang CPU server on the tiny hybrid Gated DeltaNet target (Qwen3-Next architecture, issue 21 part 2).

The target (:mod:`sglang_specopd.app.tiny_hybrid`: 8 layers, three GDN layers per full-attention layer, GQA,
SmolLM2's tokenizer, fp32, seed 0) is served plainly with ``--device cpu --attention-backend torch_native`` through
the plugin's CPU adaptations (the GDN stand-in ops, :mod:`sglang_specopd.server.cpu.hybrid_gdn`). Greedy output ids
must equal transformers' own greedy generation of the same checkpoint, token for token; then a SPECOPD server with
a random block-4 DFlash drafter must reproduce the plain server's greedy outputs (chain verify with GDN state
rollback as SGLang does it). Servers run one at a time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Tuple

import pytest

from conftest import running_server

pytestmark = pytest.mark.server

PROMPTS = ("The capital of France is", "def fibonacci(n):", "Write a short poem about the sea.\n")
NEW_TOKENS = 24
BLOCK_SIZE = 4
# SGLang sizes the mamba state pool from free memory (47016 slots, 4.7 GB here); a test needs a handful.
MAMBA_CACHE_ARGS = ["--max-mamba-cache-size", "32"]


@pytest.fixture(scope="module")
def hybrid_target(smollm2_target: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from sglang_specopd.app.tiny_hybrid import build_tiny_qwen3next

    return build_tiny_qwen3next(tmp_path_factory.mktemp("hybrid") / "tiny-qwen3next", smollm2_target, seed=0)


def _prompt_ids(target: Path) -> Dict[str, List[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(target)
    return {p: tok(p).input_ids for p in PROMPTS}


@pytest.fixture(scope="module")
def hf_outputs(hybrid_target: Path) -> Dict[str, List[int]]:
    """transformers' greedy continuation (fp32, its torch GDN fallback) of each prompt's token ids."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hybrid_target, dtype=torch.float32).eval()
    out = {}
    for prompt, ids in _prompt_ids(hybrid_target).items():
        with torch.no_grad():
            gen = model.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False,
                                 min_new_tokens=NEW_TOKENS)
        out[prompt] = gen[0, len(ids):].tolist()
    return out


def _spec(target: Path, port: int, drafter: Path | None = None):
    from sglang_specopd.app.launch import LaunchSpec

    return LaunchSpec(
        model_path=str(target), port=port, device="cpu", dtype="float32", attention_backend="torch_native",
        max_total_tokens=2048, disable_cuda_graph=True, disable_overlap_schedule=True, sleep_on_idle=True,
        drafter_path=str(drafter) if drafter else None, speculative_algorithm="SPECOPD" if drafter else None,
        block_size=BLOCK_SIZE if drafter else None, extra_args=list(MAMBA_CACHE_ARGS),
    )


def _generate_ids(srv, ids: List[int]) -> dict:
    params = {"temperature": 0.0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True}
    r = srv.post("/generate", {"input_ids": ids, "sampling_params": params})
    assert r.status_code == 200, f"/generate -> {r.status_code}: {r.text[:500]}"
    return r.json()


def _serve(target: Path, log_dir: Path, name: str, drafter: Path | None = None) -> Tuple[Dict[str, dict], Path]:
    from sglang_specopd.app.launch import free_port

    ids = _prompt_ids(target)
    with running_server(_spec(target, free_port(), drafter), log_dir, name) as srv:
        return {p: _generate_ids(srv, ids[p]) for p in PROMPTS}, srv.log_path


@pytest.fixture(scope="module")
def plain_responses(hybrid_target: Path, tmp_path_factory: pytest.TempPathFactory) -> Dict[str, dict]:
    return _serve(hybrid_target, tmp_path_factory.mktemp("logs"), "hybrid-plain")[0]


def test_plain_greedy_equals_transformers_fp32(plain_responses, hf_outputs) -> None:
    for prompt in PROMPTS:
        got = plain_responses[prompt]["output_ids"]
        assert len(got) == NEW_TOKENS
        assert got == hf_outputs[prompt], (prompt, got, hf_outputs[prompt])


def test_specopd_greedy_equals_plain_fp32(plain_responses, hybrid_target: Path,
                                          tmp_path_factory: pytest.TempPathFactory) -> None:
    from sglang_specopd.wire.drafter_init import init_drafter

    drafter = tmp_path_factory.mktemp("hybrid-drafter") / "drafter"
    init_drafter(hybrid_target, drafter, block_size=BLOCK_SIZE, num_layers=1, seed=0)
    responses, _ = _serve(hybrid_target, tmp_path_factory.mktemp("logs"), "hybrid-specopd", drafter)
    for prompt in PROMPTS:
        resp = responses[prompt]
        assert resp["output_ids"] == plain_responses[prompt]["output_ids"], prompt
        assert resp["meta_info"]["spec_verify_ct"] >= 1, resp["meta_info"]
    # NOTE: the random drafter is never right on this target (accept length 1.0; conftest's make_accepting_target
    # LM head did not change that here), so only the commit of step 0 after a verify is exercised, not a rollback
    # to a later accepted step; tests/test_cpu_gdn_ops.py covers that scatter in isolation.
