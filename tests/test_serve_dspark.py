"""DSpark drafters (``DSparkDraftModel``) served by SGLang's own DSPARK worker on the CPU engine (CPU adaptation 16).

Two servers, one at a time: the plain one (conftest's ``tiny_plain_outputs``: greedy reference outputs, stopped
before the next starts), then a ``--speculative-algorithm DSPARK`` server on the same tiny fp32 target with a
block-4 (gamma 3) DSpark drafter made by ``init_drafter(arch="dspark")`` whose Markov head is switched on
(``markov_w2`` ~ N(0, 1); fresh it is zero). Checked on it:

* greedy output ids equal the plain server's (lossless), and SGLang's per-request statistics show the speculative
  path ran: ``spec_verify_ct`` verify steps, fewer than the tokens, with ``spec_correct_drafts_histogram`` summing to
  them, and drafts accepted on at least one prompt (the target is ``make_accepting_target``'s);
* parity at T = 0: the trainer's :class:`~specopd_trainer.drafters.dspark.DSparkDrafter`, walking the same greedy
  sequence block by block (``propose`` at each verify anchor, accept the matching prefix, move on by accepted + 1),
  reproduces the server's ``spec_verify_ct`` and ``spec_correct_drafts_histogram`` exactly, and the Markov head
  changes at least one of its greedy proposals (so the parity exercises it);
* temperature 1 (SGLang's Markov-head sampler, verified by ``accept_sampling`` with CPU adaptation 8's chain
  sampler) completes with consistent statistics.

Without a server: the ``_handle_dspark`` hook, and ``specopd serve``'s algorithm / drafter / launch-flag handling.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import types
from pathlib import Path
from typing import Dict, List

import pytest
import torch

from conftest import TINY_BLOCK_SIZE, TINY_NEW_TOKENS, TINY_PROMPTS, running_server, tiny_launch_spec

GAMMA = TINY_BLOCK_SIZE - 1
MARKOV_RANK = 8
server = pytest.mark.server


def _dspark_drafter(target: Path, out: Path, seed: int = 0) -> Path:
    """A block-4, 2-layer DSpark drafter for ``target`` with its Markov head on: ``markov_w2`` ~ N(0, 1)."""
    from safetensors.torch import load_file

    from sglang_specopd.wire.drafter_init import init_drafter, save_drafter

    spec = init_drafter(target, out, block_size=TINY_BLOCK_SIZE, num_layers=2, seed=seed, arch="dspark",
                        options={"markov_rank": MARKOV_RANK})
    tensors = load_file(str(out / "model.safetensors"))
    w2 = "markov_head.markov_w2.weight"
    assert not tensors[w2].any(), "a fresh DSpark drafter has markov_w2 = 0"
    tensors[w2] = torch.randn(tensors[w2].shape, generator=torch.Generator().manual_seed(seed + 5))
    save_drafter(spec, {n: t.contiguous() for n, t in tensors.items()}, out, overwrite=True)
    return out


@dataclasses.dataclass
class DSparkServer:
    srv: object
    target: Path
    drafter: Path
    reference: Dict[str, List[int]]


@pytest.fixture(scope="module")
def dspark_server(tiny_plain_outputs, tiny_serving_target: Path, tmp_path_factory) -> DSparkServer:
    """Plain reference outputs (conftest's: that server stopped), then the DSPARK server."""
    from sglang_specopd.app.launch import free_port

    root = tmp_path_factory.mktemp("dspark")
    drafter = _dspark_drafter(tiny_serving_target, root / "ds")
    spec = dataclasses.replace(tiny_launch_spec(tiny_serving_target, free_port(), drafter),
                               speculative_algorithm="DSPARK")
    assert "--speculative-dspark-block-size" in spec.argv()
    with running_server(spec, root, "dspark") as srv:
        yield DSparkServer(srv, tiny_serving_target, drafter, {p: tiny_plain_outputs[p] for p in TINY_PROMPTS})


def _check_stats(meta: dict, n_tokens: int) -> None:
    """SGLang's per-request speculative statistics are there and consistent with ``n_tokens`` generated tokens."""
    steps, hist = meta["spec_verify_ct"], meta["spec_correct_drafts_histogram"]
    assert 0 < steps < n_tokens, meta
    assert 0 < len(hist) <= GAMMA + 1 and sum(hist) == steps, meta  # SGLang stops at the longest seen
    assert meta["spec_num_proposed_drafts"] == GAMMA * steps, meta
    assert meta["spec_num_correct_drafts"] == sum(k * c for k, c in enumerate(hist)), meta
    # every verify step commits its accepted drafts + 1 token; the last may run past max_new_tokens
    assert 1 + steps + meta["spec_num_correct_drafts"] >= n_tokens, meta


# ---------------------------------------------------------------------------------------------------------------
# Serving: lossless greedy, acceptance statistics, trainer parity, T = 1
# ---------------------------------------------------------------------------------------------------------------


@server
def test_dspark_greedy_is_lossless(dspark_server: DSparkServer) -> None:
    accepted = {}
    for prompt in TINY_PROMPTS:
        resp = dspark_server.srv.generate(prompt, TINY_NEW_TOKENS)
        assert resp["output_ids"] == dspark_server.reference[prompt], prompt
        _check_stats(resp["meta_info"], TINY_NEW_TOKENS)
        accepted[prompt] = resp["meta_info"]["spec_num_correct_drafts"]
    assert max(accepted.values()) > 0, f"no prompt accepted a draft: {accepted}"


def _walk(drafter, feats: torch.Tensor, seq: List[int], start: int, n_tokens: int) -> tuple:
    """Greedy speculative decoding of ``seq`` from ``start`` (the first generated token, emitted by prefill, is
    the first anchor) with ``drafter``: (verify steps, histogram of accepted drafts, every proposal)."""
    anchor, emitted, hist, proposals = start, 1, [0] * (GAMMA + 1), []
    while emitted < n_tokens:
        proposed = drafter.propose(feats[:anchor], seq[anchor], anchor).tolist()
        proposals.append(proposed)
        k = 0
        while k < GAMMA and proposed[k] == seq[anchor + 1 + k]:
            k += 1
        hist[k] += 1
        anchor += k + 1
        emitted += k + 1
    return sum(hist), hist, proposals


@server
def test_dspark_acceptance_equals_trainer_walk(dspark_server: DSparkServer) -> None:
    """The trainer's greedy DSpark proposals reproduce the server's verify steps and acceptance histogram."""
    import copy

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specopd_trainer.drafters.dspark import DSparkDrafter
    from specopd_trainer.drafters.features import hf_context_features

    tok = AutoTokenizer.from_pretrained(dspark_server.target)
    model = AutoModelForCausalLM.from_pretrained(dspark_server.target, dtype=torch.float32).eval()
    drafter = DSparkDrafter.from_pretrained(dspark_server.drafter, dspark_server.target).eval()
    no_markov = copy.deepcopy(drafter)
    with torch.no_grad():
        no_markov.get_parameter("markov_head.markov_w2.weight").zero_()
    markov_mattered = 0
    for prompt in TINY_PROMPTS:
        resp = dspark_server.srv.generate(prompt, TINY_NEW_TOKENS)
        prompt_ids = tok(prompt)["input_ids"]
        seq = prompt_ids + resp["output_ids"]
        with torch.no_grad():  # the last verify step may check drafts past max_new_tokens: the target's continuation
            for _ in range(GAMMA):
                seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
            feats = hf_context_features(model, torch.tensor(seq), drafter.spec.target_layer_ids)
            steps, hist, proposals = _walk(drafter, feats, seq, len(prompt_ids), TINY_NEW_TOKENS)
            _, _, plain_proposals = _walk(no_markov, feats, seq, len(prompt_ids), TINY_NEW_TOKENS)
        meta = resp["meta_info"]
        served = meta["spec_correct_drafts_histogram"]
        served = served + [0] * (GAMMA + 1 - len(served))
        assert (steps, hist) == (meta["spec_verify_ct"], served), (prompt, meta)
        markov_mattered += sum(a != b for a, b in zip(proposals, plain_proposals))
    assert markov_mattered, "the Markov head never changed a greedy proposal: the parity does not exercise it"


@server
def test_dspark_temperature_one_completes(dspark_server: DSparkServer) -> None:
    for prompt in TINY_PROMPTS[:2]:
        resp = dspark_server.srv.generate(prompt, 24, temperature=1.0)
        assert len(resp["output_ids"]) == 24, resp
        _check_stats(resp["meta_info"], 24)


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


def test_serve_dspark_drafter_under_dspark_and_refused_under_specopd(tiny_serving_target: Path,
                                                                     tmp_path: Path) -> None:
    """``specopd serve``: a DSpark drafter launches under ``speculative_algorithm: DSPARK`` with DSPARK's gamma
    flag; SPECOPD (or DSPARK with a DFlash drafter) is refused before launch, naming the algorithm to use."""
    from sglang_specopd.app.config import ServeConfig
    from sglang_specopd.app.launch import free_port
    from sglang_specopd.app.serve import DrafterInvalidError, launch_spec, resolve_drafter
    from sglang_specopd.wire.drafter_init import init_drafter

    ds = _dspark_drafter(tiny_serving_target, tmp_path / "ds")
    dflash = tmp_path / "dflash"
    init_drafter(tiny_serving_target, dflash, block_size=TINY_BLOCK_SIZE, num_layers=2)
    cfg = ServeConfig(name="tiny-dspark", target=str(tiny_serving_target), drafter=str(ds),
                      block_size=TINY_BLOCK_SIZE, device="cpu", dtype="float32", speculative_algorithm="DSPARK")
    assert resolve_drafter(cfg, tiny_serving_target) == ds
    argv = " ".join(launch_spec(cfg, port=free_port()).argv())
    for flag in ("--speculative-algorithm DSPARK", f"--speculative-draft-model-path {ds}",
                 f"--speculative-dspark-block-size {GAMMA}", "--speculative-draft-attention-backend torch_native"):
        assert flag in argv, (flag, argv)
    assert "--speculative-dflash-block-size" not in argv
    with pytest.raises(DrafterInvalidError, match="DSPARK worker.*serves DFLASH drafters only.*speculative_algorithm: "
                                                  "DSPARK"):
        resolve_drafter(cfg.model_copy(update={"speculative_algorithm": "SPECOPD"}), tiny_serving_target)
    with pytest.raises(DrafterInvalidError, match="DFLASH worker.*DSPARK serves DSPARK drafters only"):
        resolve_drafter(cfg.model_copy(update={"drafter": str(dflash)}), tiny_serving_target)
    assert json.loads((ds / "config.json").read_text())["dflash_config"]["block_size"] == GAMMA
