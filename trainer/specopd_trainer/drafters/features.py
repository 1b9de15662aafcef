"""Reference computation of DFlash context features with a transformers target (tests, debugging, offline SFT).

In training the features come from the SGLang server; this module reproduces them locally. SGLang 0.5.23
captures layer id ``L`` as the INPUT of decoder layer ``L+1`` (``LlamaForCausalLM.set_dflash_layers_to_capture``
sets ``layers_to_capture = [L + 1 for L in layer_ids]``, and ``LlamaDecoderLayer.forward`` captures the residual
stream entering that layer), i.e. the OUTPUT of layer ``L``: HF ``output_hidden_states`` index ``L + 1``
(index 0 is the embedding). The K captures are concatenated in ``target_layer_ids`` order (ids are increasing
and never the last layer, so no final norm is involved). Verified against a live server's proposals in
``tests/test_trainer_parity.py``.
"""

from __future__ import annotations

from typing import Sequence

import torch


def hf_context_features(model, input_ids: torch.Tensor, target_layer_ids: Sequence[int]) -> torch.Tensor:
    """Features ``[L, K*H]`` (model dtype) for one sequence ``input_ids`` long [L] of an HF causal LM.

    Raises ValueError if a layer id is outside ``0 .. num_hidden_layers - 2``."""
    n = int(model.config.get_text_config().num_hidden_layers)
    bad = [i for i in target_layer_ids if not 0 <= int(i) <= n - 2]
    if bad:
        raise ValueError(f"target_layer_ids {bad} outside 0..{n - 2} for a {n}-layer target")
    with torch.no_grad():
        hidden = model(input_ids.view(1, -1), output_hidden_states=True).hidden_states
    return torch.cat([hidden[int(i) + 1][0] for i in target_layer_ids], dim=-1)
