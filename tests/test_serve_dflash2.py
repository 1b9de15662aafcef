"""DFlash V2 (``DFlash2DraftModel``) served under SPECOPD on the CPU engine, on a tiny fp32 target.

Two servers, one at a time: a plain one (greedy reference outputs, stopped before the next starts: conftest's
``tiny_plain_outputs``, the same plain server and prompts as ``test_serve_tiny.py``), then one SPECOPD server
with a V2 drafter made by ``specopd drafter init --arch dflash2`` (``init_drafter``), its candidate selector and
convs switched on (non-zero successor codebook and kernel projections). Checked on it:

* greedy output ids equal the plain server's (lossless), with acceptance > 0 (the serving target is
  ``make_accepting_target``'s), and the traces obey every invariant of ``test_serve_tiny.check_trace``;
* at temperature 1 (SGLang's selector walk, q over each slot's top-K candidates, verified by ``accept_sampling``
  with that q scattered into the vocabulary) the traces are consistent too, every drawn token is among the
  trainer's candidates of its slot and the draws follow the trainer's q (the goodness-of-fit z of
  ``_q_parity`` over every traced slot);
* hot swap per architecture: a V2 drafter of the same spec is accepted (greedy output unchanged, proposals
  changed); a DFlash drafter, or a V2 config without its selector keys, is refused with 400 and a reason, and
  serving (version, proposals) is unchanged after;
* parity at T = 0: the trainer's :class:`~specopd_trainer.drafters.dflash2.DFlash2Drafter` proposes the server's
  blocks at every traced anchor, by its serving forward (``propose``) and by the training forward
  (``slot_q(...).greedy()``), for the initial and the swapped-in drafter.

Without a server: the CPU lattice (:mod:`sglang_specopd.server.cpu.dflash2`) equals the trainer's selector scores,
and SGLang's ``CandidateSelector.sample_path`` + dense q + the CPU chain verifier is lossless (first emitted token
~ p, draws ~ the q handed to verification).
"""

from __future__ import annotations

import dataclasses
import json
import socket
from pathlib import Path
from typing import Dict, List

import httpx
import pytest
import torch

from conftest import TINY_BLOCK_SIZE, TINY_NEW_TOKENS, TINY_PROMPTS, running_server, tiny_launch_spec
from sglang_specopd.wire.protocol import DRAFTER_INFO_PATH, SWAP_DRAFTER_PATH, swap_payload
from support.serving import check_trace

ADMIN_KEY = "test-admin-v2"
TOP_K, RANK = 4, 8
TRACE_KEY = "specopd_trace"
server = pytest.mark.server


def _port() -> int:
    """A free TCP port >= 33000 (the lower ephemeral ports are left to other jobs on shared machines)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port >= 33000:
            return port


def _v2_drafter(target: Path, out: Path, *, strong: bool, seed: int) -> Path:
    """A block-4, 2-layer V2 drafter for ``target`` (``init_drafter(arch="dflash2")``) with the selector and the
    convs on: successor codebook N(0, 1), kernel projections N(0, 0.05). ``strong``: every other matrix x10 too
    (proposals depend on the context; otherwise the residual stream keeps proposing the mask token)."""
    from sglang_specopd.wire.drafters.init import init_drafter, save_drafter

    spec = init_drafter(target, out, block_size=TINY_BLOCK_SIZE, num_layers=2, seed=seed, arch="dflash2",
                        options={"selector_top_k": TOP_K, "selector_rank": RANK})
    from safetensors.torch import load_file

    g = torch.Generator().manual_seed(seed + 100)
    tensors = load_file(str(out / "model.safetensors"))
    for name, t in tensors.items():
        if name.endswith("successor_codebook") or name.endswith("predecessor_codebook"):
            tensors[name] = torch.randn(t.shape, generator=g)
        elif "kernel_projection" in name:
            tensors[name] = 0.05 * torch.randn(t.shape, generator=g)
        elif strong and t.ndim == 2 and "base_kernel" not in name:
            tensors[name] = t * 10
    save_drafter(spec, {n: t.contiguous() for n, t in tensors.items()}, out, overwrite=True)
    return out


@dataclasses.dataclass
class V2Server:
    srv: object
    target: Path
    drafter: Path
    strong: Path
    dflash: Path
    reference: Dict[str, List[int]]

    @property
    def url(self) -> str:
        return self.srv.url

    def swap(self, body: bytes) -> httpx.Response:
        return httpx.post(self.url + SWAP_DRAFTER_PATH, content=body, timeout=120,
                          headers={"Authorization": f"Bearer {ADMIN_KEY}"})

    def info(self) -> dict:
        r = httpx.get(self.url + DRAFTER_INFO_PATH, timeout=60)
        assert r.status_code == 200, r.text
        return r.json()

    def serve(self, drafter: Path, version: str) -> None:
        r = self.swap(json.dumps({"path": str(drafter), "version": version}).encode())
        assert r.status_code == 200, r.text[:500]
        assert self.info()["version"] == version

    def traced(self, prompt: str, n: int = TINY_NEW_TOKENS, **sampling) -> dict:
        httpx.post(self.url + "/flush_cache", headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=60)
        return self.srv.generate(prompt, n, trace=True, **sampling)


@pytest.fixture(scope="module")
def v2_server(tiny_plain_outputs, tiny_serving_target: Path, tiny_drafter: Path, tmp_path_factory) -> V2Server:
    """Plain reference outputs (conftest's: that server stopped), then the SPECOPD server with the V2 drafter
    (admin key)."""
    root = tmp_path_factory.mktemp("v2")
    drafter = _v2_drafter(tiny_serving_target, root / "v2", strong=False, seed=0)
    strong = _v2_drafter(tiny_serving_target, root / "v2-strong", strong=True, seed=7)
    reference = {p: tiny_plain_outputs[p] for p in TINY_PROMPTS}
    spec = dataclasses.replace(tiny_launch_spec(tiny_serving_target, _port(), drafter), admin_api_key=ADMIN_KEY)
    with running_server(spec, root, "v2-specopd") as srv:
        yield V2Server(srv, tiny_serving_target, drafter, strong, tiny_drafter, reference)


# ---------------------------------------------------------------------------------------------------------------
# Serving: lossless, traces, acceptance statistics
# ---------------------------------------------------------------------------------------------------------------


@server
def test_v2_greedy_is_lossless_with_traces(v2_server: V2Server) -> None:
    info = v2_server.info()
    assert info["arch"] == "dflash2" and info["spec"]["selector_top_k"] == TOP_K, info
    v2_server.serve(v2_server.drafter, "v2-initial")
    accept, records = {}, []
    for prompt in TINY_PROMPTS:
        resp = v2_server.traced(prompt)
        assert resp["output_ids"] == v2_server.reference[prompt], prompt
        records += check_trace(resp, TINY_BLOCK_SIZE, TINY_NEW_TOKENS)
        accept[prompt] = resp["meta_info"]["spec_accept_length"]
        untraced = v2_server.srv.generate(prompt, TINY_NEW_TOKENS)
        assert untraced["output_ids"] == resp["output_ids"] and not untraced["meta_info"].get(TRACE_KEY)
    assert max(accept.values()) > 1.5, f"no prompt accepted drafts: {accept}"
    assert any(r["accepted"] > 0 for r in records) and any(r["accepted"] == 0 for r in records)


@server
def test_v2_sampled_drafts_at_temperature_one(v2_server: V2Server) -> None:
    """T = 1: SGLang's selector walk drafts (q over the top-K candidates); every trace invariant holds."""
    v2_server.serve(v2_server.drafter, "v2-initial")
    proposals = set()
    for prompt in TINY_PROMPTS[:2]:
        resp = v2_server.traced(prompt, 24, temperature=1.0)
        trace = check_trace(resp, TINY_BLOCK_SIZE, 24)
        proposals |= {t for r in trace for t in r["proposed"]}
        assert resp["meta_info"]["spec_verify_ct"] == len(trace)
    assert len(proposals) > 1, "sampled drafts should not all be one token"


# ---------------------------------------------------------------------------------------------------------------
# Hot swap, validated per architecture
# ---------------------------------------------------------------------------------------------------------------


def _load(path: Path):
    from safetensors.torch import load_file

    return json.loads((path / "config.json").read_text()), load_file(str(path / "model.safetensors"))


@server
def test_v2_swap_accepted_and_cross_architecture_refused(v2_server: V2Server) -> None:
    v2_server.serve(v2_server.drafter, "v2-initial")
    prompt = TINY_PROMPTS[0]
    initial = v2_server.traced(prompt)
    v2_server.serve(v2_server.strong, "v2-strong")  # a V2 drop-in: accepted
    strong = v2_server.traced(prompt)
    assert strong["output_ids"] == initial["output_ids"] == v2_server.reference[prompt]
    assert [r["proposed"] for r in strong["meta_info"][TRACE_KEY]] != \
        [r["proposed"] for r in initial["meta_info"][TRACE_KEY]]
    assert {r["drafter_version"] for r in strong["meta_info"][TRACE_KEY]} == {"v2-strong"}

    cfg, tensors = _load(v2_server.strong)
    no_selector = json.loads(json.dumps(cfg))
    del no_selector["dflash_config"]["selector_rank"], no_selector["dflash_config"]["selector_top_k"]
    cases = {
        "dflash": (json.dumps({"path": str(v2_server.dflash), "version": "x"}).encode(),
                   ["DFlashDraftModel", "dflash2", "cannot change the drafter architecture"]),
        "dflash-binary": (swap_payload(*_load(v2_server.dflash), "x"), ["cannot change the drafter architecture"]),
        # refused by SGLang's own DFlash config parser (sglang_specopd.wire.drafters.layouts mirrors it)
        "no-selector-keys": (swap_payload(no_selector, tensors, "x"), ["selector_rank"]),
    }
    before = v2_server.info()
    for name, (body, words) in cases.items():
        r = v2_server.swap(body)
        assert r.status_code == 400, (name, r.status_code, r.text[:300])
        assert all(w in r.text for w in words), (name, r.text[:500])
        assert v2_server.info() == before, name
    after = v2_server.traced(prompt)
    assert after["output_ids"] == v2_server.reference[prompt]
    assert [r["proposed"] for r in after["meta_info"][TRACE_KEY]] == \
        [r["proposed"] for r in strong["meta_info"][TRACE_KEY]], "a refused swap changed the serving drafter"


def test_v2_check_refuses_missing_selector_keys(tiny_serving_target: Path, tmp_path: Path) -> None:
    from sglang_specopd.app.drafters.check import check_drafter

    d = _v2_drafter(tiny_serving_target, tmp_path / "v2", strong=False, seed=0)
    assert check_drafter(d, tiny_serving_target, "dflash2") == []
    cfg = json.loads((d / "config.json").read_text())
    del cfg["dflash_config"]["selector_top_k"]
    (d / "config.json").write_text(json.dumps(cfg))
    problems = check_drafter(d, tiny_serving_target)
    # SGLang's own parser (run by the check) refuses it first, naming the missing key's pair
    assert [p.code for p in problems] == ["sglang_refuses"], problems
    assert "top_k" in problems[0].message and "rank" in problems[0].message, problems


def test_serve_resolves_v2_under_specopd_and_a_dspark_drafter_under_specopd_dspark(tiny_serving_target: Path,
                                                                                   tmp_path: Path) -> None:
    """``specopd serve`` (``resolve_drafter`` / ``serving_algorithm``): a V2 drafter serves under SPECOPD (SGLang's
    DFLASH worker family); with a DSpark drafter the same config launches SPECOPD_DSPARK; naming SPECOPD_DSPARK for
    the V2 drafter is refused before launch, naming the worker it needs."""
    from sglang_specopd.app.config import ServeConfig
    from sglang_specopd.app.serve.choice import DrafterInvalidError, resolve_drafter, serving_algorithm
    from sglang_specopd.wire.drafters.init import init_drafter

    v2 = _v2_drafter(tiny_serving_target, tmp_path / "v2", strong=False, seed=0)
    ds = tmp_path / "ds"
    init_drafter(tiny_serving_target, ds, block_size=TINY_BLOCK_SIZE, num_layers=2, arch="dspark")
    cfg = ServeConfig(name="tiny-v2", target=str(tiny_serving_target), drafter=str(v2), block_size=TINY_BLOCK_SIZE,
                      device="cpu", dtype="float32", speculative_algorithm="SPECOPD")
    assert resolve_drafter(cfg, tiny_serving_target) == v2 and serving_algorithm(v2, "SPECOPD") == "SPECOPD"
    assert resolve_drafter(cfg.model_copy(update={"drafter": str(ds)}), tiny_serving_target) == ds
    assert serving_algorithm(ds, "SPECOPD") == "SPECOPD_DSPARK"
    with pytest.raises(DrafterInvalidError, match="DFlash2DraftModel.*DFLASH worker.*SPECOPD_DSPARK serves DSPARK"):
        resolve_drafter(cfg.model_copy(update={"speculative_algorithm": "SPECOPD_DSPARK"}), tiny_serving_target)


# ---------------------------------------------------------------------------------------------------------------
# Parity: the trainer proposes the server's blocks (T = 0)
# ---------------------------------------------------------------------------------------------------------------


@server
def test_v2_trainer_proposals_equal_server_proposals(v2_server: V2Server) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specopd_trainer.drafters.dflash2 import DFlash2Drafter
    from specopd_trainer.drafters.features import hf_context_features

    tok = AutoTokenizer.from_pretrained(v2_server.target)
    model = AutoModelForCausalLM.from_pretrained(v2_server.target, dtype=torch.float32).eval()
    checked, selector_mattered = 0, 0
    for drafter_dir, version in ((v2_server.drafter, "parity-initial"), (v2_server.strong, "parity-strong")):
        v2_server.serve(drafter_dir, version)
        drafter = DFlash2Drafter.from_pretrained(drafter_dir, v2_server.target).eval()
        for prompt in TINY_PROMPTS[:2]:
            resp = v2_server.traced(prompt, 16)
            seq = tok(prompt)["input_ids"] + resp["output_ids"]
            trace = resp["meta_info"][TRACE_KEY]
            feats = hf_context_features(model, torch.tensor(seq), drafter.spec.target_layer_ids)
            anchors = torch.tensor([r["anchor"] for r in trace])
            served = [r["proposed"] for r in trace]
            assert [drafter.propose(feats[:a], seq[a], a).tolist() for a in anchors.tolist()] == served, version
            with torch.no_grad():
                q = drafter.slot_q(feats, torch.tensor(seq), anchors)
                assert q.greedy().tolist() == served, version
                ids, unary = drafter.candidates(q.hidden)
                selector_mattered += int((ids.gather(-1, unary.argmax(-1, keepdim=True))[..., 0]
                                          != q.greedy()).any())
            checked += len(trace)
    assert checked >= 8
    assert selector_mattered, "the selector never changed a pick: the parity does not exercise it"


@server
def test_v2_score_trees_replay_and_a_draft_opd_step(v2_server: V2Server) -> None:
    """Draft-OPD against the V2 server (as ``test_serve_dspark`` does for DSpark): live rollouts at T = 0 (traced,
    every record tagged with the served version), their recorded blocks scored in one ``score_trees`` call; the
    trainer's V2 drafter on the returned context features proposes exactly the server's block at every recorded
    anchor, and the target rows agree with every verify decision. Then one Draft-OPD step on the error anchors: a
    finite positive loss whose gradient reaches the candidate selector's codebooks (q of a slot is conditioned on
    the recorded draft before it)."""
    from transformers import AutoTokenizer

    from _replay_checks import replay_served_blocks
    from specopd_trainer.algorithms.draft_opd.replay import draft_opd_step, select_blocks
    from specopd_trainer.client.http import SpecOPDClient
    from specopd_trainer.drafters.dflash2 import DFlash2Drafter

    g = TINY_BLOCK_SIZE - 1
    v2_server.serve(v2_server.strong, "v2-draft-opd")
    tok = AutoTokenizer.from_pretrained(v2_server.target)
    drafter = DFlash2Drafter.from_pretrained(v2_server.strong, v2_server.target)
    layers = list(drafter.spec.target_layer_ids)
    prompts = [tok(p)["input_ids"] for p in TINY_PROMPTS]
    with SpecOPDClient(v2_server.url, admin_api_key=ADMIN_KEY) as client:
        rollouts, checked = replay_served_blocks(client, drafter, prompts, block_size=TINY_BLOCK_SIZE,
                                                 new_tokens=TINY_NEW_TOKENS, version="v2-draft-opd")
        assert checked >= 16
        selected = select_blocks(rollouts, g, "error", 64, torch.Generator().manual_seed(0))
        assert selected, "the strong random drafter must have rejected slots"
        loss, m = draft_opd_step(drafter, client, selected, layers, head_dtype="float32")
        loss.backward()
    assert torch.isfinite(loss) and loss.item() > 0 and m["rejected_tokens"] > 0
    for name in ("candidate_selector.successor_codebook", "candidate_selector.predecessor_codebook"):
        grad = drafter.get_parameter(name).grad
        assert grad is not None and grad.abs().sum() > 0, name


@server
def test_v2_served_q_at_t1_is_the_trainers(v2_server: V2Server) -> None:
    """T = 1: every drawn token is among the trainer's K candidates of its slot, and the draws follow the trainer's
    q over them (softmax of the selector scores, given the drawn token before): the goodness-of-fit z of
    :mod:`_q_parity` over every traced slot is within 4.5 of 0, while the same drafts scored under q at T = 0.5
    or under another drafter are far off (the statistic has power)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from _q_parity import sampled_fit
    from specopd_trainer.drafters.dflash2 import DFlash2Drafter

    tok = AutoTokenizer.from_pretrained(v2_server.target)
    model = AutoModelForCausalLM.from_pretrained(v2_server.target, dtype=torch.float32).eval()
    v2_server.serve(v2_server.strong, "q-strong")
    drafter = DFlash2Drafter.from_pretrained(v2_server.strong, v2_server.target).eval()
    other = DFlash2Drafter.from_pretrained(v2_server.drafter, v2_server.target).eval()
    z, n, z_tempered, z_wrong = sampled_fit(v2_server.traced, tok, model, drafter, other, TINY_PROMPTS)
    assert n >= 400, n
    assert abs(z) < 4.5, (z, n, z_tempered, z_wrong)
    assert abs(z_tempered) > 6 and abs(z_wrong) > 6, (z, z_tempered, z_wrong)


# ---------------------------------------------------------------------------------------------------------------
# No server: the CPU lattice and lossless verification of the selector's sampled blocks
# ---------------------------------------------------------------------------------------------------------------


def test_cpu_lattice_equals_trainer_selector_scores() -> None:
    from sglang_specopd.server.cpu.dflash2 import follow_maps, score_edges
    from specopd_trainer.drafters.dflash2 import CandidateSelector

    g = torch.Generator().manual_seed(0)
    bs, slots, k, vocab, hidden, rank = 3, 3, 4, 50, 16, 5
    sel = CandidateSelector(hidden, vocab, rank, k)
    with torch.no_grad():
        for p in sel.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    h = torch.randn(bs, slots, hidden, generator=g)
    ids = torch.stack([torch.randperm(vocab, generator=g)[: slots * k].view(slots, k) for _ in range(bs)])
    unary = torch.randn(bs, slots, k, generator=g)
    anchor = torch.randint(0, vocab, (bs,), generator=g)
    with torch.no_grad():
        lattice = score_edges(predecessor_table=sel.predecessor_codebook, successor_table=sel.successor_codebook,
                              candidate_ids=ids, unary_logits=unary, hidden=sel.hidden_projection(h),
                              anchor_token_ids=anchor, top_k=k)
        assert lattice.shape == (bs, slots, k, k)
        for e in range(slots):
            for p in range(k):
                prev = anchor if e == 0 else ids[:, e - 1, p]
                want = sel.candidate_scores(h[:, e], prev, ids[:, e], unary[:, e])
                torch.testing.assert_close(lattice[:, e, p], want, rtol=1e-5, atol=1e-5)
    maps = torch.randint(0, k, (bs, slots - 1, k), generator=g)
    start = torch.randint(0, k, (bs,), generator=g)
    path = follow_maps(maps, start, slots - 1)
    for b in range(bs):
        idx = [int(start[b])]
        for e in range(slots - 1):
            idx.append(int(maps[b, e, idx[-1]]))
        assert path[b].tolist() == idx


def test_selector_sampled_blocks_verify_losslessly() -> None:
    """SGLang's CPU ``sample_path`` draws slot e from q_rows[e] (over the K candidates, given the previous pick);
    with that q scattered into the vocabulary, the CPU chain verifier emits its first token ~ p and accepts slot 1
    with probability sum_v min(p, q) (Leviathan et al. 2023)."""
    from sglang.srt.models.dflash import CandidateSelector

    from sglang_specopd.server.cpu.chain_sampling import chain_speculative_sampling
    from sglang_specopd.server.cpu.dflash2 import follow_maps

    torch.manual_seed(0)
    k, vocab, n = 3, 6, 20000
    sel = CandidateSelector(hidden_size=4, vocab_size=vocab, state_rank=2, top_k=k)
    ids = torch.tensor([[1, 3, 4], [0, 2, 5]]).expand(n, 2, k)
    scores = torch.zeros(n, 2, k, k)
    scores[:, 0] = torch.tensor([1.0, 0.2, -0.5])
    scores[:, 1] = torch.tensor([[0.5, 0.0, -1.0], [2.0, 0.0, 0.0], [-1.0, 1.0, 1.5]])
    import sglang.srt.models.dflash as dflash_mod

    real = dflash_mod._follow_maps
    dflash_mod._follow_maps = follow_maps  # the CPU engine's hook (no inductor in a unit test)
    try:
        tokens, q_rows = sel.sample_path(candidate_ids=ids, scores=scores, uniforms=torch.rand(n, 2),
                                         temperatures=torch.ones(n), greedy_mask=torch.zeros(n, dtype=torch.bool))
    finally:
        dflash_mod._follow_maps = real
    q0 = torch.softmax(scores[0, 0, 0], -1)
    first = (tokens[:, :1] == ids[:1, 0]).float().mean(0)  # frequency of each slot-0 candidate
    torch.testing.assert_close(first, q0, atol=0.015, rtol=0)
    for c in range(k):  # slot 1 given slot-0 pick c: the realized row handed to verification
        rows = tokens[:, 0] == ids[0, 0, c]
        torch.testing.assert_close(q_rows[rows, 1], torch.softmax(scores[0, 1, c], -1).expand(int(rows.sum()), k))
        freq = (tokens[rows, 1:2] == ids[:1, 1]).float().mean(0)
        torch.testing.assert_close(freq, torch.softmax(scores[0, 1, c], -1), atol=0.03, rtol=0)
    dense = torch.zeros(n, 2, vocab).scatter_(-1, ids, q_rows)
    p0 = torch.tensor([0.1, 0.4, 0.0, 0.2, 0.3, 0.0])
    p = torch.stack([p0, torch.full((vocab,), 1 / vocab), torch.full((vocab,), 1 / vocab)]).expand(n, 3, vocab)
    cand = torch.cat([torch.zeros(n, 1, dtype=torch.long), tokens], 1)
    predicts = torch.full((n * 3,), -1, dtype=torch.int32)
    accept_index = torch.full((n, 3), -1, dtype=torch.int32)
    accept_num = torch.empty(n, dtype=torch.int32)
    chain_speculative_sampling(predicts, accept_index, accept_num, cand, torch.arange(n * 3).view(n, 3), None, None,
                               torch.rand(n, 2), torch.rand(n), p.contiguous(), dense)
    emitted = predicts.view(n, 3)[:, 0].long()
    torch.testing.assert_close(torch.bincount(emitted, minlength=vocab).float() / n, p0, atol=0.015, rtol=0)
    alpha = torch.minimum(p0, torch.zeros(vocab).scatter_(0, ids[0, 0], q0)).sum()
    assert abs(float((accept_num >= 1).float().mean()) - float(alpha)) < 0.015
