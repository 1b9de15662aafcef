"""The CPU adaptations SGLang 0.5.23 needs to serve DFLASH / SPECOPD on a CPU-only machine.

Each function below is one adaptation, registered through SGLang's plugin ``HookRegistry`` (or, for the torch
method, patched directly) by :func:`register_cpu_adaptations`, which the plugin calls only when
:func:`sglang_specopd.server.cpu.cpu_engine_enabled` is true. Every hook re-checks that the device is CPU at call
time and otherwise defers to SGLang's original code, so nothing here changes GPU behaviour.

1. ``sgl_kernel`` stand-in (``sgl_kernel_standin/``): put first on PYTHONPATH by the launcher (not a hook).
2. ``_handle_dflash`` device check: DFLASH is rejected unless the device is cuda/npu/xpu; on CPU the check is
   answered "supported" and ``torch_native`` is accepted as the draft attention backend.
3. ``Tensor.record_stream`` is a no-op for CPU tensors (dflash_worker_v2 calls it unconditionally).
4. ``DFlashAttention.use_table_qk_norm_rope = False`` on CPU (its fused Triton qk-norm/rope needs a GPU driver).
5. ``TorchNativeAttnBackend.forward_extend`` handles TARGET_VERIFY (prefix/extend lengths derived from
   ``spec_info.draft_token_num``, as intel_amx_backend.py does) with a chain (causal) or tree (custom) mask.
6. (device-independent, so it lives in :mod:`sglang_specopd.server.fixes`): DFLASH under ``--dtype float32``.
7. Lossless DFLASH sampling verification (temperature > 0): SGLang has no CPU op and silently falls back to
   greedy verification; :mod:`sglang_specopd.server.cpu.sampling_verify` provides the op in torch.
8. Chain verification of SAMPLED draft blocks (:mod:`sglang_specopd.server.sampled_drafts`) uses SGLang's
   ``accept_sampling``, whose kernel is Triton; :mod:`sglang_specopd.server.cpu.chain_sampling` provides it in torch.
9. Batched decode / verify attention (:mod:`sglang_specopd.server.cpu.batched_attention`): one SDPA call per group
   of requests instead of one per request and layer (83% of a decode step at 48 requests in flight).
10. (not a hook, :mod:`sglang_specopd.app.cpu_dtype`): the serving dtype follows the CPU.
11. Hybrid Gated DeltaNet targets (Qwen3-Next): torch stand-ins of sgl-kernel's CPU GDN ops
    (``sgl_kernel_standin/sgl_kernel/mamba.py``) and the hooks in :mod:`sglang_specopd.server.cpu.hybrid_gdn`;
    the launcher keeps the mamba pool's conv windows in float32 (``SGLANG_MAMBA_CONV_DTYPE``, plugin.py).
12. DFlash V2 drafters (``DFlash2DraftModel``): the candidate selector's flashinfer top-k and its
    ``torch.compile``'d lattice / walk run as torch on CPU (:mod:`sglang_specopd.server.cpu.dflash2`).
16. DSpark drafters under SGLang's DSPARK worker (DSPARK, and the plugin's SPECOPD_DSPARK): its argument
    resolution accepts the CPU device and a bf16 drafter writes its context K/V unfused, without SGLang's Triton
    kernel (:mod:`sglang_specopd.server.cpu.dspark`); the rest of that path runs on CPU through SGLang's torch
    references and adaptations 3-5 and 8.
17. The scheduler and detokenizer processes start by ``fork`` instead of ``spawn`` (:mod:`.fork_start`): they
    inherit the launcher's imports and hooks instead of redoing them (server_start_smollm2_epyc-avx2-fp32.json).
"""

from __future__ import annotations

import logging

from sglang_specopd.server import compat

logger = logging.getLogger("sglang_specopd.server.cpu")

CPU_DRAFT_ATTENTION_BACKEND = "torch_native"


def _is_cpu_device(device) -> bool:
    return str(device).split(":")[0] == "cpu"


class _CpuDFlashPlatform:
    """Answers SGLang's DFLASH capability questions for the CPU device; delegates everything else."""

    def __init__(self, platform):
        self._platform = platform

    def __getattr__(self, name):
        return getattr(self._platform, name)

    def is_out_of_tree(self) -> bool:  # routes _handle_dflash through the capability questions below
        return True

    def supports_speculative_algorithm(self, algorithm: str) -> bool:
        return algorithm.upper() == "DFLASH"

    def supports_speculative_draft_attention_backend(self, algorithm: str, backend: str) -> bool:
        return backend == CPU_DRAFT_ATTENTION_BACKEND

    def get_default_speculative_draft_attention_backend(self, algorithm: str) -> str:
        return CPU_DRAFT_ATTENTION_BACKEND


def handle_dflash_on_cpu(original_fn, server_args):
    """AROUND hook for ``speculative_hook._handle_dflash``: accept DFLASH on CPU with torch_native drafts."""
    if not _is_cpu_device(compat.get("resolving_view")(server_args).device):
        return original_fn(server_args)
    real = compat.get("speculative_hook.current_platform")
    compat.patch("speculative_hook.current_platform", _CpuDFlashPlatform(real))
    try:
        return original_fn(server_args)
    finally:
        compat.patch("speculative_hook.current_platform", real)


def install_record_stream_noop() -> None:
    """Make ``torch.Tensor.record_stream`` a no-op for CPU tensors (CUDA tensors keep the real method)."""
    import torch

    original = torch.Tensor.record_stream
    if getattr(original, "_specopd_cpu_noop", False):
        return

    def record_stream(self, stream):
        if self.device.type == "cpu":
            return None
        return original(self, stream)

    record_stream._specopd_cpu_noop = True
    torch.Tensor.record_stream = record_stream


def disable_table_qk_norm_rope(result, self, *args, **kwargs):
    """AFTER hook for ``DFlashAttention.__init__``: use the plain qk-norm + RoPE path on CPU."""
    weight = next(self.parameters(), None)
    if weight is None or weight.device.type == "cpu":
        self.use_table_qk_norm_rope = False
    return result


_VERIFY_SYMBOLS = None


def _verify_symbols():
    """(KVWriteLoc, AttentionType, batched_verify_attention), looked up once: this runs in every attention layer of
    every verify forward (py-spy: ~0.6% of a served SPECOPD step went to the lookups, issue 42)."""
    global _VERIFY_SYMBOLS
    if _VERIFY_SYMBOLS is None:
        from sglang_specopd.server.cpu.batched_attention import batched_verify_attention

        _VERIFY_SYMBOLS = (compat.get("KVWriteLoc"), compat.get("AttentionType"), batched_verify_attention)
    return _VERIFY_SYMBOLS


def torch_native_forward_extend(original_fn, self, q, k, v, layer, forward_batch, save_kv_cache=True):
    """AROUND hook for ``TorchNativeAttnBackend.forward_extend`` adding TARGET_VERIFY support.

    In TARGET_VERIFY, ``forward_batch.seq_lens`` [bs] are the committed prefix lengths and every request
    extends by ``spec_info.draft_token_num`` tokens, whose KV slots are ``out_cache_loc``. Chain verify (DFLASH,
    ``custom_mask is None``) is plain causal attention over prefix + block for the target. DFLASH also runs its
    draft block forward in TARGET_VERIFY mode: draft layers are ENCODER_ONLY, i.e. non-causal over (context
    before the anchor + the whole block), as SGLang's GPU backends compute them.
    """
    if not forward_batch.forward_mode.is_target_verify() or not _is_cpu_device(q.device):
        return original_fn(self, q, k, v, layer, forward_batch, save_kv_cache)
    KVWriteLoc, AttentionType, batched_verify_attention = _verify_symbols()
    spec_info = forward_batch.spec_info
    if spec_info is None:
        raise RuntimeError("TARGET_VERIFY without spec_info: cannot derive the verify block length")
    if getattr(spec_info, "custom_mask", None) is not None:
        raise NotImplementedError(
            "torch_native TARGET_VERIFY supports chain verification only (custom_mask must be None)"
        )
    n = int(spec_info.draft_token_num)
    hq, hkv = layer.tp_q_head_num, layer.tp_k_head_num
    o = q.new_empty((q.shape[0], hq * layer.v_head_dim))
    if save_kv_cache and k is not None and v is not None:
        self.token_to_kv_pool.set_kv_buffer(layer, KVWriteLoc(forward_batch.out_cache_loc, self.swa_out_cache_loc), k, v)
    k_cache = self.token_to_kv_pool.get_key_buffer(layer.layer_id)
    v_cache = self.token_to_kv_pool.get_value_buffer(layer.layer_id)
    req_to_token = self.req_to_token_pool.req_to_token
    causal = getattr(layer, "attn_type", None) != AttentionType.ENCODER_ONLY
    # Only the n block queries per request (torch_native's extend path would run all L of them), several
    # requests per SDPA call (padded, masked).
    batched_verify_attention(q.view(-1, hq, layer.qk_head_dim), k_cache, v_cache, req_to_token,
                             forward_batch.req_pool_indices, forward_batch.seq_lens, n, causal, layer.scaling,
                             hq != hkv, o.view(-1, hq, layer.v_head_dim))
    return o


def register_cpu_adaptations() -> None:
    """Register every CPU adaptation with SGLang's HookRegistry (call only on the CPU engine)."""
    choices = compat.get("DRAFT_ATTENTION_BACKEND_CHOICES")  # mutated in place: argparse reads this list
    if CPU_DRAFT_ATTENTION_BACKEND not in choices:
        choices.append(CPU_DRAFT_ATTENTION_BACKEND)
    compat.hook("_handle_dflash", handle_dflash_on_cpu)
    compat.hook("DFlashAttention.__init__", disable_table_qk_norm_rope)
    compat.hook("TorchNativeAttnBackend.forward_extend", torch_native_forward_extend)
    from sglang_specopd.server.cpu.batched_attention import torch_native_decode

    compat.hook("TorchNativeAttnBackend._run_sdpa_forward_decode", torch_native_decode)
    install_record_stream_noop()
    from sglang_specopd.server.cpu.sampling_verify import install as install_sampling_verify

    install_sampling_verify()
    from sglang_specopd.server.cpu.chain_sampling import install as install_chain_sampling

    install_chain_sampling()
    from sglang_specopd.server.cpu.hybrid_gdn import register_hybrid_gdn_adaptations

    register_hybrid_gdn_adaptations()
    from sglang_specopd.server.cpu.qwen4_exp import register_qwen4_exp_adaptations

    register_qwen4_exp_adaptations()
    from sglang_specopd.server.cpu.qsa_ring import register_qsa_ring

    register_qsa_ring()
    from sglang_specopd.server.cpu.dflash2 import register_dflash2_adaptations

    register_dflash2_adaptations()
    from sglang_specopd.server.cpu.dspark import register_dspark_adaptations

    register_dspark_adaptations()
    from sglang_specopd.server.cpu.fork_start import register_fork_start

    register_fork_start()
    logger.info("sglang-specopd: CPU adaptations registered")
