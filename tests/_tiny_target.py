"""Tiny random Llama/Qwen3 target checkpoints with a real (offline-trained) tokenizer, for tests.

The tokenizer is a byte-level BPE trained with the ``tokenizers`` library on docstrings of a fixed list of
Python standard-library modules, so it needs no download and encodes any text. Special tokens (ids 0..4):
``<|endoftext|>`` (bos), ``<|im_start|>``, ``<|im_end|>`` (eos), ``<|pad|>`` (pad) and
``<|reserved_special_token_0|>``: a reserved token the ChatML template never emits, usable as the DFlash mask
token. The tokenizer sets no ``mask_token``, so drafter init exercises its reserved-token fallback.

torch/transformers/tokenizers are imported inside the functions only.
"""

from __future__ import annotations

import importlib
import inspect
import os
import shutil
import tempfile
import warnings
from pathlib import Path

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>", "<|reserved_special_token_0|>")
RESERVED_MASK_TOKEN = "<|reserved_special_token_0|>"
CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>'"
    " + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
_CORPUS_MODULES = (
    "abc", "argparse", "ast", "bisect", "calendar", "collections", "contextlib", "copy", "csv", "dataclasses",
    "datetime", "decimal", "difflib", "enum", "fractions", "functools", "heapq", "inspect", "io", "itertools",
    "json", "logging", "os", "pathlib", "pickle", "pprint", "random", "re", "shutil", "statistics", "string",
    "textwrap", "threading", "unittest", "urllib.parse", "zipfile",
)


class TinyTargetError(Exception):
    """Invalid tiny-target arguments or an output directory that already exists."""


def _corpus() -> list[str]:
    texts: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # getdoc() on deprecated aliases warns
        for mod_name in _CORPUS_MODULES:
            texts += _module_docs(mod_name)
    return texts


def _module_docs(mod_name: str) -> list[str]:
    texts: list[str] = []
    # functions and classes only: a submodule shows up in vars() once anything imported it (``unittest.mock``,
    # ``logging.handlers``, ``json.decoder``), so counting modules made the tokenizer, and every tiny target's ids,
    # depend on which tests ran first in the process
    for _, obj in sorted(vars(importlib.import_module(mod_name)).items()):
        if inspect.isfunction(obj) or inspect.isclass(obj):
            doc = inspect.getdoc(obj)
            if doc:
                texts.append(doc)
    return texts


def train_tiny_tokenizer(vocab_size: int = 1024):
    """Train the byte-level BPE described in the module docstring; return a ``PreTrainedTokenizerFast``.

    Deterministic for a given Python installation. ``vocab_size`` (>= 300) is the target size including the
    256 byte symbols and the 5 special tokens. Raises TinyTargetError for a too-small vocab_size.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if vocab_size < 300:
        raise TinyTargetError(f"tokenizer vocab_size must be >= 300, got {vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS), min_frequency=2, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_corpus(), trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|im_end|>", pad_token="<|pad|>",
        additional_special_tokens=["<|im_start|>", RESERVED_MASK_TOKEN],
    )
    fast.chat_template = CHATML_TEMPLATE
    return fast


def make_tiny_target(
    out_dir: str | os.PathLike[str],
    *,
    arch: str = "llama",
    hidden_size: int = 64,
    num_layers: int = 4,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int | None = None,
    vocab_size: int | None = None,
    tokenizer_vocab_size: int = 1024,
    max_position_embeddings: int = 2048,
    seed: int = 0,
    overwrite: bool = False,
) -> Path:
    """Write a tiny random HF causal-LM checkpoint (fp32 safetensors + tokenizer + ChatML template) to ``out_dir``.

    Args:
        arch: ``"llama"`` (LlamaForCausalLM, tied embeddings like SmolLM2) or ``"qwen3"`` (Qwen3ForCausalLM,
            untied, with q/k norms).
        hidden_size, num_layers, num_heads, num_kv_heads: model shape; head_dim = hidden_size // num_heads.
        intermediate_size: MLP width (default 2 * hidden_size).
        vocab_size: embedding rows (default: the tokenizer's size, ~1024); must be >= the tokenizer's size.
        seed: weights are N(0, 0.02) for matrices and 1 for norm vectors, drawn from ``torch.Generator(seed)`` in
            parameter-name order, so equal arguments give bit-identical ``model.safetensors``.
        overwrite: replace an existing ``out_dir`` (otherwise TinyTargetError).

    Returns: ``out_dir`` as a Path. Written atomically (temporary sibling directory, then rename).

    Raises:
        TinyTargetError: unknown arch, heads not dividing hidden_size / kv heads not dividing heads, vocab_size
            smaller than the tokenizer, or ``out_dir`` exists and ``overwrite`` is False.
    """
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM
    from transformers.utils import logging as hf_logging

    from sglang_specopd.wire.home import make_world_readable

    out = Path(out_dir).expanduser()
    if arch not in ("llama", "qwen3"):
        raise TinyTargetError(f"arch must be 'llama' or 'qwen3', got {arch!r}")
    if hidden_size % num_heads or num_heads % num_kv_heads:
        raise TinyTargetError(
            f"num_heads={num_heads} must divide hidden_size={hidden_size} and num_kv_heads={num_kv_heads} must "
            "divide num_heads"
        )
    if out.exists() and not overwrite:
        raise TinyTargetError(f"output directory already exists: {out} (pass overwrite=True / --force)")
    tokenizer = train_tiny_tokenizer(tokenizer_vocab_size)
    n_tok = len(tokenizer)
    vocab = n_tok if vocab_size is None else int(vocab_size)
    if vocab < n_tok:
        raise TinyTargetError(f"vocab_size={vocab} is smaller than the tokenizer ({n_tok} tokens)")
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in ("<|endoftext|>", "<|im_end|>", "<|pad|>")}
    common = dict(
        vocab_size=vocab, hidden_size=hidden_size, intermediate_size=intermediate_size or 2 * hidden_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
        head_dim=hidden_size // num_heads, max_position_embeddings=max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|pad|>"],
    )
    if arch == "llama":
        config, cls = LlamaConfig(**common, rms_norm_eps=1e-5, tie_word_embeddings=True), LlamaForCausalLM
    else:
        config, cls = Qwen3Config(**common, rms_norm_eps=1e-6, tie_word_embeddings=False), Qwen3ForCausalLM
    config.architectures = [cls.__name__]
    config.dtype = "float32"
    model = cls(config).to(torch.float32).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, param in sorted(model.named_parameters()):
            if param.ndim == 1:
                param.fill_(1.0)
            else:
                param.copy_(torch.randn(param.shape, generator=gen, dtype=torch.float32) * 0.02)
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.tmp-"))
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # a one-shard tiny model needs no "Writing model shards" bar
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        make_world_readable(tmp)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
        shutil.rmtree(tmp, ignore_errors=True)
    return out
