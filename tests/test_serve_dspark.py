"""DSpark drafters (``DSparkDraftModel``) served under SPECOPD_DSPARK: SGLang's DSPARK worker plus the plugin's
traces and hot swap (``sglang_specopd.server.algorithm.dspark``), on the CPU engine (CPU adaptation 16).

Two servers, one at a time: the plain one (conftest's ``tiny_plain_outputs``: greedy reference outputs, stopped
before the next starts), then the DSpark server, launched the way ``specopd serve`` launches a config with
``speculative_algorithm: SPECOPD`` and a DSpark drafter (``launch_spec``: ``--speculative-algorithm SPECOPD_DSPARK
--speculative-dspark-block-size 3``), with an admin key and a live-traffic spool, on the same tiny fp32 target.
The drafter is a block-4 (gamma 3) DSpark drafter made by ``init_drafter(arch="dspark")`` whose Markov head is
switched on (``markov_w2`` ~ N(0, 1); fresh it is zero). Checked on it:

* greedy output ids equal the plain server's (lossless), SGLang's per-request statistics show the speculative path
  ran (``spec_verify_ct`` verify steps, fewer than the tokens, ``spec_correct_drafts_histogram`` summing to them,
  drafts accepted on at least one prompt: the target is ``make_accepting_target``'s), and the requested traces obey
  every invariant of ``test_serve_tiny.check_trace`` (one record per verify step, anchors chained by accepted + 1,
  accepted drafts are the output's next tokens, SGLang's counters and histogram equal the trace's);
* parity at T = 0: the trainer's :class:`~specopd_trainer.drafters.dspark.DSparkDrafter`, walking the same greedy
  sequence block by block (``propose`` at each verify anchor, accept the matching prefix, move on by accepted + 1),
  reproduces every trace record (anchor, proposed block, accepted count) and so SGLang's ``spec_verify_ct`` and
  histogram, and the Markov head changes at least one of its greedy proposals (so the parity exercises it);
* temperature 1 (SGLang's Markov-head sampler, verified by ``accept_sampling`` with CPU adaptation 8's chain
  sampler): traced requests complete with every trace invariant, and the drawn blocks follow the trainer's q on
  the same prefix (the goodness-of-fit z of ``_q_parity`` over every traced slot);
* hot swap: a DSpark drafter of another seed is accepted (greedy output unchanged, every trace record now the new
  drafter's walk and tagged with its version, the proposals differ from the first drafter's), a drafter with another
  Markov rank or a DFlash drafter is refused with 400 and a reason and serving (version, proposals) is unchanged,
  and swapping the first drafter back gives its proposals again;
* the live-traffic spool keeps each finished request with the trace its reply carried;
* ``score_trees`` and Draft-OPD against this server: the context features it returns reproduce every greedy
  proposal the server traced (the trainer's drafter on them), its target rows agree with every verify decision,
  and a Draft-OPD step on the error anchors trains the Markov head (SpecOPD against a DSpark server:
  ``tests/test_drafter_archs_script.py``).

Without a server: the ``_handle_dspark`` hook, and ``specopd serve``'s algorithm / drafter / launch-flag handling.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import types
from pathlib import Path
from typing import Dict, List

import httpx
import pytest
import torch

from conftest import TINY_BLOCK_SIZE, TINY_NEW_TOKENS, TINY_PROMPTS, running_server, tiny_launch_spec
from support.serving import check_trace

GAMMA = TINY_BLOCK_SIZE - 1
MARKOV_RANK = 8
ADMIN_KEY = "test-admin-dspark"
SPOOL_MB = 1
TRACE_KEY = "specopd_trace"
server = pytest.mark.server


def _dspark_drafter(target: Path, out: Path, seed: int = 0, markov_rank: int = MARKOV_RANK,
                    markov_scale: float = 1.0) -> Path:
    """A block-4, 2-layer DSpark drafter for ``target`` with its Markov head on: ``markov_w2`` ~ N(0, s^2),
    s = ``markov_scale``."""
    from safetensors.torch import load_file

    from sglang_specopd.wire.drafters.init import init_drafter, save_drafter

    spec = init_drafter(target, out, block_size=TINY_BLOCK_SIZE, num_layers=2, seed=seed, arch="dspark",
                        options={"markov_rank": markov_rank})
    tensors = load_file(str(out / "model.safetensors"))
    w2 = "markov_head.markov_w2.weight"
    assert not tensors[w2].any(), "a fresh DSpark drafter has markov_w2 = 0"
    tensors[w2] = markov_scale * torch.randn(tensors[w2].shape, generator=torch.Generator().manual_seed(seed + 5))
    save_drafter(spec, {n: t.contiguous() for n, t in tensors.items()}, out, overwrite=True)
    return out


@dataclasses.dataclass
class DSparkServer:
    srv: object
    target: Path
    drafter: Path  # the one it starts with
    other: Path  # same spec, another seed: a drop-in
    narrow: Path  # markov_rank 4: refused
    dflash: Path  # another architecture: refused
    reference: Dict[str, List[int]]

    @property
    def url(self) -> str:
        return self.srv.url

    @property
    def admin(self) -> Dict[str, str]:
        return {"Authorization": f"Bearer {ADMIN_KEY}"}

    def swap(self, body: bytes) -> httpx.Response:
        from sglang_specopd.wire.protocol import SWAP_DRAFTER_PATH

        return httpx.post(self.url + SWAP_DRAFTER_PATH, content=body, timeout=120, headers=self.admin)

    def info(self) -> dict:
        from sglang_specopd.wire.protocol import DRAFTER_INFO_PATH

        r = httpx.get(self.url + DRAFTER_INFO_PATH, timeout=60)
        assert r.status_code == 200, r.text
        return r.json()

    def serve(self, drafter: Path, version: str) -> None:
        r = self.swap(json.dumps({"path": str(drafter), "version": version}).encode())
        assert r.status_code == 200, r.text[:500]
        assert self.info()["version"] == version

    def traced(self, prompt: str, n: int = TINY_NEW_TOKENS, **sampling) -> dict:
        httpx.post(self.url + "/flush_cache", headers=self.admin, timeout=60)
        return self.srv.generate(prompt, n, trace=True, **sampling)


@pytest.fixture(scope="module")
def dspark_server(tiny_plain_outputs, tiny_serving_target: Path, tmp_path_factory) -> DSparkServer:
    """Plain reference outputs (conftest's: that server stopped), then the DSpark server as ``specopd serve``
    launches ``speculative_algorithm: SPECOPD`` with a DSpark drafter (admin key, live-traffic spool)."""
    from sglang_specopd.app.config import ServeConfig
    from sglang_specopd.app.launch.process import free_port
    from sglang_specopd.app.serve.spec import launch_spec
    from sglang_specopd.wire.drafters.init import init_drafter

    root = tmp_path_factory.mktemp("dspark")
    target = tiny_serving_target
    drafter = _dspark_drafter(target, root / "ds")
    other = _dspark_drafter(target, root / "ds-seed1", seed=1)
    narrow = _dspark_drafter(target, root / "ds-rank4", seed=2, markov_rank=4)
    dflash = root / "dflash"
    init_drafter(target, dflash, block_size=TINY_BLOCK_SIZE, num_layers=2)
    cfg = ServeConfig(name="tiny-dspark", target=str(target), drafter=str(drafter), block_size=TINY_BLOCK_SIZE,
                      device="cpu", dtype="float32", attention_backend="torch_native", max_total_tokens=4096,
                      disable_cuda_graph=True, disable_overlap_schedule=True, sleep_on_idle=True,
                      speculative_algorithm="SPECOPD", traffic_spool_mb=SPOOL_MB)
    spec = launch_spec(cfg, port=free_port(), admin_api_key=ADMIN_KEY)
    argv = " ".join(spec.argv())
    assert spec.speculative_algorithm == "SPECOPD_DSPARK"
    assert f"--speculative-algorithm SPECOPD_DSPARK --speculative-draft-model-path {drafter}" in argv, argv
    assert f"--speculative-dspark-block-size {GAMMA}" in argv and "--speculative-dflash-block-size" not in argv
    # otherwise exactly the tiny SPECOPD servers' launch (tests/conftest.py)
    assert dataclasses.replace(spec, speculative_algorithm="SPECOPD", admin_api_key=None, traffic_spool_mb=0,
                               model_path=str(target), served_model_name=None) == tiny_launch_spec(target, spec.port, drafter)
    with running_server(spec, root, "dspark") as srv:
        yield DSparkServer(srv, target, drafter, other, narrow, dflash,
                           {p: tiny_plain_outputs[p] for p in TINY_PROMPTS})


def _check_stats(meta: dict, n_tokens: int) -> None:
    """SGLang's per-request speculative statistics are there and consistent with ``n_tokens`` generated tokens."""
    steps, hist = meta["spec_verify_ct"], meta["spec_correct_drafts_histogram"]
    assert 0 < steps < n_tokens, meta
    assert 0 < len(hist) <= GAMMA + 1 and sum(hist) == steps, meta  # SGLang stops at the longest seen
    assert meta["spec_num_proposed_drafts"] == GAMMA * steps, meta
    assert meta["spec_num_correct_drafts"] == sum(k * c for k, c in enumerate(hist)), meta
    # every verify step commits its accepted drafts + 1 token; the last may run past max_new_tokens
    assert 1 + steps + meta["spec_num_correct_drafts"] >= n_tokens, meta


def _records(resp: dict) -> list:
    """The trace as (anchor, proposed, accepted) tuples."""
    return [(r["anchor"], r["proposed"], r["accepted"]) for r in resp["meta_info"][TRACE_KEY]]


# ---------------------------------------------------------------------------------------------------------------
# Serving: lossless greedy, traces, acceptance statistics, trainer parity, T = 1
# ---------------------------------------------------------------------------------------------------------------


@server
def test_dspark_greedy_is_lossless_with_traces(dspark_server: DSparkServer) -> None:
    info = dspark_server.info()
    assert info["arch"] == "dspark" and info["spec"]["markov_rank"] == MARKOV_RANK, info
    dspark_server.serve(dspark_server.drafter, "ds-initial")
    accepted, records = {}, []
    for prompt in TINY_PROMPTS:
        resp = dspark_server.traced(prompt)
        assert resp["output_ids"] == dspark_server.reference[prompt], prompt
        _check_stats(resp["meta_info"], TINY_NEW_TOKENS)
        trace = check_trace(resp, TINY_BLOCK_SIZE, TINY_NEW_TOKENS)
        assert {r["drafter_version"] for r in trace} == {"ds-initial"}
        assert resp["meta_info"]["specopd_drafter_versions"] == ["ds-initial"]
        records += trace
        accepted[prompt] = resp["meta_info"]["spec_num_correct_drafts"]
        untraced = dspark_server.srv.generate(prompt, TINY_NEW_TOKENS)
        assert untraced["output_ids"] == resp["output_ids"] and not untraced["meta_info"].get(TRACE_KEY)
        assert untraced["meta_info"]["spec_verify_ct"] == len(trace)
    assert max(accepted.values()) > 0, f"no prompt accepted a draft: {accepted}"
    assert any(r["accepted"] > 0 for r in records) and any(r["accepted"] < GAMMA for r in records)


def _walk(drafter, feats: torch.Tensor, seq: List[int], start: int, n_tokens: int) -> list:
    """Greedy speculative decoding of ``seq`` from ``start`` (the first generated token, emitted by prefill, is
    the first anchor) with ``drafter``: one (anchor, proposed block, accepted drafts) per verify step."""
    anchor, emitted, steps = start, 1, []
    while emitted < n_tokens:
        proposed = drafter.propose(feats[:anchor], seq[anchor], anchor).tolist()
        k = 0
        while k < GAMMA and proposed[k] == seq[anchor + 1 + k]:
            k += 1
        steps.append((anchor, proposed, k))
        anchor += k + 1
        emitted += k + 1
    return steps


class _Walker:
    """The trainer's view of the target and a drafter directory: its greedy walk over a served sequence."""

    def __init__(self, target: Path):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.target = target
        self.tok = AutoTokenizer.from_pretrained(target)
        self.model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()

    def drafter(self, path: Path):
        from specopd_trainer.drafters.dspark import DSparkDrafter

        return DSparkDrafter.from_pretrained(path, self.target).eval()

    def walk(self, drafter, prompt: str, output_ids: List[int], n_tokens: int) -> list:
        from specopd_trainer.drafters.features import hf_context_features

        prompt_ids = self.tok(prompt)["input_ids"]
        seq = prompt_ids + list(output_ids)
        with torch.no_grad():  # the last verify step may check drafts past max_new_tokens: the target's continuation
            for _ in range(GAMMA):
                seq.append(int(self.model(torch.tensor([seq])).logits[0, -1].argmax()))
            feats = hf_context_features(self.model, torch.tensor(seq), drafter.spec.target_layer_ids)
            return _walk(drafter, feats, seq, len(prompt_ids), n_tokens)


@pytest.fixture(scope="module")
def walker(dspark_server: DSparkServer) -> _Walker:
    return _Walker(dspark_server.target)


@server
def test_dspark_traces_equal_trainer_walk(dspark_server: DSparkServer, walker: _Walker) -> None:
    """Every traced verify step (anchor, proposed block, accepted count) is the trainer's greedy DSpark walk's, so
    SGLang's verify count and acceptance histogram are reproduced too."""
    import copy

    dspark_server.serve(dspark_server.drafter, "ds-parity")
    drafter = walker.drafter(dspark_server.drafter)
    no_markov = copy.deepcopy(drafter)
    with torch.no_grad():
        no_markov.get_parameter("markov_head.markov_w2.weight").zero_()
    markov_mattered = checked = 0
    for prompt in TINY_PROMPTS:
        resp = dspark_server.traced(prompt)
        steps = walker.walk(drafter, prompt, resp["output_ids"], TINY_NEW_TOKENS)
        assert _records(resp) == steps, prompt
        meta = resp["meta_info"]
        served = meta["spec_correct_drafts_histogram"]
        hist = [sum(1 for _, _, k in steps if k == j) for j in range(GAMMA + 1)]
        assert (len(steps), hist) == (meta["spec_verify_ct"], served + [0] * (GAMMA + 1 - len(served))), meta
        plain = walker.walk(no_markov, prompt, resp["output_ids"], TINY_NEW_TOKENS)
        markov_mattered += sum(a[1] != b[1] for a, b in zip(steps, plain))
        checked += len(steps)
    assert checked >= 16
    assert markov_mattered, "the Markov head never changed a greedy proposal: the parity does not exercise it"


@server
def test_dspark_score_trees_replay_and_a_draft_opd_step(dspark_server: DSparkServer, walker: _Walker) -> None:
    """``score_trees`` on the DSpark server, checked against what that server did: Draft-OPD's live rollouts at
    T = 0 (traced, every record tagged with the served version), their recorded blocks scored in one call; the
    trainer's DSpark drafter on the returned context features proposes exactly the block the server proposed at
    every recorded anchor, and the target rows agree with every verify decision (argmax p equals the proposal on
    accepted slots and differs from it at the first rejected one). Then one Draft-OPD step on the error anchors
    (one more ``score_trees`` call): a finite positive loss whose gradient reaches the Markov head."""
    from _replay_checks import replay_served_blocks
    from specopd_trainer.algorithms.draft_opd.replay import draft_opd_step, select_blocks
    from specopd_trainer.client.http import SpecOPDClient

    dspark_server.serve(dspark_server.drafter, "ds-draft-opd")
    drafter = walker.drafter(dspark_server.drafter)
    layers = list(drafter.spec.target_layer_ids)
    prompts = [walker.tok(p)["input_ids"] for p in TINY_PROMPTS]
    with SpecOPDClient(dspark_server.url, admin_api_key=ADMIN_KEY) as client:
        rollouts, checked = replay_served_blocks(client, drafter, prompts, block_size=TINY_BLOCK_SIZE,
                                                 new_tokens=TINY_NEW_TOKENS, version="ds-draft-opd")
        assert checked >= 16
        selected = select_blocks(rollouts, GAMMA, "error", 64, torch.Generator().manual_seed(0))
        assert selected, "a random drafter must have rejected slots"
        loss, m = draft_opd_step(drafter, client, selected, layers, head_dtype="float32")
        loss.backward()
    assert torch.isfinite(loss) and loss.item() > 0 and m["rejected_tokens"] > 0 and m["accepted_tokens"] >= 0
    grad = drafter.get_parameter("markov_head.markov_w2.weight").grad
    assert grad is not None and grad.abs().sum() > 0


@server
def test_dspark_temperature_one_traces(dspark_server: DSparkServer) -> None:
    """T = 1: the Markov-head sampler drafts, ``accept_sampling`` verifies; every trace invariant holds."""
    dspark_server.serve(dspark_server.drafter, "ds-initial")
    proposals = set()
    for prompt in TINY_PROMPTS[:2]:
        resp = dspark_server.traced(prompt, 24, temperature=1.0)
        assert len(resp["output_ids"]) == 24, resp
        _check_stats(resp["meta_info"], 24)
        trace = check_trace(resp, TINY_BLOCK_SIZE, 24)
        proposals |= {t for r in trace for t in r["proposed"]}
    assert len(proposals) > 1, "sampled drafts should not all be one token"


@server
def test_dspark_served_q_at_t1_is_the_trainers(dspark_server: DSparkServer, walker: _Walker, tmp_path: Path) -> None:
    """T = 1: the blocks the server draws follow the trainer's q on the same prefix (Markov head included): the
    goodness-of-fit z of :mod:`_q_parity` over every traced slot is within 4.5 of 0, while the same drafts scored
    under q at T = 0.5 or under another seed's drafter are far off (the statistic has power)."""
    from _q_parity import sampled_fit

    # a peaked q (Markov bias x8): near-uniform draws over the vocabulary would leave the check without power
    peaked = _dspark_drafter(dspark_server.target, tmp_path / "peaked", seed=3, markov_scale=8.0)
    dspark_server.serve(peaked, "ds-q")
    drafter = walker.drafter(peaked)
    other = walker.drafter(_dspark_drafter(dspark_server.target, tmp_path / "peaked-other", seed=4, markov_scale=8.0))
    z, n, z_tempered, z_wrong = sampled_fit(dspark_server.traced, walker.tok, walker.model, drafter, other,
                                            TINY_PROMPTS)
    assert n >= 400, n
    assert abs(z) < 4.5, (z, n, z_tempered, z_wrong)
    assert abs(z_tempered) > 6 and abs(z_wrong) > 6, (z, z_tempered, z_wrong)


# ---------------------------------------------------------------------------------------------------------------
# Hot swap, validated per architecture
# ---------------------------------------------------------------------------------------------------------------


def _load(path: Path):
    from safetensors.torch import load_file

    return json.loads((path / "config.json").read_text()), load_file(str(path / "model.safetensors"))


@server
def test_dspark_swap_follows_new_weights_and_refuses_other_specs(dspark_server: DSparkServer,
                                                                 walker: _Walker) -> None:
    from sglang_specopd.wire.protocol import swap_payload

    srv, prompts = dspark_server, TINY_PROMPTS[:2]
    srv.serve(srv.drafter, "ds-before")
    before = {p: srv.traced(p) for p in prompts}
    new = walker.drafter(srv.other)
    srv.serve(srv.other, "ds-seed1")  # a DSpark drop-in of another seed: accepted
    swapped = {}
    for p in prompts:
        resp = swapped[p] = srv.traced(p)
        assert resp["output_ids"] == srv.reference[p], p
        assert {r["drafter_version"] for r in resp["meta_info"][TRACE_KEY]} == {"ds-seed1"}
        assert resp["meta_info"]["specopd_drafter_versions"] == ["ds-seed1"]
        assert _records(resp) == walker.walk(new, p, resp["output_ids"], TINY_NEW_TOKENS), p
    differs = 0
    for p in prompts:  # at the anchors both walks visit (the first one at least: the prompt's end)
        old_blocks = {a: block for a, block, _ in _records(before[p])}
        shared = [(old_blocks[a], block) for a, block, _ in _records(swapped[p]) if a in old_blocks]
        assert shared, p
        differs += sum(a != b for a, b in shared)
    assert differs, "the swapped-in drafter proposed what the first one did"

    cases = {
        "markov-rank": (json.dumps({"path": str(srv.narrow), "version": "x"}).encode(), ["differs", "markov_rank"]),
        "markov-rank-binary": (swap_payload(*_load(srv.narrow), "x"), ["differs", "markov_rank"]),
        "dflash": (json.dumps({"path": str(srv.dflash), "version": "x"}).encode(),
                   ["DFlashDraftModel", "dspark", "cannot change the drafter architecture"]),
    }
    info = srv.info()
    for name, (body, words) in cases.items():
        r = srv.swap(body)
        assert r.status_code == 400, (name, r.status_code, r.text[:300])
        assert all(w in r.text for w in words), (name, r.text[:500])
        assert srv.info() == info, name
    after = srv.traced(prompts[0])
    assert after["output_ids"] == srv.reference[prompts[0]]
    assert _records(after) == _records(swapped[prompts[0]]), "a refused swap changed the serving drafter"

    srv.serve(srv.drafter, "ds-back")  # the first drafter again: its proposals again
    for p in prompts:
        assert _records(srv.traced(p)) == _records(before[p]), p


# ---------------------------------------------------------------------------------------------------------------
# Live traffic
# ---------------------------------------------------------------------------------------------------------------


@server
def test_dspark_traffic_spool_keeps_the_served_traces(dspark_server: DSparkServer) -> None:
    from sglang_specopd.wire.traffic import TRAFFIC_PATH

    srv = dspark_server
    srv.serve(srv.drafter, "ds-traffic")
    traced = srv.traced(TINY_PROMPTS[2], 16)
    untraced = srv.srv.generate(TINY_PROMPTS[3], 16)
    r = httpx.get(srv.url + TRAFFIC_PATH + "?after=0&max_items=4096", headers=srv.admin, timeout=60)
    assert r.status_code == 200, r.text[:300]
    items = r.json()["items"]
    assert len(items) >= 2
    for item, resp in zip(items[-2:], (traced, untraced)):
        meta = resp["meta_info"]
        assert item["prompt_len"] == meta["prompt_tokens"]
        assert item["input_ids"][item["prompt_len"]:] == resp["output_ids"]
        assert len(item["trace"]) == meta["spec_verify_ct"]
        assert {rec["drafter_version"] for rec in item["trace"]} == {"ds-traffic"}
        assert item["trace"][0]["anchor"] == item["prompt_len"]
    assert items[-2]["trace"] == traced["meta_info"][TRACE_KEY]
    assert sum(rec["accepted"] for rec in items[-1]["trace"]) == untraced["meta_info"]["spec_num_correct_drafts"]


# ---------------------------------------------------------------------------------------------------------------
# No server: the argument-resolution hook and `specopd serve`
# ---------------------------------------------------------------------------------------------------------------


def test_handle_dspark_hook_answers_cuda_only_on_cpu() -> None:
    """On CPU, ``_handle_dspark`` runs with its resolving view reading ``device`` as ``"cuda"`` (restored after,
    also when it raises) and the overlap schedule declared off; any other device passes through untouched."""
    import sglang.srt.arg_groups.speculative_hook as sh

    from sglang_specopd.server.cpu.dspark import handle_dspark_on_cpu

    source = inspect.getsource(sh._handle_dspark)
    assert source.count("cfg.device") == 2 and "only supports CUDA, NPU or XPU" in source, \
        "SGLang's _handle_dspark reads the device elsewhere too: re-check the hook"
    real = sh.resolving_view
    seen = {}

    def original(server_args):
        seen[server_args.device] = (sh.resolving_view(server_args).device, sh.resolving_view is real)
        if server_args.device == "cpu" and seen.get("raise"):
            raise RuntimeError("boom")
        return "done"

    def args(device):
        return types.SimpleNamespace(device=device, disable_overlap_schedule=False, _resolved_overrides=[])

    cpu = args("cpu")
    handle_dspark_on_cpu(original, cpu)
    assert seen["cpu"] == ("cuda", False) and sh.resolving_view is real
    assert real(cpu).disable_overlap_schedule is True and real(cpu).device == "cpu"
    seen["raise"] = True
    with pytest.raises(RuntimeError, match="boom"):
        handle_dspark_on_cpu(original, args("cpu"))
    assert sh.resolving_view is real
    gpu = args("cuda:0")
    assert handle_dspark_on_cpu(original, gpu) == "done"
    assert seen["cuda:0"] == ("cuda:0", True) and gpu._resolved_overrides == []


def test_fused_kv_write_is_off_on_cpu() -> None:
    """With its weights on the CPU a DSpark drafter gets no fused K/V-write bundle (SGLang's bf16-only Triton
    kernel, "0 active drivers" on a CPU machine: it crashed the bf16 SmolLM2 DSpark server), so SGLang's
    ``write_target_hidden_kv`` takes its per-layer torch path; weights elsewhere get SGLang's own bundle."""
    import sglang.srt.models.dspark as dspark_model

    from sglang_specopd.server.cpu.dspark import no_fused_kv_write_on_cpu

    source = inspect.getsource(dspark_model.DSparkDraftMixin.write_target_hidden_kv)
    assert "bundle = self._fused_kv_write_bundle(pool)" in source and "if bundle is not None:" in source
    calls = []

    def original(self, pool):
        calls.append(pool)
        return "bundle"

    cpu = torch.nn.Linear(2, 2, dtype=torch.bfloat16)
    assert no_fused_kv_write_on_cpu(original, cpu, "pool") is None and calls == []
    elsewhere = torch.nn.Linear(2, 2, device="meta")
    assert no_fused_kv_write_on_cpu(original, elsewhere, "pool") == "bundle" and calls == ["pool"]


def test_serve_picks_specopd_dspark_for_a_dspark_drafter(tiny_serving_target: Path, tmp_path: Path) -> None:
    """``specopd serve``: ``speculative_algorithm: SPECOPD`` with a DSpark drafter launches SPECOPD_DSPARK (so does
    naming it), DSPARK launches SGLang's own worker, both with DSPARK's gamma flag; DFLASH with a DSpark drafter,
    and SPECOPD_DSPARK or DSPARK with a DFlash drafter, are refused before launch, naming what serves it."""
    from sglang_specopd.app.config import ServeConfig
    from sglang_specopd.app.launch.process import free_port
    from sglang_specopd.app.serve.choice import DrafterInvalidError, resolve_drafter, serving_algorithm
    from sglang_specopd.app.serve.spec import launch_spec
    from sglang_specopd.wire.drafters.init import init_drafter

    ds = _dspark_drafter(tiny_serving_target, tmp_path / "ds")
    dflash = tmp_path / "dflash"
    init_drafter(tiny_serving_target, dflash, block_size=TINY_BLOCK_SIZE, num_layers=2)
    cfg = ServeConfig(name="tiny-dspark", target=str(tiny_serving_target), drafter=str(ds),
                      block_size=TINY_BLOCK_SIZE, device="cpu", dtype="float32")
    assert cfg.speculative_algorithm == "SPECOPD"
    for asked, launched in (("SPECOPD", "SPECOPD_DSPARK"), ("SPECOPD_DSPARK", "SPECOPD_DSPARK"),
                            ("DSPARK", "DSPARK")):
        c = cfg.model_copy(update={"speculative_algorithm": asked})
        assert resolve_drafter(c, tiny_serving_target) == ds
        spec = launch_spec(c, port=free_port())
        argv = " ".join(spec.argv())
        assert spec.speculative_algorithm == launched, asked
        for flag in (f"--speculative-algorithm {launched} --speculative-draft-model-path {ds}",
                     f"--speculative-dspark-block-size {GAMMA}", "--speculative-draft-attention-backend torch_native"):
            assert flag in argv, (asked, flag, argv)
        assert "--speculative-dflash-block-size" not in argv
    assert serving_algorithm(dflash, "SPECOPD") == "SPECOPD" and serving_algorithm(dflash, "dflash") == "DFLASH"
    with pytest.raises(DrafterInvalidError, match="DSPARK worker.*DFLASH serves DFLASH drafters only.*"
                                                  "SPECOPD \\(the plugin's SPECOPD_DSPARK worker.* or DSPARK"):
        resolve_drafter(cfg.model_copy(update={"speculative_algorithm": "DFLASH"}), tiny_serving_target)
    for algorithm in ("SPECOPD_DSPARK", "DSPARK"):
        with pytest.raises(DrafterInvalidError, match=f"DFLASH worker.*{algorithm} serves DSPARK drafters only.*"
                                                      "SPECOPD \\(the plugin's SPECOPD worker.* or DFLASH"):
            resolve_drafter(cfg.model_copy(update={"drafter": str(dflash), "speculative_algorithm": algorithm}),
                            tiny_serving_target)
    assert json.loads((ds / "config.json").read_text())["dflash_config"]["block_size"] == GAMMA
