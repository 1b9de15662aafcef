"""What the plugin's ``RadixAttention.forward`` hook costs a normal decode step (CPU).

``/specopd/score_trees`` (:mod:`sglang_specopd.server.scoring.forward`) wraps ``RadixAttention.forward`` with an AROUND
hook (``tree_attention_override``) for every attention layer of the served target; outside a tree forward it only
checks a context variable and calls SGLang's own forward. This measures that inert path, on SGLang's real
``RadixAttention`` wrapped by SGLang's real ``HookRegistry`` (the exact production wrapper), two ways:

* per call: ``RadixAttention.forward`` hooked vs unhooked with a no-op attention backend (the wrapper's own
  overhead, ns per call), times the target's attention layers = the added time per decode step;
* per decode step: a SmolLM2-135M-shaped decode step (batch 1, 30 layers of RMSNorm, fused QKV, RadixAttention
  over a KV cache of ``--context`` tokens through a torch SDPA decode backend, o-proj, SwiGLU MLP; final norm and
  LM head), hooked vs unhooked, interleaved rounds, medians. The two outputs must be bitwise equal.

The plain decode step of a real SmolLM2 server on this machine (``serve_smollm2_cpu.json``, concurrency 1: the
plugin is loaded there, so the hook is in it) is reported beside it for scale.

    python benchmarks/radix_hook_cost.py [--out benchmarks/results/radix_hook_cost_cpu.json] [--steps 40]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Dict, List, Sequence

import torch

ROOT = Path(__file__).resolve().parents[1]
SMOLLM2 = {"hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
           "intermediate_size": 1536, "vocab_size": 49152}
SERVE_RESULT = ROOT / "benchmarks" / "results" / "serve_smollm2_cpu.json"


def summarize(samples: Sequence[float]) -> Dict[str, float]:
    """``{"median", "p25", "p75", "min", "n"}`` of ``samples`` (any unit; quartiles by the inclusive method).
    Raises ValueError on an empty sequence."""
    if not samples:
        raise ValueError("no samples")
    xs = sorted(float(x) for x in samples)
    q = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) > 1 else [xs[0]] * 3
    return {"median": statistics.median(xs), "p25": q[0], "p75": q[2], "min": xs[0], "n": len(xs)}


def overhead(unhooked: Sequence[float], hooked: Sequence[float]) -> Dict[str, float]:
    """Overhead of ``hooked`` over ``unhooked`` samples (same unit): medians, their difference and its fraction,
    and the difference of the minima (``min_diff``: the least noisy estimate on a shared machine)."""
    sa, sb = summarize(unhooked), summarize(hooked)
    a, b = sa["median"], sb["median"]
    return {"unhooked": a, "hooked": b, "diff": b - a, "fraction": (b - a) / a if a else float("nan"),
            "min_diff": sb["min"] - sa["min"]}


def predicted_step_overhead(per_call_ns: float, layers: int, step_ms: float) -> Dict[str, float]:
    """Per-call wrapper overhead (ns) x attention layers, in microseconds per step and as a fraction of ``step_ms``."""
    us = per_call_ns * layers / 1e3
    return {"us_per_step": us, "fraction_of_step": us / (step_ms * 1e3) if step_ms > 0 else float("nan")}


def server_step_ms(path: Path = SERVE_RESULT) -> Dict[str, object] | None:
    """A real SmolLM2 server's plain decode step at concurrency 1 (ms per token) from its result file, or None."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    try:
        name = str(path.resolve().relative_to(ROOT))
    except ValueError:
        name = str(path)
    out: Dict[str, object] = {"file": name, "git_commit": data.get("git_commit")}
    for key, tps in (("bfloat16", (data.get("tokens_per_s") or {}).get("plain")),
                     ("float32", (data.get("tokens_per_s_fp32") or {}).get("plain"))):
        if tps:
            out[f"{key}_ms"] = 1e3 / float(tps)
    return out if len(out) > 2 else None


class DecodeBackend:
    """A torch SDPA decode attention backend: writes the step's k/v at ``forward_batch.pos`` of a per-layer cache
    (``[L, Hkv, D]``) and attends over positions ``0..pos``. ``noop=True`` returns q (wrapper-only timing)."""

    def __init__(self, layers: int, context: int, kv_heads: int, head_dim: int, dtype, noop: bool = False):
        self.k = torch.zeros(layers, kv_heads, context, head_dim, dtype=dtype)
        self.v = torch.zeros_like(self.k)
        self.noop = noop

    def forward(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        if self.noop:
            return q
        pos, lid = forward_batch.pos, layer.layer_id
        self.k[lid, :, pos] = k.view(-1, layer.qk_head_dim)
        self.v[lid, :, pos] = v.view(-1, layer.v_head_dim)
        qq = q.view(1, layer.tp_q_head_num, 1, layer.qk_head_dim)
        out = torch.nn.functional.scaled_dot_product_attention(
            qq, self.k[lid : lid + 1, :, : pos + 1], self.v[lid : lid + 1, :, : pos + 1], scale=layer.scaling,
            enable_gqa=True)
        return out.reshape(1, layer.tp_q_head_num * layer.v_head_dim)


class DecodeModel(torch.nn.Module):
    """Llama-shaped layer stack (random weights) whose attention is SGLang's ``RadixAttention``."""

    def __init__(self, shape: Dict[str, int], layers: int, dtype):
        super().__init__()
        from sglang_specopd.server import compat

        radix = compat.get("RadixAttention")
        h, nh, nkv = shape["hidden_size"], shape["num_attention_heads"], shape["num_key_value_heads"]
        d, inter = h // nh, shape["intermediate_size"]
        g = torch.Generator().manual_seed(0)

        def w(*s):
            return torch.nn.Parameter((torch.randn(*s, generator=g) * 0.02).to(dtype), requires_grad=False)

        self.qkv = torch.nn.ParameterList([w(h, (nh + 2 * nkv) * d) for _ in range(layers)])
        self.o = torch.nn.ParameterList([w(nh * d, h) for _ in range(layers)])
        self.gate_up = torch.nn.ParameterList([w(h, 2 * inter) for _ in range(layers)])
        self.down = torch.nn.ParameterList([w(inter, h) for _ in range(layers)])
        self.head = w(h, shape["vocab_size"])
        self.attn = [radix(nh, d, d ** -0.5, nkv, i) for i in range(layers)]
        self.split = (nh * d, nkv * d, nkv * d)

    @staticmethod
    def _norm(x):
        return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5).to(x.dtype)

    def step(self, x, forward_batch):
        """One decode step: ``x`` [1, H] -> logits [1, V]."""
        for i, attn in enumerate(self.attn):
            q, k, v = (self._norm(x) @ self.qkv[i]).split(self.split, dim=-1)
            x = x + attn(q, k, v, forward_batch) @ self.o[i]
            gate, up = (self._norm(x) @ self.gate_up[i]).chunk(2, dim=-1)
            x = x + (torch.nn.functional.silu(gate) * up) @ self.down[i]
        return self._norm(x) @ self.head


def production_wrapper():
    """``(original, wrapped)`` ``RadixAttention.forward``: SGLang's HookRegistry applies the plugin's AROUND hook
    exactly as a server does; the class is restored to ``original`` and the registry reset before returning."""
    from sglang_specopd.server import compat
    from sglang_specopd.server.scoring.forward import tree_attention_override

    registry, cls = compat.get("HookRegistry"), compat.get("RadixAttention")
    saved_hooks, saved_patched = dict(registry._hooks), set(registry._patched)
    original = cls.forward
    try:
        registry.reset()
        compat.hook("RadixAttention.forward", tree_attention_override)
        registry.apply_hooks()
        wrapped = cls.forward
    finally:
        registry.reset()
        registry._hooks.update(saved_hooks)
        registry._patched.update(saved_patched)
    if wrapped is original or getattr(wrapped, "__wrapped__", None) is not original:
        raise RuntimeError("HookRegistry did not wrap RadixAttention.forward")
    return original, wrapped


def _timed_calls(fn, args, calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn(*args)
    return (time.perf_counter() - t0) / calls * 1e9


def measure(*, layers: int, context: int, steps: int, rounds: int, calls: int, call_rounds: int | None = None,
            dtype=torch.float32, shape: Dict[str, int] = SMOLLM2) -> Dict[str, object]:
    """Run both measurements; returns the result payload (times in ns / ms, see module docstring).
    Raises ValueError unless ``context > steps`` (the cache holds ``context - steps`` tokens before the first step)."""
    prefix = context - steps
    if prefix < 1:
        raise ValueError(f"--context ({context}) must exceed --steps ({steps})")
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.model_executor.forward_context import ForwardContext, set_forward_context

    from sglang_specopd.server import compat

    cls = compat.get("RadixAttention")
    original, wrapped = production_wrapper()
    nh, nkv, h = shape["num_attention_heads"], shape["num_key_value_heads"], shape["hidden_size"]
    d = h // nh
    fb = SimpleNamespace(forward_mode=ForwardMode.DECODE, pos=0)
    model = DecodeModel(shape, layers, dtype)
    per_call: Dict[str, List[float]] = {"unhooked": [], "hooked": []}
    per_step: Dict[str, List[float]] = {"unhooked": [], "hooked": []}
    outputs: Dict[str, torch.Tensor] = {}
    x0 = torch.randn(1, h, generator=torch.Generator().manual_seed(1)).to(dtype)
    try:
        with torch.inference_mode():
            # wrapper-only: one layer, a backend that returns q
            set_forward_context(ForwardContext(attn_backend=DecodeBackend(1, 1, nkv, d, dtype, noop=True)))
            q, k, v = torch.zeros(1, nh * d, dtype=dtype), torch.zeros(1, nkv * d, dtype=dtype), torch.zeros(
                1, nkv * d, dtype=dtype)
            layer = model.attn[0]
            for r in range(call_rounds or rounds):
                for arm, fwd in (("unhooked", original), ("hooked", wrapped)) if r % 2 == 0 else (
                        ("hooked", wrapped), ("unhooked", original)):
                    cls.forward = fwd
                    _timed_calls(layer, (q, k, v, fb), calls // 10)  # warm
                    per_call[arm].append(_timed_calls(layer, (q, k, v, fb), calls))
            # whole decode steps over a KV cache of `prefix` tokens (random, as after a prefill)
            backend = DecodeBackend(layers, context, nkv, d, dtype)
            backend.k.normal_(generator=torch.Generator().manual_seed(2))
            backend.v.normal_(generator=torch.Generator().manual_seed(3))
            set_forward_context(ForwardContext(attn_backend=backend))
            for r in range(rounds):
                for arm, fwd in (("unhooked", original), ("hooked", wrapped)) if r % 2 == 0 else (
                        ("hooked", wrapped), ("unhooked", original)):
                    cls.forward = fwd
                    x = x0
                    for s in range(steps):
                        fb.pos = prefix + s
                        t0 = time.perf_counter()
                        logits = model.step(x, fb)
                        per_step[arm].append((time.perf_counter() - t0) * 1e3)
                        x = x0 + logits[:, :h] * 1e-3  # the next input depends on this step's output
                    if r == 0:
                        outputs[arm] = logits.clone()
    finally:
        cls.forward = original
        set_forward_context(None)
    call = overhead(per_call["unhooked"], per_call["hooked"])
    step = overhead(per_step["unhooked"], per_step["hooked"])
    payload: Dict[str, object] = {
        "shape": dict(shape, num_hidden_layers=layers), "dtype": str(dtype).replace("torch.", ""),
        "torch_threads": torch.get_num_threads(), "context_tokens": context, "decode_steps_per_round": steps,
        "rounds": rounds, "call_rounds": call_rounds or rounds, "calls_per_round": calls,
        "per_call_ns": {**call, "unhooked_stats": summarize(per_call["unhooked"]),
                        "hooked_stats": summarize(per_call["hooked"])},
        "decode_step_ms": {**step, "unhooked_stats": summarize(per_step["unhooked"]),
                           "hooked_stats": summarize(per_step["hooked"])},
        "predicted_from_per_call": predicted_step_overhead(call["diff"], layers, step["unhooked"]),
        "predicted_from_per_call_min": predicted_step_overhead(call["min_diff"], layers, step["unhooked"]),
        "outputs_identical": bool(torch.equal(outputs["unhooked"], outputs["hooked"])),
    }
    server = server_step_ms()
    if server:
        for key in ("bfloat16_ms", "float32_ms"):
            if key in server:
                server[f"predicted_fraction_{key[:-3]}"] = predicted_step_overhead(
                    call["diff"], layers, float(server[key]))["fraction_of_step"]
        payload["server_plain_decode_step"] = server
    return payload


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "radix_hook_cost_cpu.json"))
    ap.add_argument("--layers", type=int, default=SMOLLM2["num_hidden_layers"])
    ap.add_argument("--context", type=int, default=512, help="KV cache length at the last step")
    ap.add_argument("--steps", type=int, default=40, help="decode steps per arm per round")
    ap.add_argument("--rounds", type=int, default=6, help="interleaved rounds (arm order alternates)")
    ap.add_argument("--calls", type=int, default=20000, help="wrapper-only calls per arm per round")
    ap.add_argument("--call-rounds", type=int, default=20, help="interleaved rounds of the wrapper-only timing")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (a CPU server runs 1 by default)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    payload = measure(layers=args.layers, context=args.context, steps=args.steps, rounds=args.rounds,
                      calls=args.calls, call_rounds=args.call_rounds, dtype=getattr(torch, args.dtype))
    from sglang_specopd.app.results import write_result

    write_result(args.out, payload)
    call, step = payload["per_call_ns"], payload["decode_step_ms"]
    print(f"per call: {call['unhooked']:.0f} ns unhooked, {call['hooked']:.0f} ns hooked (+{call['diff']:.0f} ns; "
          f"minima +{call['min_diff']:.0f} ns)")
    print(f"decode step: {step['unhooked']:.2f} ms unhooked, {step['hooked']:.2f} ms hooked "
          f"({100 * step['fraction']:+.2f}%), predicted +{payload['predicted_from_per_call']['us_per_step']:.1f} us "
          f"({100 * payload['predicted_from_per_call']['fraction_of_step']:.3f}%); identical outputs: "
          f"{payload['outputs_identical']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
