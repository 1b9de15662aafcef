"""Fused decode and verify attention for the CPU engine: reads each request's K/V rows in place through ``req_to_token``.

:func:`sglang_specopd.server.cpu.batched_attention.batched_decode_attention` gathers every request's K/V into a
padded tensor (``index_select``), transposes it per head and runs two float32 matmuls: at 48 requests x ~400
tokens of context (SmolLM2, float32, one thread) that was 54% of a decode step (py-spy, docs/journal.md session
12), half of it the copies. This is the same attention as one small C++ kernel (compiled on first use with
``torch.utils.cpp_extension.load_inline``, cached under ``TORCH_EXTENSIONS_DIR``): for each request it
walks its token slots once for the scores of every query head (a slot's K row holds all KV heads; query head
``j`` reads KV head ``j // (H_q / H_kv)``, GQA), then once more for the weighted sum of V, with an exact (two-pass) softmax in float32. No padding, no copies.

Float32 caches only (the CPU default dtype where bf16 is not native, :mod:`sglang_specopd.app.cpu_dtype`); any
other dtype, or a machine where the extension does not build (no C++ compiler), keeps the batched torch path.
``SPECOPD_CPU_FUSED_DECODE=0`` turns it off. Values equal the batched path up to float summation order;
the TARGET_VERIFY block (``block`` query rows per request, causal or not) runs the same kernel
(tests/test_cpu_batched_attention.py).
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Optional

import torch

log = logging.getLogger(__name__)

ENV_SWITCH = "SPECOPD_CPU_FUSED_DECODE"

_CPP = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <cmath>
#include <vector>
#include <limits>

// q [B*n, Hq, D] f32: n query rows per request (decode: n = 1; verify: the block); k_cache, v_cache [P, Hkv, D]
// f32 (rows may be strided over P only); req_to_token [R, C] int32 or int64; req_pool_indices [B] int64;
// lens [B] int64 KV length of the request including its n new tokens; out [B*n, Hq, D] f32.
// Query row j of request b sees its first lens[b] - (n - 1 - j) slots when causal, all lens[b] otherwise.
template <typename IdxT>
static void run(const torch::Tensor& q, const torch::Tensor& kc, const torch::Tensor& vc,
                const torch::Tensor& r2t, const torch::Tensor& rpi, const torch::Tensor& lens,
                int64_t n, bool causal, double scale, torch::Tensor& out) {
  const int64_t R = q.size(0), Hq = q.size(1), D = q.size(2), Hkv = kc.size(1);
  const int64_t G = Hq / Hkv;
  const float* qp = q.data_ptr<float>();
  const float* kp = kc.data_ptr<float>();
  const float* vp = vc.data_ptr<float>();
  const IdxT* tp = r2t.data_ptr<IdxT>();
  const int64_t* rp = rpi.data_ptr<int64_t>();
  const int64_t* lp = lens.data_ptr<int64_t>();
  float* op = out.data_ptr<float>();
  const int64_t ks0 = kc.stride(0), ks1 = kc.stride(1), vs0 = vc.stride(0), vs1 = vc.stride(1);
  const int64_t qs0 = q.stride(0), qs1 = q.stride(1), os0 = out.stride(0), os1 = out.stride(1);
  const int64_t ts0 = r2t.stride(0);
  const float sc = static_cast<float>(scale);
  at::parallel_for(0, R, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> s;
    std::vector<float> acc(Hq * D);
    for (int64_t r = begin; r < end; ++r) {
      const int64_t b = r / n, j = r % n;
      const int64_t L = causal ? lp[b] - (n - 1 - j) : lp[b];
      const IdxT* slots = tp + rp[b] * ts0;
      const float* qb = qp + r * qs0;
      s.assign(Hq * L, 0.f);
      for (int64_t t = 0; t < L; ++t) {  // scores: one pass over the request's K rows (all KV heads of a slot)
        const float* krow = kp + static_cast<int64_t>(slots[t]) * ks0;
        for (int64_t h = 0; h < Hkv; ++h) {
          const float* kr = krow + h * ks1;
          for (int64_t g = 0; g < G; ++g) {
            const float* qr = qb + (h * G + g) * qs1;
            float d = 0.f;
#pragma omp simd reduction(+:d)
            for (int64_t i = 0; i < D; ++i) d += qr[i] * kr[i];
            s[(h * G + g) * L + t] = d * sc;
          }
        }
      }
      for (int64_t jh = 0; jh < Hq; ++jh) {  // exact softmax per query head
        float* sj = s.data() + jh * L;
        float m = -std::numeric_limits<float>::infinity();
        for (int64_t t = 0; t < L; ++t) m = std::max(m, sj[t]);
        float z = 0.f;
        for (int64_t t = 0; t < L; ++t) { const float e = std::exp(sj[t] - m); sj[t] = e; z += e; }
        const float inv = z > 0.f ? 1.f / z : 0.f;
        for (int64_t t = 0; t < L; ++t) sj[t] *= inv;
      }
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t t = 0; t < L; ++t) {  // weighted sum: one pass over the V rows
        const float* vrow = vp + static_cast<int64_t>(slots[t]) * vs0;
        for (int64_t h = 0; h < Hkv; ++h) {
          const float* vr = vrow + h * vs1;
          for (int64_t g = 0; g < G; ++g) {
            const int64_t jh = h * G + g;
            const float p = s[jh * L + t];
            float* a = acc.data() + jh * D;
#pragma omp simd
            for (int64_t i = 0; i < D; ++i) a[i] += p * vr[i];
          }
        }
      }
      for (int64_t jh = 0; jh < Hq; ++jh) {
        float* o = op + r * os0 + jh * os1;
        for (int64_t i = 0; i < D; ++i) o[i] = acc[jh * D + i];
      }
    }
  });
}

void rows_attention(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache, torch::Tensor req_to_token,
                    torch::Tensor req_pool_indices, torch::Tensor lens, int64_t n, bool causal, double scale,
                    torch::Tensor out) {
  TORCH_CHECK(q.scalar_type() == torch::kFloat && k_cache.scalar_type() == torch::kFloat &&
              v_cache.scalar_type() == torch::kFloat && out.scalar_type() == torch::kFloat, "float32 only");
  TORCH_CHECK(q.stride(2) == 1 && k_cache.stride(2) == 1 && v_cache.stride(2) == 1 && out.stride(2) == 1,
              "the head dimension must be contiguous");
  TORCH_CHECK(q.size(1) % k_cache.size(1) == 0, "query heads must be a multiple of KV heads");
  TORCH_CHECK(req_to_token.stride(1) == 1, "req_to_token rows must be contiguous");
  TORCH_CHECK(n >= 1 && q.size(0) == req_pool_indices.size(0) * n && out.size(0) == q.size(0),
              "q and out must hold n rows per request");
  auto rpi = req_pool_indices.to(torch::kLong).contiguous();
  auto lp = lens.to(torch::kLong).contiguous();
  if (req_to_token.scalar_type() == torch::kInt) run<int32_t>(q, k_cache, v_cache, req_to_token, rpi, lp, n, causal, scale, out);
  else if (req_to_token.scalar_type() == torch::kLong) run<int64_t>(q, k_cache, v_cache, req_to_token, rpi, lp, n, causal, scale, out);
  else TORCH_CHECK(false, "req_to_token must be int32 or int64");
}
"""

_LOCK = threading.Lock()
_MODULE: dict = {}


def enabled() -> bool:
    """False when ``SPECOPD_CPU_FUSED_DECODE=0`` (read at each call)."""
    return os.environ.get(ENV_SWITCH, "1") != "0"


def extension():
    """The compiled extension module, or None where it cannot be built (logged once). Built once per process
    (the build itself is cached on disk by torch, keyed by the source)."""
    with _LOCK:
        if "mod" not in _MODULE:
            try:
                from torch.utils.cpp_extension import load_inline

                _MODULE["mod"] = load_inline(
                    name="specopd_cpu_fused_decode", cpp_sources=[_CPP], functions=["rows_attention"],
                    extra_cflags=["-O3", "-march=native", "-fopenmp-simd"], verbose=False)
            except Exception as exc:  # no compiler / headers: keep the torch path
                log.warning("fused CPU decode attention unavailable (%s); using the batched torch path", exc)
                _MODULE["mod"] = None
        return _MODULE["mod"]


def fused_decode_attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
                           scaling: Optional[float], out: torch.Tensor) -> bool:
    """Decode attention written into ``out`` [bs, H_q, D_v]; returns False (``out`` untouched) where it does not
    apply: switched off, non-float32 tensors, a non-CPU device, or no compiled extension.

    Args: as :func:`sglang_specopd.server.cpu.batched_attention.batched_decode_attention` (query [bs, H_q, D];
    k_cache / v_cache [pool_tokens, H_kv, D]; req_to_token [max_reqs, max_context]; seq_lens [bs] KV lengths
    including the new token; scaling None = 1/sqrt(D)).
    """
    return _rows_attention(query, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens, 1, True, scaling, out)


def fused_verify_attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, prefix_lens: torch.Tensor,
                           block: int, causal: bool, scaling: Optional[float], out: torch.Tensor) -> bool:
    """Verify-block attention (``block`` query rows per request) written into ``out`` [bs*block, H_q, D_v];
    returns False (``out`` untouched) where it does not apply, as :func:`fused_decode_attention`.

    Args: as :func:`sglang_specopd.server.cpu.batched_attention.batched_verify_attention`: query [bs*block, H_q,
    D], request ``b``'s rows ``b*block .. b*block+block-1`` at positions ``prefix_lens[b] + j``; ``causal``: row
    ``j`` sees slots ``0 .. prefix_lens[b] + j`` (chain verify), else the whole prefix + block (DFlash's
    ENCODER_ONLY draft layers). The same kernel as decode (decode is ``block = 1``, causal). Session 17 py-spy: the
    batched torch path was 12.7% of a SPECOPD step at concurrency 1 (masks, gathers and copies per layer).
    """
    return _rows_attention(query, k_cache, v_cache, req_to_token, req_pool_indices, prefix_lens + block, block,
                           causal, scaling, out)


def _rows_attention(query, k_cache, v_cache, req_to_token, req_pool_indices, lens, n: int, causal: bool,
                    scaling: Optional[float], out: torch.Tensor) -> bool:
    """The kernel on ``n`` query rows per request with KV lengths ``lens`` [bs] (including the n new tokens), or
    False (``out`` untouched) when switched off, not float32, not on CPU, or the extension does not build."""
    if (not enabled() or query.device.type != "cpu" or
            any(t.dtype != torch.float32 for t in (query, k_cache, v_cache, out))):
        return False
    mod = extension()
    if mod is None:
        return False
    scale = query.shape[-1] ** -0.5 if scaling is None else float(scaling)
    mod.rows_attention(query, k_cache, v_cache, req_to_token, req_pool_indices, lens, n, causal, scale, out)
    return True
