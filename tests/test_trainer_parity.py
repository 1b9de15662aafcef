"""Parity: the trainer's DFlashDrafter proposes exactly what a live SGLang SPECOPD/DFLASH server proposes.

One CPU server (tiny Llama target, fp32, torch_native; shared with test_draft_opd_parity.py) with a random drafter
whose weights are 10x the init scale (so context, attention pattern and every layer visibly change the argmax; at
the 0.02 init scale the residual stream is dominated by the mask-token embedding and almost every proposal is the
mask token). The server's acceptance traces give, per verify step, the anchor position and the B-1 proposed ids;
the trainer recomputes them from HF hidden states (index id+1) of the prefix [0, anchor) and the anchor token.
On CPU this needs the torch_native TARGET_VERIFY adaptation to keep the draft's ENCODER_ONLY (non-causal)
attention non-causal, as SGLang's GPU backends do; a causal draft attention is diagnosed in the failure message.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.server

PROMPTS = ("def add(a, b):\n    return", "Return the sum of the arguments.")
NEW_TOKENS = 24
BLOCK_SIZE = 8


def _strong_drafter(target: Path, out: Path):
    from sglang_specopd.wire.drafters.init import init_drafter, init_drafter_tensors, save_drafter

    spec = init_drafter(target, out, block_size=BLOCK_SIZE, num_layers=2, seed=1, target_layer_ids=[0, 2])
    g = torch.Generator().manual_seed(5)
    tensors = {n: (t * 10 if t.ndim == 2 else 1 + 0.3 * torch.randn(t.shape, generator=g))
               for n, t in init_drafter_tensors(spec, seed=3).items()}
    save_drafter(spec, tensors, out, overwrite=True)
    return spec


@pytest.fixture(scope="module")
def parity_server(request, shared_servers_guard, tiny_target: Path, tmp_path_factory: pytest.TempPathFactory):
    """The SPECOPD server (tiny target, :func:`_strong_drafter`, block 8, no admin key) of this module and
    test_draft_opd_parity.py: one shared server (tests/_servers.py); its drafter directory is
    ``spec.drafter_path``."""
    from _servers import lend, start_specopd
    from conftest import tiny_launch_spec
    from sglang_specopd.app.launch.process import free_port

    def start(stack):
        root = tmp_path_factory.mktemp("parity")
        _strong_drafter(tiny_target, root / "drafter")
        spec = tiny_launch_spec(tiny_target, free_port(), root / "drafter")
        spec.block_size = BLOCK_SIZE
        return start_specopd(stack, spec, root, "parity")

    yield from lend(request, "parity_server", start)


@pytest.fixture(scope="module")
def served(parity_server, tiny_target: Path):
    import httpx
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_target)
    runs = []
    for prompt in PROMPTS:
        ids = tok(prompt)["input_ids"]
        r = httpx.post(parity_server.url + "/generate", timeout=120, json={
            "input_ids": ids, "sampling_params": {"temperature": 0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True,
                                                  "custom_params": {"specopd_trace": True}}})
        r.raise_for_status()
        body = r.json()
        runs.append((ids + body["output_ids"], body["meta_info"]["specopd_trace"]))
    return tiny_target, Path(parity_server.spec.drafter_path), runs


def test_trainer_proposals_equal_server_proposals(served) -> None:
    from transformers import AutoModelForCausalLM

    from specopd_trainer.drafters.dflash import DFlashDrafter
    from specopd_trainer.drafters.features import hf_context_features

    target, drafter_dir, runs = served
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    drafter = DFlashDrafter.from_pretrained(drafter_dir, target).eval()
    b = drafter.block_size
    checked, mismatches, causal_matches = 0, [], 0
    for seq, trace in runs:
        assert len(trace) >= NEW_TOKENS // b
        feats = hf_context_features(model, torch.tensor(seq), drafter.spec.target_layer_ids)
        for step in trace:
            a = step["anchor"]
            ours = drafter.propose(feats[:a], seq[a], a).tolist()
            checked += 1
            if ours != step["proposed"]:
                mismatches.append((a, step["proposed"], ours))
                # diagnose the known CPU-backend fault: a causal (not ENCODER_ONLY) draft attention
                kv = drafter.context_kv(feats[:a], torch.arange(a))
                mask = torch.cat([torch.ones(b, a, dtype=torch.bool), torch.ones(b, b, dtype=torch.bool).tril()], 1)
                ids = torch.full((b,), drafter.spec.mask_token_id)
                ids[0] = seq[a]
                with torch.no_grad():
                    hidden = drafter.forward_hidden(ids, a + torch.arange(b), kv, mask)
                causal_matches += drafter.target_head.logits(hidden[1:]).argmax(-1).tolist() == step["proposed"]
    assert checked >= 2 * (NEW_TOKENS // b)
    assert not mismatches, (
        f"{len(mismatches)}/{checked} verify steps differ (anchor, server, trainer): {mismatches[:3]}"
        + (f"; {causal_matches} of them match a CAUSAL in-block draft attention: the server's draft attention is "
           "not ENCODER_ONLY (see sglang_specopd/server/cpu/patches.py torch_native TARGET_VERIFY: causal must be "
           "False for layer.attn_type == AttentionType.ENCODER_ONLY)" if causal_matches else ""))


def test_traffic_endpoints_refused_without_an_admin_key(parity_server) -> None:
    """Traffic recording is off by default and this server has no --admin-api-key: the admin-only traffic routes
    answer 403 (SGLang's ADMIN_FORCE), whatever key is sent; no prompt or output leaves. (Moved here from
    test_serve_tiny.py, whose tiny SPECOPD server is now the shared admin server: this is the tiny server without
    an admin key.)"""
    import httpx

    from sglang_specopd.wire.traffic import TRAFFIC_PATH, TRAFFIC_PURGE_PATH

    assert parity_server.spec.traffic_spool_mb == 0 and parity_server.spec.admin_api_key is None
    for headers in ({}, {"Authorization": "Bearer anything"}):
        r = httpx.get(parity_server.url + TRAFFIC_PATH, headers=headers, timeout=60)
        assert r.status_code == 403, (r.status_code, r.text[:300])
        r = httpx.post(parity_server.url + TRAFFIC_PURGE_PATH, headers=headers, timeout=60)
        assert r.status_code == 403, (r.status_code, r.text[:300])
