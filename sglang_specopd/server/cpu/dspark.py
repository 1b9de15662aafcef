"""DSpark drafters (``DSparkDraftModel``) served by SGLang's DSPARK worker on the CPU engine (CPU adaptation 16).

SGLang 0.5.23 serves a DSpark drafter with ``--speculative-algorithm DSPARK``
(``speculative/dspark_components/dspark_worker_v2.DSparkWorkerV2``); the plugin's ``SPECOPD_DSPARK``
(:mod:`sglang_specopd.server.algorithm.dspark`: that worker plus traces and hot swap) resolves its arguments with the
same ``_handle_dspark``, so everything below applies to it too. On that path two pieces refuse a CPU-only machine,
and they are replaced here for the CPU device only (on GPU the hooks call SGLang's code as is):

* ``speculative_hook._handle_dspark`` (argument resolution) raises "DSpark speculative decoding only supports CUDA,
  NPU or XPU device." for every other device. Its only reads of ``cfg.device`` are that gate and ``_is_npu``
  (False on CPU either way); everything after them
  (the draft path, gamma = ``--speculative-dspark-block-size`` or the drafter's ``dflash_config.block_size``,
  ``speculative_num_draft_tokens`` = gamma + 1, the ragged-verify checks) is device-independent. On CPU the
  function runs with ``speculative_hook.resolving_view`` answering ``device`` as ``"cuda"`` for that one call
  (restored after, also on error), then the overlap schedule is declared off as SGLang's own
  ``_disable_overlap_schedule_for_cpu`` does for EAGLE / NGRAM ("Overlap schedule is not implemented for
  speculative decoding on CPU").
* ``DSparkDraftMixin._build_fused_kv_write_bundle``: with bf16 drafter weights (a bf16 target such as SmolLM2 under
  ``dtype: auto``) it builds the bundle for ``fused_kv_norm_rope_write``, a Triton kernel that needs a GPU driver
  ("0 active drivers"), which the drafter's prefill KV injection then calls. On CPU the hook answers None, which
  SGLang itself answers for fp32 weights or an unsupported pool layout: the per-layer torch path (``kv_proj_only``,
  ``apply_k_norm``, ``apply_k_rope``, the pool's ``set_kv_buffer``), the same values unfused. fp32 drafters
  (the tiny test servers) never built the bundle.

The rest of the DSPARK path already runs on CPU, eagerly, through SGLang's own code or earlier adaptations:

* the DSpark kernels (``kernels/ops/speculative/dspark/``: greedy / sampled accept, the Markov-head sampler,
  softmax with temperature, ...) dispatch on the device of their inputs (``dispatch.inputs_on_cuda``): CPU tensors
  take SGLang's torch reference implementations;
* the sampled accept's torch path calls ``dspark_accept.chain_speculative_sampling_triton``, which CPU adaptation 8
  (``cpu/chain_sampling.py``) replaces with the chain rejection sampler in torch;
* the draft block forward (DFlash layers, ENCODER_ONLY attention, ``ForwardMode.TARGET_VERIFY``) and the target
  verify forward run on ``torch_native`` through adaptation 5; the DFlash layers' fused Triton qk-norm/RoPE is off
  (adaptation 4); ``Tensor.record_stream`` on CPU tensors is a no-op (adaptation 3; the worker calls it every step);
* CUDA graphs are off (``--disable-cuda-graph``, and torch_native disables them anyway), which also keeps the
  worker off its CUDA-only verify epilogue, sampling-accept graph and blockwise-rejection kernel (all gated on
  ``is_cuda()`` and the decode graph backend); nothing on the path is ``torch.compile``'d.
"""

from __future__ import annotations

import logging

from sglang_specopd.server import compat

logger = logging.getLogger("sglang_specopd.server.cpu.dspark")


def _is_cpu_device(device) -> bool:
    return str(device).split(":")[0] == "cpu"


class _GateView:
    """``_handle_dspark``'s resolving view with ``device`` read as ``"cuda"`` (everything else delegated)."""

    __slots__ = ("_view",)

    def __init__(self, view):
        object.__setattr__(self, "_view", view)

    def __getattr__(self, name):
        value = getattr(object.__getattribute__(self, "_view"), name)
        return "cuda" if name == "device" else value


def handle_dspark_on_cpu(original_fn, server_args):
    """AROUND hook for ``speculative_hook._handle_dspark``: let DSPARK resolve its arguments on the CPU device."""
    view = compat.get("resolving_view")
    if not _is_cpu_device(view(server_args).device):
        return original_fn(server_args)
    real = compat.get("speculative_hook.resolving_view")
    compat.patch("speculative_hook.resolving_view", lambda args: _GateView(real(args)))
    try:
        original_fn(server_args)
    finally:
        compat.patch("speculative_hook.resolving_view", real)
    compat.get("_disable_overlap_schedule_for_cpu")(server_args)


def no_fused_kv_write_on_cpu(original_fn, self, pool):
    """AROUND hook for ``DSparkDraftMixin._build_fused_kv_write_bundle``: None (SGLang's unfused torch K/V write)
    when the drafter's weights are on the CPU, else SGLang's bundle."""
    weight = next(self.parameters(), None)
    if weight is None or weight.device.type == "cpu":
        return None
    return original_fn(self, pool)


def register_dspark_adaptations() -> None:
    """Register the DSPARK-on-CPU hooks with SGLang's HookRegistry (CPU engine only)."""
    compat.hook("_handle_dspark", handle_dspark_on_cpu)
    compat.hook("DSparkDraftMixin._build_fused_kv_write_bundle", no_fused_kv_write_on_cpu)
