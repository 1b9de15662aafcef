"""One test per CPU adaptation in sglang_specopd.server.cpu: each shows SGLang failing without it and working with it.

No server is started. SGLang's CPU engine can only be imported with the ``sgl_kernel`` stand-in first on
``sys.path`` (and ``SGLANG_USE_CPU_ENGINE=1``), so everything that imports SGLang runs in a fresh subprocess with
``launch.server_env("cpu")``: one script (:data:`CHECKS`) runs every check twice, first against pristine SGLang,
then after loading the plugin the way SGLang's own processes do (``sglang.srt.plugins.load_plugins()``: our entry
point's ``register()`` + ``HookRegistry.apply_hooks()``), and reports JSON. The tests assert on that report.
The stand-in's ops themselves are compared with loop references in-process (they only need torch).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fakes.standin import STANDIN_INIT, load_standin

REPO = Path(__file__).resolve().parents[1]

CPU_HOOK_TARGETS = (
    "sglang.srt.arg_groups.speculative_hook._handle_dflash",
    "sglang.srt.models.dflash.DFlashAttention.__init__",
    "sglang.srt.layers.attention.torch_native_backend.TorchNativeAttnBackend.forward_extend",
    "sglang.srt.layers.attention.torch_native_backend.TorchNativeAttnBackend._run_sdpa_forward_decode",
    "sglang.srt.entrypoints.engine._set_envs_and_config",  # fork start (cpu/fork_start.py)
    # hybrid GDN targets (cpu/hybrid_gdn.py)
    "sglang.srt.models.qwen3_next.Qwen3GatedDeltaNet.__init__",
    "sglang.kernels.ops.attention.fla.fused_norm_gate.FusedRMSNormGated.forward",
    "sglang.srt.models.qwen2_moe.fused_gate_sigmoid_mul_add",
    "sglang.srt.layers.attention.hybrid_linear_attn_backend.scatter_mamba_states_after_mtp_verify",
)


def run_python(code: str, env: dict, *args: str, timeout: float = 300.0) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-W", "ignore", "-c", code, *args], capture_output=True, text=True,
                          env=env, timeout=timeout, cwd=str(REPO))


def cpu_env(**extra) -> dict:
    from sglang_specopd.app.launch.process import server_env

    env = server_env("cpu")
    env["SGLANG_PLUGINS"] = "specopd"  # only our plugin, whatever else is installed
    env.update(extra)
    return env


def last_json(proc: subprocess.CompletedProcess) -> dict:
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and lines, f"check script failed (rc {proc.returncode}):\n{proc.stdout[-3000:]}\n" \
                                           f"{proc.stderr[-5000:]}"
    return json.loads(lines[-1])


# ---------------------------------------------------------------------------------------------------------------
# (a) the sgl_kernel stand-in
# ---------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def standin():
    """The stand-in package loaded from its file under a private name (no ``sgl_kernel`` in sys.modules)."""
    return load_standin()


def _segments_ref(req_pool_indices, start, end):
    out = 0
    for row, s, e in zip(req_pool_indices.tolist(), start.tolist(), end.tolist()):
        yield row, s, e, out
        out += e - s


def test_standin_assign_req_to_token_pool(standin) -> None:
    import torch

    g = torch.Generator().manual_seed(0)
    req_to_token = torch.randint(0, 1000, (5, 40), generator=g, dtype=torch.int32)
    rows, start, end = torch.tensor([3, 0, 4]), torch.tensor([2, 0, 7]), torch.tensor([9, 5, 7])  # last: empty
    n = int((end - start).sum())
    out_cache_loc = torch.randint(0, 5000, (n,), generator=g, dtype=torch.int64)
    want = req_to_token.clone()
    for row, s, e, o in _segments_ref(rows, start, end):
        for j in range(e - s):
            want[row, s + j] = int(out_cache_loc[o + j])
    standin.assign_req_to_token_pool_cpu(rows, req_to_token, start, end, out_cache_loc, req_to_token.shape[1])
    assert torch.equal(req_to_token, want)


def test_standin_assign_extend_cache_locs(standin) -> None:
    import torch

    g = torch.Generator().manual_seed(1)
    req_to_token = torch.randint(0, 1000, (4, 32), generator=g, dtype=torch.int32)
    rows, start, end = torch.tensor([2, 1, 3]), torch.tensor([4, 0, 10]), torch.tensor([8, 3, 14])
    out = torch.full((int((end - start).sum()),), -1, dtype=torch.int64)
    want = []
    for row, s, e, _ in _segments_ref(rows, start, end):
        want += [int(req_to_token[row, j]) for j in range(s, e)]
    standin.assign_extend_cache_locs_cpu(rows, req_to_token, start, end, out, req_to_token.shape[1])
    assert out.tolist() == want


def test_standin_assign_draft_cache_locs_contiguous(standin) -> None:
    import torch

    g = torch.Generator().manual_seed(2)
    req_to_token = torch.randint(0, 1000, (4, 32), generator=g, dtype=torch.int32)
    rows, seq_lens, topk, num_cols = torch.tensor([3, 1]), torch.tensor([5, 11]), 1, 4
    out = torch.full((2 * topk * num_cols,), -1, dtype=torch.int64)
    want = []
    for row, s in zip(rows.tolist(), seq_lens.tolist()):
        want += [int(req_to_token[row, j]) for j in range(s, s + topk * num_cols)]
    standin.assign_draft_cache_locs_contiguous_cpu(rows, req_to_token, seq_lens, out, req_to_token.shape[1], topk,
                                                   num_cols)
    assert out.tolist() == want


def test_standin_copy_all_layer_kv_cache(standin) -> None:
    """Rows tgt_loc[j] <- src_loc[j] in every buffer, addressed by data_ptr() and row stride in bytes."""
    import torch

    g = torch.Generator().manual_seed(3)
    bufs = [torch.randn(16, 2, 8, generator=g), torch.randn(16, 2, 8, generator=g).to(torch.bfloat16),
            torch.randn(16, 3, 4, generator=g)]
    before = [b.clone() for b in bufs]
    src, tgt = torch.tensor([1, 2, 3, 9]), torch.tensor([2, 3, 4, 0])  # overlapping: rows are read before written
    data_ptrs = torch.tensor([b.data_ptr() for b in bufs], dtype=torch.uint64)
    strides = torch.tensor([b[0].nbytes for b in bufs], dtype=torch.int64)
    standin.copy_all_layer_kv_cache_cpu(data_ptrs, strides, tgt, src)
    for b, old in zip(bufs, before):
        want = old.clone()
        for s, t in zip(src.tolist(), tgt.tolist()):
            want[t] = old[s]
        assert torch.equal(b, want)


def test_standin_is_honest_about_missing_ops(standin) -> None:
    assert standin.SPECOPD_CPU_STANDIN is True
    for name in ("silu_and_mul", "fused_add_rmsnorm", "top_k_renorm_prob", "definitely_not_an_op"):
        assert not hasattr(standin, name)
        with pytest.raises(AttributeError, match="stand-in"):
            getattr(standin, name)
    with pytest.raises(NotImplementedError):  # imported by EAGLE modules at import time, never called by DFLASH
        standin.verify_tree_greedy_cpu()


@pytest.mark.slow
def test_cpu_engine_does_not_import_without_the_standin() -> None:
    env = cpu_env()
    standin_dir = str(STANDIN_INIT.parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p != standin_dir)
    code = "import sglang.srt.mem_cache.allocation"
    without = run_python(code, env)
    assert without.returncode != 0 and "ImportError" in without.stderr + without.stdout, without.stderr[-2000:]


# ---------------------------------------------------------------------------------------------------------------
# (b)-(e): SGLang in a subprocess, before and after the plugin is loaded
# ---------------------------------------------------------------------------------------------------------------

CHECKS = textwrap.dedent(r'''
    import json, sys, traceback, types
    import torch

    R = {}

    def check(name, fn):
        try:
            R[name] = {"ok": True, "value": fn()}
        except BaseException as exc:
            R[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:800], "tb": traceback.format_exc()[-3000:]}

    TARGET, DRAFTER = sys.argv[1], sys.argv[2]

    import sgl_kernel
    import sglang.srt.arg_groups.speculative_hook as sh
    import sglang.srt.models.dflash as dm
    import sglang.srt.speculative.draft_worker_common as dwc
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
    from sglang.srt.layers.radix_attention import AttentionType
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.plugins.hook_registry import HookRegistry
    from sglang.srt.server_args import ServerArgs
    from sglang.srt.arg_groups.overrides import resolving_view
    from sglang.srt.arg_groups.choices import DRAFT_ATTENTION_BACKEND_CHOICES
    from transformers import AutoConfig

    R["standin_loaded"] = bool(getattr(sgl_kernel, "SPECOPD_CPU_STANDIN", False))

    # ---- (a) SGLang's CPU wrappers reach the stand-in ----
    def sglang_wrappers():
        from sglang.srt.mem_cache.allocation import assign_req_to_token_pool_func
        from sglang.kernels.ops.speculative.cache_locs import assign_draft_cache_locs_contiguous_func
        from sglang.kernels.ops.kvcache.cache_move import copy_all_layer_kv_cache_func
        r2t = torch.zeros((3, 16), dtype=torch.int32)
        assign_req_to_token_pool_func(torch.tensor([2, 0]), r2t, torch.tensor([1, 0]), torch.tensor([4, 2]),
                                      torch.tensor([10, 11, 12, 20, 21]), 2)
        ok1 = r2t[2, 1:4].tolist() == [10, 11, 12] and r2t[0, 0:2].tolist() == [20, 21]
        out = torch.empty(4, dtype=torch.int64)
        assign_draft_cache_locs_contiguous_func(torch.tensor([2]), r2t, torch.tensor([1]), out, 1, 4)
        ok2 = out.tolist() == r2t[2, 1:5].tolist()
        buf = torch.arange(24, dtype=torch.float32).view(6, 4)
        copy_all_layer_kv_cache_func(torch.tensor([buf.data_ptr()], dtype=torch.uint64),
                                     torch.tensor([buf[0].nbytes]), torch.tensor([5, 0]), torch.tensor([1, 2]),
                                     2, 2, {})
        ok3 = buf[5].tolist() == [4.0, 5.0, 6.0, 7.0] and buf[0].tolist() == [8.0, 9.0, 10.0, 11.0]
        return [ok1, ok2, ok3]
    check("standin_via_sglang", sglang_wrappers)

    # ---- (b) _handle_dflash on a CPU ServerArgs ----
    def cpu_server_args():
        return ServerArgs(model_path=TARGET, device="cpu", speculative_algorithm="DFLASH",
                          speculative_draft_model_path=DRAFTER, speculative_dflash_block_size=4,
                          speculative_draft_attention_backend="torch_native", attention_backend="torch_native")

    def handle_dflash():
        sa = cpu_server_args()
        sh._handle_dflash(sa)
        view = resolving_view(sa)
        return {"num_draft_tokens": view.speculative_num_draft_tokens,
                "draft_backend": view.speculative_draft_attention_backend,
                "platform_restored": type(sh.current_platform).__name__}

    def draft_worker_backend():
        dwc.get_spec = lambda: types.SimpleNamespace(speculative_draft_attention_backend="torch_native")
        return dwc.resolve_draft_worker_attention_backend(algo_label="DFLASH")

    # ---- (b) the AROUND hook called directly with a stub original_fn ----
    def platform_proxy():
        from sglang_specopd.server.cpu.patches import handle_dflash_on_cpu
        real = sh.current_platform
        seen = {}
        def original(server_args):
            p = sh.current_platform
            seen[server_args.device] = {
                "proxied": p is not real, "out_of_tree": p.is_out_of_tree(),
                "dflash": p.supports_speculative_algorithm("DFLASH"),
                "dspark": p.supports_speculative_algorithm("DSPARK"),
                "torch_native": p.supports_speculative_draft_attention_backend("DFLASH", "torch_native"),
                "flashinfer": p.supports_speculative_draft_attention_backend("DFLASH", "flashinfer"),
                "default": p.get_default_speculative_draft_attention_backend("DFLASH"),
            } if p is not real else {"proxied": False}
            if server_args.device == "cpu":
                seen["delegates"] = p.is_cpu() == real.is_cpu()
                raise RuntimeError("boom")
            return "passed-through"
        try:
            handle_dflash_on_cpu(original, types.SimpleNamespace(device="cpu"))
        except RuntimeError:
            pass
        seen["restored_after_error"] = sh.current_platform is real
        seen["cuda_result"] = handle_dflash_on_cpu(original, types.SimpleNamespace(device="cuda:0"))
        return seen

    # ---- (c) record_stream on a CPU tensor, with the stream SGLang passes ----
    def record_stream():
        t = torch.zeros(4)
        return t.record_stream(torch.get_device_module(t.device).current_stream())

    def record_stream_generic():
        t = torch.zeros(4)
        return t.record_stream(torch.Stream("cpu"))

    def record_stream_meta():
        t = torch.zeros(4, device="meta")
        return t.record_stream(torch.get_device_module("cpu").current_stream())

    # ---- (d) DFlashAttention built on CPU (tensor-parallel linears stubbed with nn.Linear) ----
    dm.get_parallel = lambda: types.SimpleNamespace(tp_size=1)
    dm.DFlashAttention._build_qkv_proj = (
        lambda self, bias, quant_config, prefix: torch.nn.Linear(self.hidden_size, self.q_size + 2 * self.kv_size,
                                                                 bias=bias))
    dm.RowParallelLinear = lambda i, o, bias=False, **kw: torch.nn.Linear(i, o, bias=bias)
    draft_cfg = AutoConfig.from_pretrained(DRAFTER)

    def dflash_attention():
        attn = dm.DFlashAttention(draft_cfg, 0)
        return bool(attn.use_table_qk_norm_rope)

    def table_kernel_on_cpu():
        from sglang.kernels.ops.attention.table_qk_norm_rope import table_qk_norm_rope_
        attn = dm.DFlashAttention(draft_cfg, 0)
        qkv = torch.randn(3, attn.q_size + 2 * attn.kv_size, dtype=torch.bfloat16)
        table_qk_norm_rope_(qkv, torch.arange(3), attn.q_norm.weight.bfloat16(), attn.k_norm.weight.bfloat16(),
                            attn.rotary_emb.cos_sin_cache, attn.num_heads, attn.num_kv_heads, attn.head_dim,
                            attn.q_norm.variance_epsilon)

    # ---- (e) TorchNativeAttnBackend.forward_extend in TARGET_VERIFY ----
    HQ, HKV, D, N = 4, 2, 8, 4
    PREFIX = [5, 3]
    ROWS = [2, 0]

    class Pool:
        def __init__(self, g):
            self.k = torch.randn(64, HKV, D, generator=g)
            self.v = torch.randn(64, HKV, D, generator=g)
        def set_kv_buffer(self, layer, loc, k, v):
            self.k[loc.loc] = k.view(-1, HKV, D)
            self.v[loc.loc] = v.view(-1, HKV, D)
        def get_key_buffer(self, layer_id):
            return self.k
        def get_value_buffer(self, layer_id):
            return self.v

    def verify_setup(mode=ForwardMode.TARGET_VERIFY, custom_mask=None):
        g = torch.Generator().manual_seed(0)
        backend = TorchNativeAttnBackend.__new__(TorchNativeAttnBackend)
        backend.token_to_kv_pool = Pool(g)
        slots = torch.randperm(64, generator=g)[: 3 * 16].view(3, 16).to(torch.int32)
        backend.req_to_token_pool = types.SimpleNamespace(req_to_token=slots)
        backend.swa_out_cache_loc = None
        backend.use_sliding_window_kv_pool = False
        bs = len(PREFIX)
        out_loc = torch.cat([slots[r, p : p + N] for r, p in zip(ROWS, PREFIX)]).to(torch.int64)
        fb = types.SimpleNamespace(
            forward_mode=mode, batch_size=bs, seq_lens=torch.tensor(PREFIX), req_pool_indices=torch.tensor(ROWS),
            out_cache_loc=out_loc, spec_info=types.SimpleNamespace(draft_token_num=N, custom_mask=custom_mask),
            extend_prefix_lens=None, extend_seq_lens=None, encoder_lens=None, encoder_out_cache_loc=None)
        layer = types.SimpleNamespace(tp_q_head_num=HQ, tp_k_head_num=HKV, tp_v_head_num=HKV, qk_head_dim=D,
                                      v_head_dim=D, layer_id=0, scaling=D ** -0.5, is_cross_attention=False,
                                      attn_type=AttentionType.DECODER, sliding_window_size=None)
        q = torch.randn(bs * N, HQ * D, generator=g)
        k = torch.randn(bs * N, HKV * D, generator=g)
        v = torch.randn(bs * N, HKV * D, generator=g)
        return backend, fb, layer, q, k, v

    def verify_reference(backend, q, k, v, causal=True):
        # attention over prefix (from the cache) + the block (k, v), block queries at the end; causal for the
        # target, full (non-causal) for DFLASH's draft layers (ENCODER_ONLY)
        pool = backend.token_to_kv_pool
        outs = []
        for i, (row, p) in enumerate(zip(ROWS, PREFIX)):
            pre = backend.req_to_token_pool.req_to_token[row, :p].long()
            kk = torch.cat([pool.k[pre], k[i * N:(i + 1) * N].view(N, HKV, D)])
            vv = torch.cat([pool.v[pre], v[i * N:(i + 1) * N].view(N, HKV, D)])
            qq = q[i * N:(i + 1) * N].view(N, HQ, D)
            kk = kk.repeat_interleave(HQ // HKV, dim=1)
            vv = vv.repeat_interleave(HQ // HKV, dim=1)
            mask = torch.ones(N, p + N, dtype=torch.bool)
            if causal:
                mask = mask.tril(diagonal=p)
            o = torch.nn.functional.scaled_dot_product_attention(
                qq.transpose(0, 1), kk.transpose(0, 1), vv.transpose(0, 1), attn_mask=mask, scale=D ** -0.5)
            outs.append(o.transpose(0, 1).reshape(N, HQ * D))
        return torch.cat(outs)

    def target_verify():
        backend, fb, layer, q, k, v = verify_setup()
        want = verify_reference(backend, q, k, v)
        got = TorchNativeAttnBackend.forward_extend(backend, q, k, v, layer, fb)
        written = torch.equal(backend.token_to_kv_pool.k[fb.out_cache_loc], k.view(-1, HKV, D))
        return {"max_err": float((got - want).abs().max()), "kv_written": written}

    def target_verify_encoder_only():
        backend, fb, layer, q, k, v = verify_setup()
        layer.attn_type = AttentionType.ENCODER_ONLY
        want = verify_reference(backend, q, k, v, causal=False)
        causal_want = verify_reference(backend, q, k, v, causal=True)
        got = TorchNativeAttnBackend.forward_extend(backend, q, k, v, layer, fb)
        return {"max_err": float((got - want).abs().max()),
                "differs_from_causal": float((causal_want - want).abs().max()) > 1e-3}

    def target_verify_with_extend_lens():
        # the most helpful lengths a verify batch could carry: prefix and block length per request
        backend, fb, layer, q, k, v = verify_setup()
        fb.extend_prefix_lens = torch.tensor(PREFIX)
        fb.extend_seq_lens = torch.tensor([N] * len(PREFIX))
        want = verify_reference(backend, q, k, v)
        got = TorchNativeAttnBackend.forward_extend(backend, q, k, v, layer, fb)
        return {"max_err": float((got - want).abs().max())}

    def target_verify_custom_mask():
        backend, fb, layer, q, k, v = verify_setup(custom_mask=torch.ones(1, dtype=torch.bool))
        TorchNativeAttnBackend.forward_extend(backend, q, k, v, layer, fb)

    def plain_extend_unchanged():
        # EXTEND (prefill) of two fresh requests: the hooked method must give exactly the original's answer
        backend, fb, layer, q, k, v = verify_setup(mode=ForwardMode.EXTEND)
        fb.seq_lens = torch.tensor([N, N]); fb.extend_prefix_lens = torch.tensor([0, 0])
        fb.extend_seq_lens = torch.tensor([N, N])
        fb.out_cache_loc = torch.cat([backend.req_to_token_pool.req_to_token[r, :N] for r in ROWS]).long()
        out = TorchNativeAttnBackend.forward_extend(backend, q, k, v, layer, fb)
        return out.tolist()

    def decode_outputs():
        # DECODE through _run_sdpa_forward_decode for 5 requests of different lengths (GQA): SGLang's per-request
        # loop before the plugin, the batched groups after; the two must agree
        g = torch.Generator().manual_seed(5)
        backend, fb, layer, q, k, v = verify_setup()
        lens = torch.tensor([1, 9, 3, 16, 12])
        rows = torch.tensor([0, 2, 1, 4, 3])
        r2t = torch.stack([torch.randperm(64, generator=g)[:16] for _ in range(5)]).to(torch.int32)
        query = torch.randn(5, HQ, D, generator=g)
        out = torch.zeros(5, HQ, D)
        backend._run_sdpa_forward_decode(query, out, backend.token_to_kv_pool.k, backend.token_to_kv_pool.v, r2t,
                                         rows, lens, None, scaling=D ** -0.5, enable_gqa=True, causal=False,
                                         is_cross_attn=False, sliding_window_size=None)
        return out.tolist()

    # ---- phase 1: pristine SGLang ----
    R["draft_choices_before"] = list(DRAFT_ATTENTION_BACKEND_CHOICES)
    check("handle_dflash_before", handle_dflash)
    check("draft_worker_backend_before", draft_worker_backend)
    check("record_stream_before", record_stream)
    check("record_stream_generic_before", record_stream_generic)
    check("dflash_attention_before", dflash_attention)
    check("table_kernel_on_cpu", table_kernel_on_cpu)
    check("target_verify_before", target_verify)
    check("target_verify_lens_before", target_verify_with_extend_lens)
    check("platform_proxy", platform_proxy)
    check("plain_extend_before", plain_extend_unchanged)
    check("decode_before", decode_outputs)

    # ---- load the plugin as every SGLang process does ----
    from sglang.srt.plugins import load_plugins
    load_plugins()
    R["hook_targets"] = sorted(HookRegistry._hooks)
    R["draft_choices_after"] = list(DRAFT_ATTENTION_BACKEND_CHOICES)

    # ---- phase 2: with the adaptations ----
    check("handle_dflash_after", handle_dflash)
    check("draft_worker_backend_after", draft_worker_backend)
    check("record_stream_after", record_stream)
    check("record_stream_generic_after", record_stream_generic)
    check("record_stream_meta_after", record_stream_meta)
    check("dflash_attention_after", dflash_attention)
    check("target_verify_after", target_verify)
    check("target_verify_custom_mask_after", target_verify_custom_mask)
    check("target_verify_encoder_only_after", target_verify_encoder_only)
    check("plain_extend_after", plain_extend_unchanged)
    check("decode_after", decode_outputs)
    print(json.dumps(R))
''')


@pytest.fixture(scope="module")
def cpu_checks(tiny_target: Path, tiny_drafter: Path) -> dict:
    return last_json(run_python(CHECKS, cpu_env(), str(tiny_target), str(tiny_drafter), timeout=600))


def _ok(report: dict, name: str):
    entry = report[name]
    assert entry["ok"], f"{name} failed: {entry.get('error')}\n{entry.get('tb', '')}"
    return entry["value"]


def _failed(report: dict, name: str) -> str:
    entry = report[name]
    assert not entry["ok"], f"{name} unexpectedly passed: {entry.get('value')!r}"
    return entry["error"]


@pytest.mark.slow
def test_sglang_cpu_engine_uses_the_standin(cpu_checks: dict) -> None:
    assert cpu_checks["standin_loaded"] is True
    assert _ok(cpu_checks, "standin_via_sglang") == [True, True, True]


@pytest.mark.slow
def test_plugin_registers_the_cpu_hooks_on_the_cpu_engine(cpu_checks: dict) -> None:
    assert set(CPU_HOOK_TARGETS) <= set(cpu_checks["hook_targets"])


@pytest.mark.slow
def test_handle_dflash_accepts_cpu(cpu_checks: dict) -> None:
    """(b) DFLASH-family algorithms are rejected on CPU by SGLang's device check; the AROUND hook accepts them."""
    assert "not supported" in _failed(cpu_checks, "handle_dflash_before")
    after = _ok(cpu_checks, "handle_dflash_after")
    assert after["num_draft_tokens"] == 4
    assert after["draft_backend"] == "torch_native"
    assert after["platform_restored"] == "CpuSRTPlatform", "the platform proxy must not outlive the call"


@pytest.mark.slow
def test_torch_native_is_an_allowed_draft_backend(cpu_checks: dict) -> None:
    """(b) Without torch_native in DRAFT_ATTENTION_BACKEND_CHOICES the draft worker falls back to CUDA flashinfer."""
    assert "torch_native" not in cpu_checks["draft_choices_before"]
    assert _ok(cpu_checks, "draft_worker_backend_before") == "flashinfer"
    assert "torch_native" in cpu_checks["draft_choices_after"]
    assert _ok(cpu_checks, "draft_worker_backend_after") == "torch_native"


@pytest.mark.slow
def test_cpu_platform_proxy_answers_for_dflash_only(cpu_checks: dict) -> None:
    """(b) The hook itself, with a stub original_fn: CPU -> proxy answers DFLASH/torch_native; other devices untouched."""
    seen = _ok(cpu_checks, "platform_proxy")
    assert seen["cpu"] == {"proxied": True, "out_of_tree": True, "dflash": True, "dspark": False,
                           "torch_native": True, "flashinfer": False, "default": "torch_native"}
    assert seen["delegates"] is True
    assert seen["restored_after_error"] is True
    assert seen["cuda:0"] == {"proxied": False} and seen["cuda_result"] == "passed-through"


@pytest.mark.slow
def test_record_stream_is_a_noop_for_cpu_tensors(cpu_checks: dict) -> None:
    """(c) dflash_worker_v2 calls seq_lens.record_stream(current_stream()); torch has no CPU kernel for it."""
    # torch rejects the torch.cpu.Stream SGLang passes ("unknown parameter type"), and has no CPU kernel for
    # aten::record_stream when given a generic torch.Stream("cpu") (NotImplementedError)
    assert "RuntimeError" in _failed(cpu_checks, "record_stream_before")
    assert "NotImplementedError" in _failed(cpu_checks, "record_stream_generic_before")
    assert _ok(cpu_checks, "record_stream_after") is None
    assert _ok(cpu_checks, "record_stream_generic_after") is None
    # other devices still reach torch's real method (which rejects a CPU stream object)
    assert "RuntimeError" in _failed(cpu_checks, "record_stream_meta_after")


@pytest.mark.slow
def test_dflash_attention_uses_plain_qk_norm_rope_on_cpu(cpu_checks: dict) -> None:
    """(d) SGLang picks its fused Triton qk-norm/RoPE for a CPU-built draft layer, and that kernel cannot run here."""
    assert _ok(cpu_checks, "dflash_attention_before") is True
    assert "active drivers" in _failed(cpu_checks, "table_kernel_on_cpu")
    assert _ok(cpu_checks, "dflash_attention_after") is False


def test_disable_table_qk_norm_rope_hook_on_stubs() -> None:
    """(d) The AFTER hook on stub modules: CPU (or parameter-less) -> False; a non-CPU module keeps its choice."""
    import torch

    from sglang_specopd.server.cpu.patches import disable_table_qk_norm_rope

    class Stub(torch.nn.Module):
        def __init__(self, device):
            super().__init__()
            if device is not None:
                self.w = torch.nn.Parameter(torch.zeros(2, device=device))
            self.use_table_qk_norm_rope = True

    for device, want in (("cpu", False), (None, False), ("meta", True)):
        stub = Stub(device)
        assert disable_table_qk_norm_rope("result", stub) == "result"
        assert stub.use_table_qk_norm_rope is want, device


@pytest.mark.slow
def test_torch_native_target_verify_equals_causal_attention(cpu_checks: dict) -> None:
    """(e) TARGET_VERIFY through torch_native: without the hook it crashes (extend lengths do not describe a verify
    batch); with it the output equals causal attention over prefix + block, and the block's KV is written."""
    _failed(cpu_checks, "target_verify_before")
    lens = cpu_checks["target_verify_lens_before"]  # even given per-request lengths: crash or wrong numbers
    assert not lens["ok"] or lens["value"]["max_err"] > 1e-3, lens
    after = _ok(cpu_checks, "target_verify_after")
    assert after["kv_written"] is True
    assert after["max_err"] < 1e-5, after
    assert "NotImplementedError" in _failed(cpu_checks, "target_verify_custom_mask_after")
    # DFLASH's draft layers (ENCODER_ONLY) also run in TARGET_VERIFY: full attention over prefix + block
    enc = _ok(cpu_checks, "target_verify_encoder_only_after")
    assert enc["differs_from_causal"] and enc["max_err"] < 1e-5, enc
    # prefill (EXTEND) batches take SGLang's own path, unchanged
    assert _ok(cpu_checks, "plain_extend_after") == _ok(cpu_checks, "plain_extend_before")


@pytest.mark.slow
def test_batched_decode_equals_sglang_per_request_loop(cpu_checks: dict) -> None:
    """(9) DECODE attention batched over requests (one padded SDPA call per group) gives SGLang's per-request
    loop's values (5 requests of lengths 1..16, GQA 4/2)."""
    import torch

    before = torch.tensor(_ok(cpu_checks, "decode_before"))
    after = torch.tensor(_ok(cpu_checks, "decode_after"))
    assert before.abs().sum() > 0
    torch.testing.assert_close(after, before, atol=2e-6, rtol=1e-5)


@pytest.mark.slow
def test_plugin_registers_no_cpu_hooks_without_cpu_engine() -> None:
    """Without SGLANG_USE_CPU_ENGINE, register() touches none of the CPU adaptations (GPU behaviour unchanged)."""
    from sglang_specopd.server.cpu import STANDIN_DIR

    env = {k: v for k, v in os.environ.items() if k != "SGLANG_USE_CPU_ENGINE"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                                        if p and Path(p) != STANDIN_DIR)
    code = textwrap.dedent('''
        import json, sys, torch
        from sglang.srt.plugins.hook_registry import HookRegistry
        from sglang.srt.arg_groups.choices import DRAFT_ATTENTION_BACKEND_CHOICES
        from sglang_specopd.server.plugin import register
        register()
        registered = sorted(HookRegistry._hooks)
        out = {"hooks": registered, "choices": list(DRAFT_ATTENTION_BACKEND_CHOICES),
               "record_stream_patched": bool(getattr(torch.Tensor.record_stream, "_specopd_cpu_noop", False)),
               "sgl_kernel_imported": "sgl_kernel" in sys.modules}
        # what the CPU engine would have added, for comparison
        HookRegistry.reset()
        from sglang_specopd.server.cpu.patches import register_cpu_adaptations
        register_cpu_adaptations()
        out["cpu_hooks"] = sorted(HookRegistry._hooks)
        print(json.dumps(out))
    ''')
    out = last_json(run_python(code, env))
    assert set(out["cpu_hooks"]) >= set(CPU_HOOK_TARGETS)
    assert not set(out["hooks"]) & set(out["cpu_hooks"]), set(out["hooks"]) & set(out["cpu_hooks"])
    assert "torch_native" not in out["choices"]
    assert out["record_stream_patched"] is False
    assert out["sgl_kernel_imported"] is False
    assert "sglang.srt.managers.scheduler.Scheduler.get_output_streamer_class" in out["hooks"]
