"""SGLang 0.5.23's own DFlash2DraftModel / DSparkDraftModel on CPU, fp32, for tests/test_drafter_dflash2_dspark.py.

Run as ``python _sglang_semi_ar_parity.py CASES_JSON`` in a subprocess with ``SGLANG_USE_CPU_ENGINE=1``, the
sgl_kernel stand-in on PYTHONPATH, ``TORCHDYNAMO_DISABLE=1`` (SGLang's ``torch.compile`` helpers run eagerly) and
``SGLANG_RAGGED_VERIFY_MODE=cap-accept`` (so DSpark builds its confidence head). Each case names a drafter
checkpoint and an inputs file (context features, target embedding and LM head, anchor token, uniforms). Prints
one ``RESULT {json}`` line.

Everything is SGLang's code: config parsing (``get_config``), the model class and ``load_weights``, the context
K/V as the workers write the draft KV cache (``project_target_hidden``, then DFLASH's per-layer ``kv_proj_only``,
``apply_k_norm``, ``apply_k_rope``, or DSpark's ``_project_ctx_kv_stacked``), the layers with their convs, the DFlash2 selector (``_selector_lattice``,
``CandidateSelector.sample_path``) and DSpark's head (``compute_base_logits``, ``draft_markov_block`` with its torch
reference kernels, ``compute_confidence``). Two things are stood in: the attention kernel (RadixAttention over a
paged KV cache) by :class:`BlockAttention`, ENCODER_ONLY softmax attention of the block's queries over the context
keys then the block's own keys (the DFlash semantics the live-server parity test checks for DFlash); and
flashinfer's CUDA-only top-k by SGLang's own ``torch.topk`` fallback (``_radix_topk``; a CPU engine serving
DFlash2 needs the same). The tensor-parallel group is a one-rank :class:`SingleRank`.
"""

from __future__ import annotations

import json
import sys

import torch
from safetensors.torch import load_file
from torch import nn


class BlockAttention(nn.Module):
    """Stand-in for ``RadixAttention(attn_type=ENCODER_ONLY)`` on one block: q ``[N, heads*hd]``, k/v
    ``[N, kv_heads*hd]``; keys = ``[context K ; block K]``, no mask."""

    def __init__(self, ctx_k: torch.Tensor, ctx_v: torch.Tensor, attn) -> None:
        super().__init__()
        self.ctx_k, self.ctx_v = ctx_k, ctx_v
        self.heads, self.kv_heads, self.head_dim, self.scaling = attn.num_heads, attn.num_kv_heads, attn.head_dim, \
            attn.scaling

    def forward(self, q, k, v, forward_batch=None, **kwargs):
        n, rep = q.shape[0], self.heads // self.kv_heads
        keys = torch.cat([self.ctx_k, k.view(n, self.kv_heads, self.head_dim)]).transpose(0, 1)
        values = torch.cat([self.ctx_v, v.view(n, self.kv_heads, self.head_dim)]).transpose(0, 1)
        keys, values = keys.repeat_interleave(rep, 0), values.repeat_interleave(rep, 0)
        scores = q.view(n, self.heads, self.head_dim).transpose(0, 1) @ keys.transpose(1, 2) * self.scaling
        return (torch.softmax(scores.float(), -1).to(values.dtype) @ values).transpose(0, 1).reshape(n, -1)


class Head(nn.Module):
    """The target LM head as the workers attach it (dense weight, whole vocabulary, no quant method)."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.org_vocab_size = weight.shape[0]
        self.quant_method = None


class SingleRank:
    """The tensor-parallel group of a one-rank run (collectives are identities)."""

    world_size, rank_in_group = 1, 0

    def all_gather(self, x, dim=-1):
        return x

    def sync(self, site, values):  # SpecTpSync of one rank
        return values


def load_model(cls, drafter_dir: str):
    from sglang.srt.utils.hf_transformers.config import get_config

    m = cls(get_config(drafter_dir, trust_remote_code=False)).eval()
    for prm in m.parameters():
        prm.data.fill_(float("nan"))
    m.load_weights(load_file(f"{drafter_dir}/model.safetensors").items())
    unloaded = sorted(n for n, prm in m.named_parameters() if torch.isnan(prm).any())
    return m, unloaded


def backbone(m, inputs: dict, rows: int) -> torch.Tensor:
    """Draft hidden ``[rows, H]`` of ``[anchor, MASK x (rows-1)]`` at positions ``anchor_pos ..``."""
    feats = inputs["features"]
    t = feats.shape[0]
    ctx = m.project_target_hidden(feats)
    stacked = m._stacked_ctx_kv_params() if hasattr(m, "_stacked_ctx_kv_params") else None
    if stacked is not None:  # DSpark's default context-KV path (SGLANG_DSPARK_STACKED_CTX_KV)
        k_all, v_all = m._project_ctx_kv_stacked(ctx_hidden=ctx, positions=torch.arange(t), stacked=stacked)
    for i, layer in enumerate(m.layers):
        attn = layer.self_attn
        if stacked is not None:
            k, v = k_all[i], v_all[i]
        else:  # the DFLASH worker's per-layer path
            k, v = attn.kv_proj_only(ctx)
            k = attn.apply_k_rope(torch.arange(t), attn.apply_k_norm(k))
        attn.attn = BlockAttention(k.reshape(t, attn.num_kv_heads, attn.head_dim),
                                   v.reshape(t, attn.num_kv_heads, attn.head_dim), attn)
    ids = torch.full((rows,), int(inputs["mask_token_id"]), dtype=torch.long)
    ids[0] = int(inputs["anchor_token"])
    positions = t + torch.arange(rows)
    return m(ids, positions, None, input_embeds=inputs["embed"][ids]).hidden_states


def dflash2_case(case: dict, inputs: dict) -> dict:
    import sglang.srt.models.dflash as dflash
    from sglang.srt.speculative.dflash_worker_v2 import _selector_lattice

    dflash._flashinfer_top_k = None  # flashinfer's top_k is CUDA-only: take SGLang's own torch.topk fallback
    DFlash2DraftModel = dflash.DFlash2DraftModel
    m, unloaded = load_model(DFlash2DraftModel, case["drafter"])
    b = int(case["block_size"])
    m.set_block_size(b)
    hidden = backbone(m, inputs, b)
    m.lm_head = Head(inputs["lm_head"])
    anchor = torch.tensor([int(inputs["anchor_token"])])
    cand, scores = _selector_lattice(m, hidden.view(1, b, -1)[:, 1:], anchor)
    u = inputs["uniforms"].view(1, b - 1)
    out = {"unloaded": unloaded, "hidden": hidden[1:].tolist(), "candidates": cand[0].tolist()}
    for name, temp, greedy in (("greedy", 1.0, True), ("sampled", float(case["temperature"]), False)):
        tokens, q_rows = m.candidate_selector.sample_path(
            candidate_ids=cand, scores=scores, uniforms=u, temperatures=torch.tensor([temp]),
            greedy_mask=torch.tensor([greedy]))
        out[name] = tokens[0].tolist()
        out[name + "_q"] = q_rows[0].tolist()
    return out


def dspark_case(case: dict, inputs: dict) -> dict:
    import sglang.srt.models.dspark as dspark
    from sglang.srt.speculative.dspark_components.dspark_draft import (DraftNoise, draft_markov_block,
                                                                       select_draft_hidden_without_anchor)

    m, unloaded = load_model(dspark.DSparkDraftModel, case["drafter"])
    gamma = int(m.gamma)
    rows = gamma if m.sample_from_anchor else gamma + 1
    hidden = backbone(m, inputs, rows)
    if not m.sample_from_anchor:
        hidden = select_draft_hidden_without_anchor(hidden, bs=1, gamma=gamma)[0]
    m.lm_head = Head(inputs["lm_head"])
    base, conf_features = m.compute_base_logits(hidden)
    base = base.view(1, gamma, -1)
    anchor = torch.tensor([int(inputs["anchor_token"])])
    out = {"unloaded": unloaded, "gamma": gamma, "rows": rows, "hidden": hidden.tolist(),
           "has_confidence_head": m.confidence_head is not None,
           "stacked_ctx_kv": m._stacked_ctx_kv_params() is not None}
    for name, temp in (("greedy", 0.0), ("sampled", float(case["temperature"]))):
        tokens, step_logits = draft_markov_block(
            markov_head=m.markov_head, base_logits=base, anchor_tokens=anchor, draft_hidden=hidden.view(1, gamma, -1),
            step_temperatures=torch.tensor([temp]), noise=DraftNoise(key=7, offset=torch.zeros(1, dtype=torch.int64)),
            tp_sync=SingleRank(), greedy_draft=temp == 0.0)
        out[name] = tokens[0].tolist()
        if step_logits is not None:
            out[name + "_step_logits"] = step_logits[0].tolist()
    conf, raw = m.compute_confidence(anchor_tokens=anchor, draft_tokens=torch.tensor([out["greedy"]]),
                                     confidence_features=conf_features)
    out["confidence"], out["confidence_raw"] = conf[0].tolist(), raw[0].tolist()
    return out


def main() -> None:
    from sglang.srt.runtime_context import get_parallel

    cases = json.loads(sys.argv[1])
    results = []
    with torch.no_grad(), get_parallel().override(tp_size=1, tp_rank=0, tp_group=SingleRank()):
        for case in cases:
            inputs = {**load_file(case["inputs"]), **case["scalars"]}
            run = dflash2_case if case["kind"] == "dflash2" else dspark_case
            results.append(run(case, inputs))
    print("RESULT " + json.dumps(results))


if __name__ == "__main__":
    main()
