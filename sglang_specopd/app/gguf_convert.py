"""Convert a llama-architecture GGUF file into a plain Hugging Face ``LlamaForCausalLM`` checkpoint.

``AutoModelForCausalLM.from_pretrained(gguf_file=...)`` needs ``accelerate`` (not a dependency) and the model it
returns refuses ``save_pretrained``. So the config and tokenizer (with its chat template) are read from the GGUF
metadata, a plain ``LlamaForCausalLM`` is built from the config, and transformers' plain GGUF reader
(``load_gguf_checkpoint``, which dequantizes with the ``gguf`` package and maps tensor names) fills it; it is
saved as ``model.safetensors``. The result is verified before returning: the reloaded checkpoint holds exactly
the converted tensors and greedily generates English for a chat prompt.

torch/transformers are imported inside the functions only.
"""

from __future__ import annotations

import re
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

VERIFY_PROMPT = "What is the capital of France? Answer in one sentence."
# Config fields copied from the GGUF-derived config; everything else is LlamaConfig's default.
_CONFIG_KEYS = (
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "hidden_act", "max_position_embeddings", "rms_norm_eps",
    "rope_parameters", "attention_bias", "mlp_bias", "bos_token_id", "eos_token_id", "pad_token_id",
    "tie_word_embeddings",
)


class GGUFConvertError(Exception):
    """The GGUF could not be loaded, converted, saved or verified."""


@contextmanager
def _step(console: Any, text: str) -> Iterator[None]:
    start = time.monotonic()
    with console.status(text + " ..."):
        yield
    console.print(f"[green]done[/] {text} ({time.monotonic() - start:.1f} s)")


def convert_gguf_to_hf(gguf_path: Path, out_dir: Path, *, dtype: str = "float32", console: Any = None) -> None:
    """Write a plain HF Llama checkpoint converted from ``gguf_path`` into the existing directory ``out_dir``.

    Args:
        gguf_path: a llama-architecture ``.gguf`` file (any quantisation transformers can dequantize).
        out_dir: existing directory; receives config.json, model.safetensors (single file, weights in
            ``dtype``), generation_config.json, tokenizer.json/tokenizer_config.json and chat_template.jinja.
        dtype: ``"float32"`` or ``"bfloat16"``.
        console: rich console for progress (default: stderr).

    Raises:
        GGUFConvertError: unsupported architecture or dtype, state-dict mismatch, or failed verification.

    Tied embeddings: the output keeps ``tie_word_embeddings`` only when the GGUF's output matrix equals the token
    embedding (GGUFs of tied models carry no separate ``output.weight``); otherwise both matrices are saved.
    """
    import torch
    from rich.console import Console
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    console = console or Console(stderr=True, soft_wrap=True)
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}.get(dtype)
    if torch_dtype is None:
        raise GGUFConvertError(f"unsupported dtype {dtype!r}")
    src_dir, name = str(gguf_path.parent), gguf_path.name
    with _step(console, f"reading config and tokenizer from {name}"):
        src_config = AutoConfig.from_pretrained(src_dir, gguf_file=name)
        tokenizer = AutoTokenizer.from_pretrained(src_dir, gguf_file=name)
    if src_config.model_type != "llama":
        raise GGUFConvertError(f"{name}: expected a llama GGUF, got model_type={src_config.model_type!r}")
    cfg = {k: getattr(src_config, k) for k in _CONFIG_KEYS if getattr(src_config, k, None) is not None}
    # GGUF stores eps as float32 (1e-5 -> 9.999999747e-06); keep the decimal value the model was trained with.
    cfg["rms_norm_eps"] = float(f"{cfg['rms_norm_eps']:.7g}")
    with _step(console, f"dequantizing {name} into LlamaForCausalLM"):
        torch.manual_seed(0)
        model = LlamaForCausalLM(LlamaConfig(**cfg))
        # The plain GGUF reader (no accelerate needed): dequantized fp32 tensors under HF parameter names.
        state = load_gguf_checkpoint(str(gguf_path), return_tensors=True, model_to_load=model,
                                     torch_dtype=torch.float32)["tensors"]
        head = state.get("lm_head.weight")
        tied = head is None or bool(torch.equal(head, state["model.embed_tokens.weight"]))
        if tied:
            state.pop("lm_head.weight", None)
        elif cfg.get("tie_word_embeddings"):
            cfg["tie_word_embeddings"] = False  # the GGUF carries a distinct output matrix: keep both
            model = LlamaForCausalLM(LlamaConfig(**cfg))
        missing, unexpected = model.load_state_dict(state, strict=False)
        missing = [k for k in missing if not (tied and k == "lm_head.weight")]
        if missing or unexpected:
            raise GGUFConvertError(f"state dict mismatch: missing={missing} unexpected={unexpected}")
        if tied:
            if not model.config.tie_word_embeddings:
                raise GGUFConvertError("GGUF has no output matrix but the config does not tie embeddings")
            model.tie_weights()
            if model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr():
                raise GGUFConvertError("lm_head is not tied to embed_tokens after tie_weights()")
        model = model.to(torch_dtype).eval()
        model.config.architectures = ["LlamaForCausalLM"]
        model.config.dtype = dtype
        model.generation_config = GenerationConfig(
            bos_token_id=cfg.get("bos_token_id"), eos_token_id=cfg.get("eos_token_id"),
            pad_token_id=cfg.get("pad_token_id"),
        )
    with _step(console, "saving model.safetensors and tokenizer"):
        model.save_pretrained(out_dir, max_shard_size="20GB")
        tokenizer.model_max_length = int(cfg["max_position_embeddings"])
        tokenizer.save_pretrained(out_dir)
        if not (out_dir / "model.safetensors").is_file():
            raise GGUFConvertError(f"save_pretrained did not write {out_dir / 'model.safetensors'}")
    with _step(console, "verifying the saved checkpoint"):
        text = verify_checkpoint(out_dir, reference=model)
    console.print(f"[green]verified[/] greedy reply to {VERIFY_PROMPT!r}: {text!r}")


def verify_checkpoint(model_dir: Path, *, reference: Any = None, max_new_tokens: int = 8) -> str:
    """Reload ``model_dir`` with transformers and check it; return the decoded greedy reply.

    Checks: if ``reference`` (the in-memory model that was saved) is given, every reloaded parameter equals its
    tensor bit for bit (names, dtypes and values); the chat template renders; greedy generation of
    ``max_new_tokens`` tokens for :data:`VERIFY_PROMPT` decodes to non-empty text containing an English word
    (>= 2 ASCII letters).

    Raises:
        GGUFConvertError: any check fails (the message states which and the observed values).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="auto").eval()
    if reference is not None:
        want, got = reference.state_dict(), model.state_dict()
        if sorted(want) != sorted(got):
            raise GGUFConvertError(f"{model_dir}: reloaded parameter names differ: {sorted(set(want) ^ set(got))[:5]}")
        bad = [k for k in want if want[k].dtype != got[k].dtype or not torch.equal(want[k], got[k])]
        if bad:
            raise GGUFConvertError(f"{model_dir}: {len(bad)} reloaded tensors differ from the converted ones, "
                                   f"e.g. {bad[:3]}")
    if tokenizer.chat_template is None:
        raise GGUFConvertError(f"{model_dir}: tokenizer has no chat template")
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": VERIFY_PROMPT}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )["input_ids"]
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False)
    text = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True).strip()
    if not text or not re.search(r"[A-Za-z]{2,}", text):
        raise GGUFConvertError(f"{model_dir}: greedy reply is not English text: {text!r}")
    return text
