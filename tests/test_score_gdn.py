"""Tree scoring's Gated DeltaNet (GDN) path, without a server (:mod:`sglang_specopd.server.scoring.gdn`).

* the GDN hook's layer function on a real SGLang ``RadixLinearAttention`` over a packed tree row equals the slow
  reference (:func:`specopd_kernels.gdn.gdn_tree_naive`: every node as its own sequence);
* which targets the endpoint scores, from SGLang's own hybrid-architecture table: full attention and hybrid GDN,
  while Mamba2 (Nemotron-H), KDA (Kimi Linear) and GDN layers in another form are refused naming the reason;
* the HTTP side refuses an unscorable target before parsing, and the cost estimate of a hybrid target ignores
  the piece budget (its references run whole).
The server path is in ``tests/test_score_trees_hybrid_gdn.py``.
"""

from __future__ import annotations

import types

import pytest
import torch

from sglang_specopd.server import compat
from specopd_kernels.gdn import build_gdn_tree_layout, gdn_tree_naive, random_gdn_params
from specopd_kernels.tree import build_tree_layout

H, HV, DK, DV, W = 2, 4, 8, 6, 4


def _linear_attention(params, layer_id: int = 0, **overrides):
    """SGLang's RadixLinearAttention holding ``params`` (the way Qwen3GatedDeltaNet builds it)."""
    kw = dict(layer_id=layer_id, num_q_heads=H, num_k_heads=H, num_v_heads=HV, head_q_dim=DK, head_k_dim=DK,
              head_v_dim=DV, conv_weights=params.conv_weight, bias=None, activation="silu", A_log=params.A_log,
              dt_bias=params.dt_bias)
    kw.update(overrides)
    return compat.get("RadixLinearAttention")(**kw)


def _model(*layers):
    model = torch.nn.Module()
    model.layers = torch.nn.ModuleList(layers)
    return model


def _model_config(hf_config):
    return types.SimpleNamespace(hf_config=hf_config, is_draft_model=False, linear_attn_registry_result=None)


def test_gdn_layer_equals_each_node_as_its_own_sequence() -> None:
    from sglang_specopd.server.scoring.gdn import gdn_tree_layer
    from sglang_specopd.server.scoring.tree_call import TreeCall

    params = random_gdn_params(H, HV, DK, DV, W, seed=5)
    layer = _linear_attention(params)
    P = 11
    anchors = [0, 4, 4, 10]
    parents = [[-1, 0, 1], [-1, -1, 0, 2], [-1], [-1, 0, 0, 1]]  # depth 3, fan-out, a shared anchor
    layout = build_tree_layout(P, anchors, parents)
    T = P + sum(len(p) for p in parents)
    gen = torch.Generator().manual_seed(0)
    mixed = torch.randn(T, 2 * H * DK + HV * DV, generator=gen)
    a, b = torch.randn(T, HV, generator=gen), torch.randn(T, HV, generator=gen)
    call = TreeCall(layout)
    got = gdn_tree_layer(layer, call, mixed, a, b)
    assert got.shape == (1, T, HV, DV)
    node_anchor = [x for x, p in zip(anchors, parents) for _ in p]
    offsets = [0]
    for p in parents:
        offsets.append(offsets[-1] + len(p))
    node_parent = [q if q < 0 else offsets[g] + q for g, p in enumerate(parents) for q in p]
    want = gdn_tree_naive(mixed, a, b, params, build_gdn_tree_layout(P, node_anchor, node_parent)).output
    assert (got[0] - want).abs().max() < 2e-5
    assert call.gdn_layout is not None  # built once, shared by the row's other GDN layers


def test_full_attention_and_hybrid_gdn_targets_are_scorable() -> None:
    from transformers import LlamaConfig

    from sglang.srt.configs import Qwen3NextConfig
    from sglang_specopd.server.scoring.gdn import unscorable_reason

    params = random_gdn_params(H, HV, DK, DV, W, seed=1)
    assert unscorable_reason(_model_config(LlamaConfig()), _model(torch.nn.Linear(2, 2))) == ""
    assert unscorable_reason(_model_config(Qwen3NextConfig()), _model(_linear_attention(params))) == ""


@pytest.mark.parametrize("kind", ["mamba2", "kda", "gdn without layers", "gdn separate convs", "gdn kda gate"])
def test_other_recurrent_targets_are_refused_with_the_reason(kind: str) -> None:
    from sglang.srt.configs import KimiLinearConfig, NemotronHConfig, Qwen3NextConfig
    from sglang_specopd.server.scoring.gdn import unscorable_reason

    params = random_gdn_params(H, HV, DK, DV, W, seed=1)
    gdn = _model_config(Qwen3NextConfig())
    cases = {
        "mamba2": (_model_config(NemotronHConfig()), _model(), ["NemotronHConfig", "not Gated DeltaNet"]),
        "kda": (_model_config(KimiLinearConfig()), _model(_linear_attention(params)),
                ["KimiLinearConfig", "not Gated DeltaNet"]),
        "gdn without layers": (gdn, _model(), ["no Gated DeltaNet layer"]),
        "gdn separate convs": (gdn, _model(_linear_attention(params, layer_id=3, conv_weights=(params.conv_weight,))),
                               ["layer 3", "conv weights"]),
        "gdn kda gate": (gdn, _model(_linear_attention(params, lower_bound=-5.0)), ["gates"]),
    }
    config, model, needles = cases[kind]
    reason = unscorable_reason(config, model)
    assert reason.startswith("score_trees cannot score this target")
    for needle in needles:
        assert needle in reason, (needle, reason)


def test_sparse_attention_targets_are_scorable_and_recognised() -> None:
    """A QSA indexer (Qwen4-Exp) no longer makes a target unscorable: its layers select per tree node
    (server/scoring/qsa.py); the GDN checks still apply to the same model's linear-attention layers."""
    from sglang.srt.configs import Qwen3NextConfig
    from sglang.srt.layers.attention.qsa.qsa_indexer import QSAIndexer
    from sglang_specopd.server.scoring.gdn import unscorable_reason

    params = random_gdn_params(H, HV, DK, DV, W, seed=1)
    indexer = QSAIndexer.__new__(QSAIndexer)  # no constructor arguments needed to be recognised
    torch.nn.Module.__init__(indexer)
    attn = torch.nn.Module()
    attn.indexer = indexer
    config = _model_config(Qwen3NextConfig())
    with_qsa = _model(_linear_attention(params), attn)
    assert unscorable_reason(config, with_qsa) == ""


def test_http_side_refuses_an_unscorable_target_before_parsing() -> None:
    from sglang_specopd.server.scoring.admission import prepare
    from sglang_specopd.server.scoring.cost import ScoreSettings, TargetDims
    from sglang_specopd.wire.protocol import ScoreTreesError

    dims = TargetDims(num_layers=4, hidden=8, intermediate=16, q_heads=2, kv_heads=1, head_dim=4, vocab=100,
                      act_bytes=4, unscorable="score_trees cannot score this target (NemotronHConfig): ...")
    with pytest.raises(ScoreTreesError, match="NemotronHConfig"):
        prepare(b"not even json", False, dims, ScoreSettings())


def test_hybrid_cost_ignores_the_piece_budget_and_counts_gdn_states() -> None:
    from sglang_specopd.server.scoring.cost import TargetDims, estimate_cost
    from sglang_specopd.wire.protocol import ScoreTreesRequest

    req = ScoreTreesRequest(references=[{"input_ids": list(range(5, 1005)),
                                         "trees": [{"anchor": a, "branches": [[5, 6, 7]]} for a in range(0, 900, 9)]}],
                            block_size=4)
    base = dict(num_layers=8, hidden=256, intermediate=512, q_heads=4, kv_heads=2, head_dim=64, vocab=49152,
                act_bytes=4)
    full = TargetDims(**base)
    hybrid = TargetDims(**base, gdn_layers=6, gdn_state_values=4 * 32 * 32)
    assert estimate_cost(req, full, 64).peak_bytes < estimate_cost(req, full, 0).peak_bytes  # chunking bounds it
    assert estimate_cost(req, hybrid, 64).peak_bytes == estimate_cost(req, hybrid, 0).peak_bytes  # never chunked
    # the GDN states of one layer (1000 // 64 + 1 boundaries, 100 anchors, 300 nodes) dominate the attention term
    assert estimate_cost(req, hybrid, 0).peak_bytes >= (1000 // 64 + 1 + 100 + 300) * 4 * 32 * 32 * 4
