"""SGLang 0.5.23's own reading of drafter checkpoints, for tests/test_published_drafters.py (CPU, no server).

Run as ``python _sglang_draft_configs.py TARGET_DIR DRAFTER_DIR...`` in a subprocess with
``SGLANG_USE_CPU_ENGINE=1``, the sgl_kernel stand-in on PYTHONPATH, ``TORCHDYNAMO_DISABLE=1`` and
``SGLANG_RAGGED_VERIFY_MODE=cap-accept`` (so DSpark builds its confidence head, as on a server). For each drafter,
in launch order, everything is SGLang's code: the HF config loader (``get_config``), the target side's reading
(``parse_dflash_draft_config``, ``require_num_layers``, ``resolve_target_layer_ids`` against the target's layer
count, DSpark's ``parse_dspark_draft_config`` and its Markov check), the draft model class built from the config
(one rank) with its ``load_weights``, the DFLASH worker's block size (``resolve_block_size``, as when no
``--speculative-num-draft-tokens`` is given) and mask token resolution (``DFlashWorkerV2._resolve_mask_token_id``
against the target tokenizer and vocabulary), DSpark's ``resolve_runtime_config``. Prints one
``RESULT {json}`` line: per drafter ``{"ok": true, values...}`` or ``{"ok": false, "error": message}``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace


def read(drafter: str, target: str, tokenizer, vocab: int, n_layers: int) -> dict:
    import torch
    from safetensors.torch import load_file
    from sglang.srt.models.dflash import DFlash2DraftModel, DFlashDraftModel
    from sglang.srt.models.dspark import DSparkDraftModel
    from sglang.srt.speculative.dflash_utils import parse_dflash_draft_config
    from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2
    from sglang.srt.speculative.dspark_components.dspark_config import parse_dspark_draft_config
    from sglang.srt.speculative.dspark_components.dspark_config import resolve_runtime_config
    from sglang.srt.utils.hf_transformers.config import get_config

    cfg = get_config(drafter, trust_remote_code=False)
    p = parse_dflash_draft_config(draft_hf_config=cfg)
    ids = p.resolve_target_layer_ids(target_num_layers=n_layers, draft_num_layers=p.require_num_layers())
    arch = cfg.architectures[0]
    out = {"ok": True, "num_hidden_layers": p.num_hidden_layers, "target_layer_ids": list(ids),
           "mask_token": p.mask_token, "conv": [p.conv_kernel_size, p.conv_group_size],
           "selector": [p.selector_rank, p.selector_top_k]}
    if arch == "DSparkDraftModel":
        dp = parse_dspark_draft_config(draft_hf_config=cfg)
        if not dp.require_markov():
            raise ValueError(f"DSPARK requires markov_rank > 0 in the draft config, got markov_rank={dp.markov_rank}.")
    cls = {"DFlashDraftModel": DFlashDraftModel, "DFlash2DraftModel": DFlash2DraftModel,
           "DSparkDraftModel": DSparkDraftModel}[arch]
    model = cls(cfg).eval()
    for prm in model.parameters():
        prm.data.fill_(float("nan"))
    files = sorted(Path(drafter).glob("*.safetensors"))
    for f in files:
        model.load_weights(load_file(str(f)).items())
    out["unloaded"] = sorted(n for n, prm in model.named_parameters() if torch.isnan(prm).any()) if files else None
    out["fc_in"] = int(model.fc.weight.shape[1])
    if arch == "DSparkDraftModel":
        rt = resolve_runtime_config(draft_hf_config=cfg, speculative_num_draft_tokens=None, target_vocab_size=vocab)
        out.update(block_size=rt.gamma, mask_token_id=rt.mask_token_id,
                   markov=[type(model.markov_head).__name__, int(model.markov_head.markov_rank)])
    else:
        fake = SimpleNamespace(target_worker=SimpleNamespace(
            tokenizer=tokenizer, model_runner=SimpleNamespace(model_config=SimpleNamespace(vocab_size=vocab))))
        out["block_size"] = p.resolve_block_size(default=16)
        out["mask_token_id"] = DFlashWorkerV2._resolve_mask_token_id(fake, mask_token=p.mask_token,
                                                                     mask_token_id=p.mask_token_id)
        out["attention"] = [[int(layer.self_attn.attn.sliding_window_size), str(layer.self_attn.attn.attn_type)]
                            for layer in model.layers]
    return out


def main() -> None:
    from sglang.srt.runtime_context import get_parallel
    from transformers import AutoConfig, AutoTokenizer

    target, drafters = sys.argv[1], sys.argv[2:]
    tcfg = AutoConfig.from_pretrained(target)
    results = {}
    with get_parallel().override(tp_size=1, tp_rank=0):
        for d in drafters:
            tokenizer = AutoTokenizer.from_pretrained(target)  # fresh: SGLang may add a mask token to it
            try:
                results[d] = read(d, target, tokenizer, int(tcfg.vocab_size), int(tcfg.num_hidden_layers))
            except Exception as exc:  # noqa: BLE001 - the refusal and its message are the result
                results[d] = {"ok": False, "error": str(exc), "type": type(exc).__name__}
    print("RESULT " + json.dumps(results))


if __name__ == "__main__":
    main()
