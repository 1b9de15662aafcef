"""DFlash target features for Qwen4-Exp targets (Gated DeltaNet + QSA sparse attention, hyper-connections).

SGLang 0.5.23 flags the layers to capture (``set_dflash_layers_to_capture``) and passes each flagged layer an
accumulator, but on Qwen4-Exp nothing comes back (docs/qsa_serving_plan.md, section 6):

1. both decoder layers' ``forward`` drop ``captured_last_layer_outputs`` from their ``**kwargs``;
2. ``Qwen4ExpVLModel.forward`` returns the final hidden state only (the text model's second output is the
   hyper-connection streams, kept as ``last_hc_hidden_states``), so the outer
   ``Qwen3VLForConditionalGeneration.forward`` then unpacks a bare tensor as ``(hidden, aux)`` and breaks;
3. ``Qwen4ExpForConditionalGeneration.forward`` writes the streams over ``LogitsProcessorOutput.hidden_states``,
   where the DFlash worker reads the features.

The feature of a captured layer is its **mixed attention input** ``[T, H]``: the output of the layer's
``attn_hyper_connection`` mix (``_attn_mix``), which is what the layer's attention reads. Between layers the hidden
state is the ``[T, hc_count * H]`` stream bundle, not ``[T, H]``; the mixed input keeps a DFlash drafter's feature
width at ``H`` per layer (DFlash convention: the feature of layer id ``l`` is the input of layer ``l + 1``). The
transformers reference of the same feature is the first output of ``layers[l + 1].attn_hyper_connection``.

Four AROUND hooks (names in :mod:`sglang_specopd.server.compat`), inert unless a layer is flagged for capture:
:func:`layer_forward` (both decoder layers: remember the accumulator for the call), :func:`attn_mix` (capture the
mix output into it), :func:`vl_model_forward` (return ``(hidden, aux)`` while capturing and drop the streams so
(3) leaves the features in place). Not CPU-specific: the same gap exists on a GPU server.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any, Optional

# the accumulator the flagged layers of the current text-model forward capture into (set by layer_forward)
_CAPTURED: ContextVar[Optional[Any]] = ContextVar("specopd_qwen4_exp_captured", default=None)
_SINK = "_specopd_feature_sink"


def layer_forward(original_fn, self, *args, **kwargs):
    """AROUND hook for ``Qwen4ExpLinearDecoderLayer.forward`` / ``Qwen4ExpAttentionDecoderLayer.forward``: while the
    model passes ``captured_last_layer_outputs`` (an ``AuxHiddenStateList``), :func:`attn_mix` appends this layer's
    mixed attention input ``[T, H]`` to it."""
    acc = kwargs.get("captured_last_layer_outputs")
    if acc is None:
        return original_fn(self, *args, **kwargs)
    setattr(self, _SINK, acc)
    _CAPTURED.set(acc)
    try:
        return original_fn(self, *args, **kwargs)
    finally:
        setattr(self, _SINK, None)


def attn_mix(original_fn, self, residual):
    """AROUND hook for ``Qwen4ExpLayerExtensionMixin._attn_mix`` (``(mixed [T, H], stream state)``): captures
    ``mixed`` (copied) when :func:`layer_forward` armed this layer."""
    out = original_fn(self, residual)
    sink = getattr(self, _SINK, None)
    if sink is not None:
        sink.capture(out[0], owned=False)
    return out


def vl_model_forward(original_fn, self, *args, **kwargs):
    """AROUND hook for ``Qwen4ExpVLModel.forward``: ``(hidden, aux)`` when flagged layers captured features (what
    the DFLASH path of ``Qwen3VLForConditionalGeneration.forward`` and score_trees' ``tree_forward`` unpack), with
    ``last_hc_hidden_states`` cleared so the top-level forward keeps ``hidden_states`` = the features; otherwise
    the model's own output."""
    token = _CAPTURED.set(None)
    try:
        out = original_fn(self, *args, **kwargs)
        acc = _CAPTURED.get()
    finally:
        _CAPTURED.reset(token)
    if acc is None or len(acc) == 0 or isinstance(out, tuple) or not hasattr(out, "shape"):
        return out
    self.last_hc_hidden_states = None
    return out, acc


def register_qwen4_exp_features() -> None:
    """Register the four hooks (harmless on other targets: the hooked classes are Qwen4-Exp's own)."""
    from sglang_specopd.server import compat

    compat.hook("Qwen4ExpLinearDecoderLayer.forward", layer_forward)
    compat.hook("Qwen4ExpAttentionDecoderLayer.forward", layer_forward)
    compat.hook("Qwen4ExpLayerExtensionMixin._attn_mix", attn_mix)
    compat.hook("Qwen4ExpVLModel.forward", vl_model_forward)
