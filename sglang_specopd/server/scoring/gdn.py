"""``/specopd/score_trees`` on hybrid Gated DeltaNet (GDN) targets (Qwen3-Next / Qwen3.5 style: GDN layers with a
full-attention layer every few): the GDN layers of a tree forward, and which targets the endpoint can score.

During a tree forward (:mod:`sglang_specopd.server.scoring.tree_call`) every GDN layer's core
(``RadixLinearAttention.forward``: the short causal conv, the gates and the gated delta rule, before the gated
RMSNorm and the out projection that SGLang's own layer applies) is answered by indexed state replay over the
packed row ``[prefix (P) | nodes (N)]`` (:func:`specopd_kernels.gdn.gdn_tree_replay`): the prefix runs once,
chunked, keeping its state at every chunk boundary; the state after each anchor is replayed from the nearest
boundary; each tree node updates from its parent's state gathered by index and convolves its own window over
its ancestor chain. The row starts from the zero state and window, as a new sequence does, and SGLang's mamba
state pool is neither read nor written (the full-attention layers likewise never touch the KV cache), so each
node's output equals that of ``prefix[:anchor + 1] + its branch`` run as its own sequence.

Memory per GDN layer (fp32, S = HV x Dv x Dk values per state): the boundary states (P // 64 + 1) S, the anchor
states A S, and one depth level of node states at a time (at most N S), freed before the next layer.

Targets (:func:`check_scorable`, from SGLang's hybrid-architecture table): full attention only, or hybrid GDN
whose every linear-attention layer has the GDN form the replay computes. Others (Mamba2 / Mamba, KDA, lightning
attention, a registry linear-attention kind, GDN layers in another form) are refused with HTTP 400 naming the kind.
Sparse-attention (QSA) layers of Qwen4-Exp targets are scored by :mod:`sglang_specopd.server.scoring.qsa`.
On hybrid GDN targets the prefix cache is not used (replies say ``prefix_cache: "off"``) and a reference
always runs as one piece, whatever ``score_trees_budget_tokens`` is.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import List, Optional

from sglang_specopd.server import compat
from sglang_specopd.server.scoring.tree_call import TREE_CALL, TreeForwardBatch
from sglang_specopd.wire.protocol import ScoreTreesError

_GDN_ACTIVATIONS = ("silu", "swish")
_KIND: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # model runner -> refusal reason ("": scorable)
_GDN_LAYERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # model -> its RadixLinearAttention layers


def gdn_layers(model) -> list:
    """The served model's linear-attention layers (SGLang ``RadixLinearAttention`` modules), in module order."""
    if model not in _GDN_LAYERS:
        cls = compat.get("RadixLinearAttention")
        _GDN_LAYERS[model] = [m for m in model.modules() if isinstance(m, cls)]
    return _GDN_LAYERS[model]


def has_gdn_layers(model) -> bool:
    """Whether the served model has linear-attention (GDN) layers: then no prefix cache and no pieces."""
    return bool(gdn_layers(model))


def gdn_layer_problem(layer) -> Optional[str]:
    """Why ``layer`` (a ``RadixLinearAttention``) is not a GDN core the replay computes, or None when it is:
    one [C, W] conv over the mixed q/k/v channels with SiLU, A_log and dt_bias gates, no KDA lower bound,
    q heads = k heads of one head dim, value heads a multiple of them, C = 2 H Dk + HV Dv."""
    import torch

    w = layer.conv_weights
    if not isinstance(w, torch.Tensor) or w.dim() != 2:
        return "its conv weights are not one [channels, width] tensor (separate q/k/v convs, as in KDA)"
    if layer.A_log is None or layer.dt_bias is None or getattr(layer, "lower_bound", None) is not None:
        return "its gates are not the GDN gates (A_log, dt_bias, no lower bound)"
    if layer.activation not in _GDN_ACTIVATIONS:
        return f"its conv activation is {layer.activation!r}, not SiLU"
    if layer.num_q_heads != layer.num_k_heads or layer.head_q_dim != layer.head_k_dim:
        return "its query and key heads differ"
    if layer.num_v_heads % layer.num_k_heads:
        return "its value heads are not a multiple of its key heads"
    if w.shape[0] != layer.q_dim + layer.k_dim + layer.v_dim:
        return f"its conv has {w.shape[0]} channels, not q + k + v = {layer.q_dim + layer.k_dim + layer.v_dim}"
    return None


def unscorable_reason(model_config, model) -> str:
    """Why score_trees cannot score the served target ("" when it can). ``model_config``: SGLang's
    ``ModelConfig``; ``model``: the served causal LM. Reads SGLang's hybrid-architecture table
    (``mambaish_config`` / ``hybrid_gdn_config``) and checks every linear-attention layer."""
    hybrid = compat.get("mambaish_config")(model_config)
    layers = gdn_layers(model)
    if hybrid is None and not layers:
        return ""
    kind = type(hybrid).__name__ if hybrid is not None else "linear attention"
    base = f"score_trees cannot score this target ({kind}): "
    if compat.get("hybrid_gdn_config")(model_config) is None:
        return base + ("its recurrent / linear-attention layers are not Gated DeltaNet; only full-attention and "
                       "hybrid Gated DeltaNet targets have a tree-scoring path")
    if not layers:
        return base + "no Gated DeltaNet layer (RadixLinearAttention) was found in the served model"
    for layer in layers:
        problem = gdn_layer_problem(layer)
        if problem:
            return base + f"linear-attention layer {layer.layer_id}: {problem}"
    return ""


def _reason(model_runner) -> str:
    """:func:`unscorable_reason` of SGLang's model runner, decided once per runner."""
    if model_runner not in _KIND:
        _KIND[model_runner] = unscorable_reason(model_runner.model_config, model_runner.model)
    return _KIND[model_runner]


def check_scorable(model_runner) -> None:
    """Raise :class:`ScoreTreesError` (HTTP 400) naming the reason when the served target cannot be scored."""
    reason = _reason(model_runner)
    if reason:
        raise ScoreTreesError(reason)


def gdn_dims(model_runner) -> dict:
    """The GDN part of the ``score_dims`` reply: ``gdn_layers`` (count), ``gdn_state_values`` (HV x Dv x Dk of
    one layer's state, 0 when unscorable) and ``unscorable`` (the refusal reason, "" when scorable)."""
    layers, reason = gdn_layers(model_runner.model), _reason(model_runner)
    state = 0 if reason else max((m.num_v_heads * m.head_v_dim * m.head_k_dim for m in layers), default=0)
    return {"gdn_layers": len(layers), "gdn_state_values": int(state), "unscorable": reason}


def gdn_params(layer):
    """The :class:`specopd_kernels.gdn.GDNParams` of a GDN ``RadixLinearAttention`` (its tensors, no copy; scale
    ``head_k_dim ** -0.5`` and in-kernel q/k L2 norm, as SGLang's GDN kernels are called)."""
    from specopd_kernels.gdn import GDNParams

    bias = layer.bias if layer.bias is None or layer.bias.dim() == 1 else layer.bias.reshape(-1)
    return GDNParams(layer.conv_weights, layer.A_log, layer.dt_bias, layer.num_k_heads, layer.num_v_heads,
                     layer.head_k_dim, layer.head_v_dim, bias)


def gdn_tree_replay_fn(device):
    """The replay for tensors on ``device`` (:func:`specopd_kernels.gdn.backends.get_gdn_tree_replay`): plain torch
    on the CPU; on CUDA the Triton tree kernel once the GPU acceptance run verified it, else plain torch."""
    from specopd_kernels.gdn.backends import get_gdn_tree_replay

    return get_gdn_tree_replay(device)


def gdn_tree_layer(layer, call, mixed_qkv, a, b):
    """One GDN layer's core over the tree forward's packed row: mixed_qkv [P+N, C], a, b [P+N, HV] as
    ``Qwen3GatedDeltaNet`` passes them. Returns [1, P+N, HV, Dv] in mixed_qkv's dtype (the shape SGLang's GDN
    backend returns). Raises RuntimeError for a row against a cached prefix or a prefix chunk (hybrid targets
    never run those: the GDN state of a prefix is not recorded)."""
    from specopd_kernels.gdn import gdn_layout_from_tree_layout

    if call.prefix is not None or call.grow is not None:
        raise RuntimeError("GDN layers score whole rows only (no prefix cache hit or prefix chunk)")
    if call.gdn_layout is None:
        call.gdn_layout = gdn_layout_from_tree_layout(call.layout)
    a = a.reshape(mixed_qkv.shape[0], -1)
    b = b.reshape(mixed_qkv.shape[0], -1)
    out = gdn_tree_replay_fn(mixed_qkv.device)(mixed_qkv, a, b, gdn_params(layer), call.gdn_layout)
    return out.output.unsqueeze(0)


def gdn_tree_override(original_fn, self, forward_batch, mixed_qkv, a, b, *args, **kwargs):
    """AROUND hook for ``RadixLinearAttention.forward``: during a tree forward, :func:`gdn_tree_layer`; otherwise
    SGLang's own linear attention (one ContextVar read first, as the full-attention hook)."""
    call = TREE_CALL.get()
    if call is None or not isinstance(forward_batch, TreeForwardBatch):
        return original_fn(self, forward_batch, mixed_qkv, a, b, *args, **kwargs)
    return gdn_tree_layer(self, call, mixed_qkv, a, b)


_MISSING = object()


@contextlib.contextmanager
def capture_layers(inner, layer_ids: List[int]):
    """Capture the inputs of layers ``layer_ids`` during one tree forward (DFlash's aux hidden states), for both
    of SGLang's conventions: ``inner.layers_to_capture`` (Llama / Qwen) and a ``_is_layer_to_capture`` flag on
    each decoder layer (Qwen3-Next, see ``Qwen3NextModel.set_dflash_layers_to_capture``). Restores both after."""
    saved_list = list(inner.layers_to_capture)
    layers = list(getattr(inner, "layers", []))
    saved_flags = [getattr(layer, "_is_layer_to_capture", _MISSING) for layer in layers]
    inner.layers_to_capture = list(layer_ids)
    wanted = set(layer_ids)
    for i, layer in enumerate(layers):
        layer._is_layer_to_capture = i in wanted
    try:
        yield
    finally:
        inner.layers_to_capture = saved_list
        for layer, flag in zip(layers, saved_flags):
            if flag is _MISSING:
                del layer._is_layer_to_capture
            else:
                layer._is_layer_to_capture = flag


def register_gdn_scoring() -> None:
    """Register the GDN tree hook (inert unless a tree forward runs; harmless on targets without GDN layers)."""
    compat.hook("RadixLinearAttention.forward", gdn_tree_override)
