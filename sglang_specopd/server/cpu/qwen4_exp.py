"""CPU adaptations for Qwen4-Exp targets (Gated DeltaNet + QSA sparse attention) on SGLang 0.5.23's CPU engine.

Adaptation 13 of ``docs/cpu_adaptations.md`` (gaps Q2-Q6 of ``docs/qsa_serving_plan.md``; Q1, the four
``torch.ops.sgl_kernel`` ops ``models/qwen3_5.py`` binds at import, is in the stand-in's ``qwen3_5.py``). Every
hook re-checks the device of its tensors at call time and otherwise calls SGLang's own code, so none of this
changes a GPU server (and none of it is registered there):

* Q2 ``layernorm_gated.RMSNorm.forward`` (the Qwen3.5 / Qwen4-Exp GDN output norm) is a Triton kernel unless the
  CPU has AMX: for CPU tensors :func:`sglang_specopd.server.cpu.hybrid_gdn.rms_norm_gated` computes it.
* Q3 ``GatedResidual.__init__`` (hyper-connections) is built with ``params_dtype=bfloat16`` hard-coded by the model
  and ``torch.compile``s its mix / combine math (inductor would build C++ in every scheduler process): on the CPU
  engine the weights take the serving dtype (``torch.get_default_dtype()`` while the model is built) and both
  computes run eagerly (the same functions, uncompiled). On CPU the residual streams then follow the serving
  dtype, where a GPU keeps them in bf16.
* Q4 ``QSAIndexer`` defines only ``forward_cuda`` / ``forward_xpu``: its device-neutral ``_forward_impl`` (torch
  projections, compression, MQA scoring and the CPU top-k loop) answers ``forward_native`` too.
* Q5 ``qsa.metadata.gather_qsa_compressed_keys`` is a Triton launch: for CPU tensors :func:`gather_compressed_keys`
  does the same gather in torch.
* Q6 SGLang accepts only QSA block top-k widths 512 and 2048 (the widths of the CUDA ``fast_topk_v2``); the CPU
  top-k takes any width, so on the CPU engine any positive ``budget / compress_ratio`` is accepted (the other
  checks stay). This is what lets the ``tiny-qwen4exp-sparse`` test target (budget 32) be sparse at short lengths.
"""

from __future__ import annotations

import torch

from sglang_specopd.server.cpu.hybrid_gdn import rms_norm_gated


def layernorm_gated_rmsnorm_forward(original_fn, self, x, z=None):
    """AROUND hook for ``layernorm_gated.RMSNorm.forward``: torch for CPU tensors in the configuration Qwen3.5 /
    Qwen4-Exp build (one group, norm before the gate, no bias); anything else goes to SGLang's kernel."""
    if x.device.type != "cpu" or self.group_size is not None or not self.norm_before_gate or self.bias is not None:
        return original_fn(self, x, z)
    return rms_norm_gated(x, z, self.weight, self.eps, self.activation)


def gated_residual_init_on_cpu(original_fn, self, config, *args, **kwargs):
    """AROUND hook for ``GatedResidual.__init__`` (CPU engine only): weights in the serving dtype, mix / combine
    uncompiled (``torch.compile``'s wrapper keeps the original function as ``_torchdynamo_orig_callable``)."""
    import msgspec

    config = msgspec.structs.replace(config, params_dtype=torch.get_default_dtype())
    result = original_fn(self, config, *args, **kwargs)
    for name in ("_mix_compute", "_combine_compute"):
        fn = getattr(self, name, None)
        if fn is not None:
            setattr(self, name, getattr(fn, "_torchdynamo_orig_callable", fn))
    return result


def qsa_indexer_forward_native(original_fn, self, hidden_states, positions, forward_batch, indexer_metadata,
                               *args, **kwargs):
    """AROUND hook for ``QSAIndexer.forward_native`` (which raises NotImplementedError): the indexer's
    device-neutral ``_forward_impl``. Returns what it returns: the selected token indices per query row."""
    return self._forward_impl(hidden_states, positions, forward_batch, indexer_metadata, *args, **kwargs)


def gather_compressed_keys(compressed: torch.Tensor, token_slot_table: torch.Tensor, cu_blocks: torch.Tensor,
                           total_blocks: int, max_blocks: int, compress_ratio: int) -> torch.Tensor:
    """Every sequence's complete compressed index keys, packed in sequence order (torch version of SGLang's
    ``qsa.kernel.gather_qsa_compressed_keys``).

    Args:
        compressed: ``[slots // r, heads, Di]`` the compressed key cache (bf16 or fp8; copied as is).
        token_slot_table: ``[S, max_len]`` token -> KV slot per sequence; block b's compressed slot is the slot of
            its first token (``b * r``) divided by ``r`` (the allocator is page-aligned).
        cu_blocks: ``[S + 1]`` cumulative complete blocks per sequence.
        total_blocks: ``cu_blocks[-1]`` (host int). max_blocks: unused (the Triton grid size).
        compress_ratio: r.
    Returns:
        ``[total_blocks, heads, Di]``: rows ``cu_blocks[i]:cu_blocks[i+1]`` are sequence i's blocks.
    """
    heads_dim = compressed.shape[1:]
    if total_blocks == 0:
        return compressed.new_empty((0, *heads_dim))
    cu = cu_blocks.long()
    seq = torch.repeat_interleave(torch.arange(cu.numel() - 1, device=cu.device), cu.diff())[:total_blocks]
    block = torch.arange(seq.numel(), device=cu.device) - cu[seq]
    first = token_slot_table[seq, block * compress_ratio].long()
    return compressed[first // compress_ratio]


def gather_compressed_keys_on_cpu(original_fn, compressed, token_slot_table, cu_blocks, total_blocks, max_blocks,
                                  compress_ratio):
    """AROUND hook for ``qsa.metadata.gather_qsa_compressed_keys``: :func:`gather_compressed_keys` on CPU."""
    if compressed.device.type != "cpu":
        return original_fn(compressed, token_slot_table, cu_blocks, total_blocks, max_blocks, compress_ratio)
    return gather_compressed_keys(compressed, token_slot_table, cu_blocks, total_blocks, max_blocks,
                                  compress_ratio)


class AnyBlockTopK:
    """Stands in for SGLang's ``_COMPRESSED_BLOCK_TOPK`` frozenset on the CPU engine: contains every positive int
    (the CPU top-k takes any width). Iterates as the widths the CUDA kernel supports, for error messages."""

    def __contains__(self, width) -> bool:
        return isinstance(width, int) and width > 0

    def __iter__(self):
        return iter((512, 2048))


def validate_qsa_config(config) -> None:
    """``QSAIndexer._validate_config`` on the CPU engine: SGLang's ``parse_qsa_profile`` checks (required fields,
    positive values, one index key head, ratio >= 2, budget divisible by the ratio), the block top-k width free.

    Raises:
        ValueError: as SGLang's check, for a malformed QSA config.
    """
    from sglang_specopd.server import compat

    if getattr(config, "indexer_n_heads", None) is None:
        raise ValueError("QSA config is missing required fields: ['indexer_n_heads']")
    compat.get("parse_qsa_profile")(config)


def register_qwen4_exp_adaptations() -> None:
    """Register the Qwen4-Exp hooks and patches (CPU engine only)."""
    from sglang_specopd.server import compat

    compat.hook("layernorm_gated.RMSNorm.forward", layernorm_gated_rmsnorm_forward)
    compat.hook("GatedResidual.__init__", gated_residual_init_on_cpu)
    compat.hook("QSAIndexer.forward_native", qsa_indexer_forward_native)
    compat.hook("qsa.metadata.gather_qsa_compressed_keys", gather_compressed_keys_on_cpu)
    compat.patch("qsa.config._COMPRESSED_BLOCK_TOPK", AnyBlockTopK())
    compat.patch("QSAIndexer._validate_config", staticmethod(validate_qsa_config))
