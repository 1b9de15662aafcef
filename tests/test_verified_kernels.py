"""Verified-only kernels (issue 40 part 3, ``specopd_kernels.verified``): on CUDA a Triton / FlashInfer kernel is
the default only with a passed GPU record for its current source hash; environment overrides both ways; CPU
unchanged. The choice needs no GPU (a ``cuda`` device object is enough to ask it)."""

from __future__ import annotations

import json

import pytest
import torch

from specopd_kernels import verified
from specopd_kernels.verified import KERNELS, OPS, choose, is_verified, load_records, source_sha256, write_records

ENVS = [verified.GLOBAL_ENV] + [op.env for op in OPS.values()]
ALWAYS = {"torch": lambda d: True, "triton": lambda d: True, "flashinfer": lambda d: True}


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch, tmp_path):
    for name in ENVS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(verified, "RECORDS_FILE", tmp_path / "verified_kernels.json")  # no committed record leaks in


def _record(kernel: str, **kw) -> dict:
    return {"source_sha256": source_sha256(kernel), "passed": True, "device": "cuda", "gpu": "NVIDIA H200",
            "created": "2026-12-01T00:00:00+00:00", **kw}


def test_source_hash_is_per_kernel_and_follows_the_source(tmp_path, monkeypatch) -> None:
    hashes = {k: source_sha256(k) for k in KERNELS}
    assert all(len(h) == 64 and int(h, 16) >= 0 for h in hashes.values()) and len(set(hashes.values())) == len(KERNELS)
    copy = tmp_path / "pkg"
    for rel in {r for files in KERNELS.values() for r in files} | {"lazy_triton.py"}:
        (copy / rel).parent.mkdir(parents=True, exist_ok=True)
        (copy / rel).write_bytes((verified._PKG / rel).read_bytes())
    monkeypatch.setattr(verified, "_PKG", copy)
    assert source_sha256("e2e_tv_fused") == hashes["e2e_tv_fused"]
    (copy / "losses" / "fused.py").write_text((copy / "losses" / "fused.py").read_text() + "\n# edited\n")
    assert source_sha256("e2e_tv_fused") != hashes["e2e_tv_fused"]  # any edit un-verifies the kernel
    assert source_sha256("gdn_replay_triton") == hashes["gdn_replay_triton"]


def test_cuda_defaults_to_torch_without_a_record_and_to_the_kernel_with_one() -> None:
    c = choose("tree_attention", "cuda", ALWAYS, records={})
    assert c.backend == "torch" and "tree_attention_triton: no GPU record" in c.reason
    recs = {"tree_attention_flashinfer": _record("tree_attention_flashinfer")}
    assert choose("tree_attention", "cuda", ALWAYS, records=recs).backend == "flashinfer"
    recs["tree_attention_triton"] = _record("tree_attention_triton")
    c = choose("tree_attention", "cuda", ALWAYS, records=recs)
    assert (c.backend, c.reason) == ("triton", "tree_attention_triton verified on NVIDIA H200 "
                                               "(2026-12-01T00:00:00+00:00)")
    # a verified kernel that cannot run here (no triton) falls through to the next, then to torch
    assert choose("tree_attention", "cuda", {**ALWAYS, "triton": lambda d: False}, records=recs).backend == "flashinfer"


@pytest.mark.parametrize(("edit", "why"), [
    ({"source_sha256": "0" * 64}, "its source changed since the GPU record"),
    ({"passed": False}, "its GPU record did not pass"),
    ({"device": "cpu"}, "its GPU record did not pass (device 'cpu'"),  # an interpreter smoke run never verifies
])
def test_stale_failed_or_cpu_records_do_not_verify(edit: dict, why: str) -> None:
    recs = {"gdn_replay_triton": _record("gdn_replay_triton", **edit)}
    ok, reason = is_verified("gdn_replay_triton", recs)
    assert not ok and reason.startswith(why)
    assert choose("gdn_replay", "cuda", ALWAYS, records=recs).backend == "torch"


def test_overrides_both_ways_and_cpu_unchanged(monkeypatch) -> None:
    recs = {"sparse_attention_triton": _record("sparse_attention_triton")}
    monkeypatch.setenv(verified.GLOBAL_ENV, "torch")
    assert choose("sparse_attention", "cuda", ALWAYS, records=recs).backend == "torch"
    monkeypatch.setenv(verified.GLOBAL_ENV, "triton")
    c = choose("gdn_replay", "cuda", ALWAYS, records={})
    assert (c.backend, c.reason) == ("triton", "SPECOPD_KERNELS=triton")
    assert choose("gdn_replay", "cpu", ALWAYS, records={}).backend == "torch"  # CPU: the global switch is ignored
    monkeypatch.setenv("SPECOPD_GDN_REPLAY", "torch")  # the op's own variable wins over the global one
    assert choose("gdn_replay", "cuda", ALWAYS, records={}).reason == "SPECOPD_GDN_REPLAY=torch"
    monkeypatch.setenv("SPECOPD_GDN_REPLAY", "verified")
    assert choose("gdn_replay", "cuda", ALWAYS, records={}).backend == "torch"
    monkeypatch.setenv("SPECOPD_GDN_REPLAY", "triton")
    assert choose("gdn_replay", "cpu", ALWAYS, records={}).backend == "triton"  # CPU: asked for by name (tests)
    with pytest.raises(ValueError, match="gdn-replay backend 'triton' cannot run on cpu here"):
        choose("gdn_replay", "cpu", {"torch": lambda d: True, "triton": lambda d: False})
    monkeypatch.setenv("SPECOPD_GDN_REPLAY", "fast")
    with pytest.raises(ValueError, match="unknown gdn-replay backend 'fast' \\(from SPECOPD_GDN_REPLAY\\); known: "
                                         "triton, torch, verified"):
        choose("gdn_replay", "cuda", ALWAYS)


def test_registries_follow_the_records(monkeypatch) -> None:
    """Each op's registry asks :func:`choose`: tree attention, sparse attention, GDN replay, E2E-TV alpha."""
    from specopd_kernels.gdn.backends import gdn_replay_backend_name
    from specopd_kernels.losses.tree import _use_fused_kernel
    from specopd_kernels.sparse import sparse_attention_backend_name
    from specopd_kernels.tree import TREE_ATTENTION_BACKENDS, tree_attention_backend_name
    from specopd_kernels.tree import triton_attention as tri

    class CudaRows:  # what _use_fused_kernel reads of the target rows: their device (no GPU needed to ask)
        device = torch.device("cuda")

    names = lambda: (tree_attention_backend_name("cuda"), sparse_attention_backend_name("cuda"),  # noqa: E731
                     gdn_replay_backend_name("cuda"))
    if not tri.triton_available():
        pytest.skip("triton does not import here")
    assert names() == ("torch", "torch", "torch") and _use_fused_kernel(CudaRows()) is False
    assert TREE_ATTENTION_BACKENDS["triton"].verified is False and TREE_ATTENTION_BACKENDS["torch"].verified
    write_records({k: _record(k) for k in ("tree_attention_triton", "sparse_attention_triton", "gdn_replay_triton",
                                           "e2e_tv_fused")}, verified.RECORDS_FILE)
    assert names() == ("triton", "triton", "triton") and _use_fused_kernel(CudaRows()) is True
    assert TREE_ATTENTION_BACKENDS["triton"].verified is True
    assert _use_fused_kernel(torch.zeros(2, 3)) is False  # CPU tensors: the chunked torch path, record or not


def test_write_records_merges_and_the_committed_file_parses(tmp_path) -> None:
    path = tmp_path / "r.json"
    write_records({"e2e_tv_fused": _record("e2e_tv_fused")}, path)
    write_records({"gdn_replay_triton": _record("gdn_replay_triton", passed=False)}, path)
    got = load_records(path)
    assert sorted(got) == ["e2e_tv_fused", "gdn_replay_triton"] and got["e2e_tv_fused"]["passed"] is True
    assert is_verified("e2e_tv_fused", got)[0] and not is_verified("gdn_replay_triton", got)[0]
    committed = load_records(verified._PKG / "verified_kernels.json")
    assert set(committed) <= set(KERNELS)
    (tmp_path / "bad.json").write_text(json.dumps([1]))
    with pytest.raises(ValueError, match="not a verified-kernel records file"):
        load_records(tmp_path / "bad.json")


def test_kernel_choices_line() -> None:
    from specopd_kernels.choices import kernel_choices

    assert kernel_choices("cpu") == ("cpu: tree_attention=torch (default=torch), sparse_attention=torch "
                                     "(default=torch), gdn_replay=torch (default=torch), e2e_tv=torch (default=torch)")
    line = kernel_choices("cuda")
    assert line.startswith("cuda: tree_attention=torch (default verified: tree_attention_triton: no GPU record; "
                           "tree_attention_flashinfer: no GPU record)") and "e2e_tv=torch" in line
