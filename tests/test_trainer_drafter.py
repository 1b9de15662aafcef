"""Tests of specopd_trainer.drafters: masks, blocks, DFlashDrafter checkpoint identity, proposals, target head."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from sglang_specopd.wire.drafters.format import DrafterSpec, expected_tensors
from sglang_specopd.wire.drafters.init import init_drafter_tensors, save_drafter
from specopd_trainer.drafters import UnknownDrafterError, drafter_class_for_checkpoint, get_drafter_class
from specopd_trainer.drafters.blocks import (
    IGNORE_INDEX,
    DrafterInputError,
    build_dflash_training_mask,
    build_dflash_training_mask_loop,
    dflash_attention_mask,
    make_blocks,
)
from specopd_trainer.drafters.dflash import DFlashDrafter, DrafterLoadError, MissingTargetHeadError
from specopd_trainer.drafters.target_head import TargetHead, load_target_head

V, H = 97, 32


def make_spec(**kw) -> DrafterSpec:
    base = dict(hidden_size=H, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                intermediate_size=48, rms_norm_eps=1e-6, rope_theta=10000.0, vocab_size=V,
                max_position_embeddings=512, block_size=4, target_layer_ids=(1, 3), mask_token="<m>",
                mask_token_id=5, num_target_layers=6)
    base.update(kw)
    return DrafterSpec(**base)


def strong_tensors(spec: DrafterSpec, seed: int) -> dict[str, torch.Tensor]:
    """Weights 10x the init scale and non-unit norms, so attention and context visibly matter."""
    g = torch.Generator().manual_seed(seed)
    return {n: (t * 10 if t.ndim == 2 else 1 + 0.3 * torch.randn(t.shape, generator=g))
            for n, t in init_drafter_tensors(spec, seed).items()}


def random_head(seed: int = 0) -> TargetHead:
    g = torch.Generator().manual_seed(seed)
    return TargetHead(torch.randn(V, H, generator=g), torch.randn(V, H, generator=g))


@pytest.fixture(scope="module")
def drafter() -> DFlashDrafter:
    spec = make_spec()
    d = DFlashDrafter(spec, target_head=random_head())
    d.load_state_dict(strong_tensors(spec, 3))
    return d.eval()


def test_mask_hand_checked_tiny_case() -> None:
    expected = torch.tensor([
        # ctx 0..4        | block 0  | block 1
        [1, 1, 0, 0, 0, 1, 1, 1, 0, 0, 0],
        [1, 1, 0, 0, 0, 1, 1, 1, 0, 0, 0],
        [1, 1, 0, 0, 0, 1, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1],
        [1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1],
        [1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1],
    ], dtype=torch.bool)
    assert torch.equal(build_dflash_training_mask(5, [2, 4], 3), expected)
    assert torch.equal(build_dflash_training_mask_loop(5, [2, 4], 3), expected)


@pytest.mark.parametrize("seed", range(5))
def test_mask_matches_loop_reference(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    ctx_len = int(torch.randint(1, 40, (1,), generator=g))
    anchors = torch.randint(0, ctx_len + 1, (int(torch.randint(1, 9, (1,), generator=g)),), generator=g)
    anchors[0] = 0  # a block with no context at all
    b = int(torch.randint(2, 9, (1,), generator=g))
    got = build_dflash_training_mask(ctx_len, anchors, b)
    assert got.dtype == torch.bool and got.shape == (len(anchors) * b, ctx_len + len(anchors) * b)
    assert torch.equal(got, build_dflash_training_mask_loop(ctx_len, anchors.tolist(), b))


def test_packed_mask_separates_sequences() -> None:
    # two sequences of 3 context rows each (positions 0..2), one anchor in each at position 2
    mask = dflash_attention_mask(torch.tensor([0, 1, 2, 0, 1, 2]), torch.tensor([2, 2]), 2,
                                 ctx_seq=torch.tensor([0, 0, 0, 1, 1, 1]), anchor_seq=torch.tensor([0, 1]))
    assert mask[:, :6].int().tolist() == [[1, 1, 0, 0, 0, 0]] * 2 + [[0, 0, 0, 1, 1, 0]] * 2


def test_mask_rejects_bad_anchors() -> None:
    with pytest.raises(DrafterInputError, match="0..5"):
        build_dflash_training_mask(5, [6], 3)
    with pytest.raises(DrafterInputError, match="0..3"):
        make_blocks(torch.arange(4), [4], 3, 0)


def test_make_blocks_values() -> None:
    blocks = make_blocks(torch.tensor([10, 11, 12, 13, 14]), [1, 3], 4, mask_token_id=7)
    assert blocks.input_ids.tolist() == [[11, 7, 7, 7], [13, 7, 7, 7]]
    assert blocks.positions.tolist() == [[1, 2, 3, 4], [3, 4, 5, 6]]
    assert blocks.labels.tolist() == [[IGNORE_INDEX, 12, 13, 14], [IGNORE_INDEX, 14, IGNORE_INDEX, IGNORE_INDEX]]


def test_state_dict_is_the_checkpoint_format(drafter: DFlashDrafter) -> None:
    sd = drafter.state_dict()
    want = expected_tensors(drafter.spec)
    assert list(sd) == list(want)
    assert {n: tuple(t.shape) for n, t in sd.items()} == want
    # the target head is held but neither saved nor trained
    assert drafter.target_head is not None and not any("embed" in n or "lm_head" in n for n in sd)
    assert sum(p.numel() for p in drafter.parameters()) == sum(t.numel() for t in sd.values())


def test_fresh_drafter_equals_init_drafter_tensors() -> None:
    spec = make_spec()
    got = DFlashDrafter(spec, seed=11).checkpoint_tensors()
    ref = init_drafter_tensors(spec, 11)
    assert all(torch.equal(got[n], ref[n]) for n in ref)


def test_save_load_round_trip_is_identity(drafter: DFlashDrafter, tmp_path: Path) -> None:
    out = drafter.save_pretrained(tmp_path / "d")
    assert json.loads((out / "config.json").read_text())["architectures"] == ["DFlashDraftModel"]
    loaded = DFlashDrafter.from_pretrained(out)
    a, b = drafter.checkpoint_tensors(), loaded.checkpoint_tensors()
    assert list(a) == list(b) and all(torch.equal(a[n], b[n]) for n in a)
    assert loaded.spec == drafter.spec
    assert drafter_class_for_checkpoint(out) is DFlashDrafter


def test_load_rejects_foreign_tensors(tmp_path: Path) -> None:
    spec = make_spec()
    save_drafter(spec, init_drafter_tensors(spec, 0), tmp_path / "d")
    tensors = init_drafter_tensors(spec, 0)
    tensors["layers.0.self_attn.q_proj.bias"] = torch.zeros(32)
    del tensors["norm.weight"]
    save_file(tensors, str(tmp_path / "d" / "model.safetensors"))
    with pytest.raises(DrafterLoadError, match="missing norm.weight.*unexpected layers.0.self_attn.q_proj.bias"):
        DFlashDrafter.from_pretrained(tmp_path / "d")


def test_registry() -> None:
    assert get_drafter_class("dflash") is DFlashDrafter
    with pytest.raises(KeyError, match="registered drafters: dflash, dflash2, dspark"):
        get_drafter_class("eagle3")
    assert issubclass(UnknownDrafterError, KeyError)


def test_propose_is_deterministic_and_equals_training_path(drafter: DFlashDrafter) -> None:
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, V, (30,), generator=g)
    feats = torch.randn(30, 2 * H, generator=g)
    anchors = [0, 7, 19, 29]
    single = torch.stack([drafter.propose(feats[:a], int(tokens[a]), a) for a in anchors])
    assert single.shape == (4, drafter.block_size - 1) and single.dtype == torch.long
    again = torch.stack([drafter.propose(feats[:a], int(tokens[a]), a) for a in anchors])
    assert torch.equal(single, again)
    # all anchors in one training-mask forward give the same proposals as serving-style single blocks
    assert torch.equal(drafter.propose_blocks(feats, tokens, anchors), single)
    # proposals depend on the context: changing features before the anchor changes something
    changed = drafter.propose(feats[:19] * -1, int(tokens[19]), 19)
    assert not torch.equal(changed, single[2])


def test_blocks_do_not_see_later_context_or_other_blocks(drafter: DFlashDrafter) -> None:
    g = torch.Generator().manual_seed(2)
    tokens, feats = torch.randint(0, V, (20,), generator=g), torch.randn(20, 2 * H, generator=g)
    blocks = make_blocks(tokens, [5, 12], drafter.block_size, drafter.spec.mask_token_id)
    with torch.no_grad():
        h = drafter.forward_blocks(feats, blocks.input_ids, blocks.positions, blocks.anchors)
        feats2, ids2 = feats.clone(), blocks.input_ids.clone()
        feats2[5:] = torch.randn(15, 2 * H, generator=g)  # context at/after anchor 5 only
        ids2[1, 0] = (ids2[1, 0] + 1) % V  # the other block's anchor token
        h2 = drafter.forward_blocks(feats2, ids2, blocks.positions, blocks.anchors)
    assert torch.allclose(h[0], h2[0], atol=1e-6) and not torch.allclose(h[1], h2[1], atol=1e-3)


def test_logits_and_gradients(drafter: DFlashDrafter) -> None:
    g = torch.Generator().manual_seed(3)
    tokens, feats = torch.randint(0, V, (12,), generator=g), torch.randn(12, 2 * H, generator=g)
    logits, labels = drafter.logits(feats, tokens, [2, 9])
    assert logits.shape == (2, drafter.block_size, V)
    assert labels.tolist() == [[IGNORE_INDEX] + tokens[3:6].tolist(), [IGNORE_INDEX] + tokens[10:12].tolist() + [-100]]
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), labels.reshape(-1), ignore_index=IGNORE_INDEX)
    loss.backward()
    assert drafter.fc.weight.grad is not None and drafter.fc.weight.grad.abs().sum() > 0
    assert not drafter.target_head.embed.requires_grad
    drafter.zero_grad(set_to_none=True)


def test_selected_slots_equal_the_full_forward_in_value_and_gradient(drafter: DFlashDrafter) -> None:
    """``forward_blocks(..., slots)`` (last layer on the selected rows only) == ``forward_blocks(...)[slots]``, and
    so do the parameter gradients of any loss on those rows; anchor 0 (no context) and a block past the end too."""
    g = torch.Generator().manual_seed(11)
    tokens, feats = torch.randint(0, V, (24,), generator=g), torch.randn(24, 2 * H, generator=g)
    anchors = [0, 3, 9, 17, 23]
    blocks = make_blocks(tokens, anchors, drafter.block_size, drafter.spec.mask_token_id)
    slots = torch.zeros(len(anchors), drafter.block_size, dtype=torch.bool)
    slots[:2, 1:] = True  # branch anchors: every drafted slot
    slots[2:, 1] = True  # root anchors: slot 1 only
    w = torch.randn(int(slots.sum()), H, generator=g)
    grads = []
    for pick in (lambda: drafter.forward_blocks(feats, blocks.input_ids, blocks.positions, blocks.anchors)[slots],
                 lambda: drafter.forward_blocks(feats, blocks.input_ids, blocks.positions, blocks.anchors, slots)):
        drafter.zero_grad(set_to_none=True)
        out = pick()
        (out * w).sum().backward()
        grads.append((out.detach(), {n: p.grad.clone() for n, p in drafter.named_parameters()}))
    (h_ref, g_ref), (h_sel, g_sel) = grads
    assert h_sel.shape == (9, H)
    torch.testing.assert_close(h_sel, h_ref, atol=1e-6, rtol=1e-6)
    assert g_ref.keys() == g_sel.keys()
    for n in g_ref:
        torch.testing.assert_close(g_sel[n], g_ref[n], atol=1e-5, rtol=1e-5, msg=n)
    drafter.zero_grad(set_to_none=True)
    hidden, labels = drafter.block_hidden(feats, tokens, anchors, slots)
    torch.testing.assert_close(hidden, h_ref, atol=1e-6, rtol=1e-6)
    with pytest.raises(DrafterInputError, match="slots must be bool"):
        drafter.forward_blocks(feats, blocks.input_ids, blocks.positions, blocks.anchors, slots[:, :2])


def test_head_of_a_slot_slice_equals_the_plain_matmul() -> None:
    """The head on a non-contiguous slot slice (one flattened matmul) equals ``hidden @ lm_head.T``, gradient too."""
    head = random_head(2)
    hidden = torch.randn(5, 4, H, requires_grad=True)
    out = head.logits(hidden[:, 1:])
    ref = hidden[:, 1:] @ head.lm_head.T
    assert out.shape == (5, 3, V)
    torch.testing.assert_close(out, ref)
    w = torch.randn_like(out)
    (g_out,) = torch.autograd.grad((out * w).sum(), hidden)
    (g_ref,) = torch.autograd.grad((ref * w).sum(), hidden)
    torch.testing.assert_close(g_out, g_ref)


def test_sampling_is_seeded(drafter: DFlashDrafter) -> None:
    feats = torch.randn(6, 2 * H, generator=torch.Generator().manual_seed(4))
    a = drafter.propose(feats, 3, 6, temperature=1.0, generator=torch.Generator().manual_seed(9))
    b = drafter.propose(feats, 3, 6, temperature=1.0, generator=torch.Generator().manual_seed(9))
    assert torch.equal(a, b) and a.shape == (drafter.block_size - 1,)


def test_input_errors(drafter: DFlashDrafter) -> None:
    with pytest.raises(DrafterInputError, match=r"\[T, 64\]"):
        drafter.project_context(torch.zeros(3, H))
    with pytest.raises(DrafterInputError, match="positions 0..3"):
        drafter.propose(torch.zeros(3, 2 * H), 1, 4)
    with pytest.raises(MissingTargetHeadError):
        DFlashDrafter(make_spec()).propose(torch.zeros(2, 2 * H), 1, 2)


@pytest.mark.parametrize("tied", [True, False])
def test_load_target_head_reads_only_embedding_and_head(tmp_path: Path, tied: bool) -> None:
    g = torch.Generator().manual_seed(5)
    tensors = {"model.embed_tokens.weight": torch.randn(V, H, generator=g),
               "model.norm.weight": torch.ones(H), "model.layers.0.mlp.up_proj.weight": torch.zeros(4, H)}
    if not tied:
        tensors["lm_head.weight"] = torch.randn(V, H, generator=g)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"tie_word_embeddings": tied}))
    head = load_target_head(tmp_path)
    assert torch.equal(head.embed, tensors["model.embed_tokens.weight"])
    assert torch.equal(head.lm_head, tensors["lm_head.weight" if not tied else "model.embed_tokens.weight"])
    assert head.state_dict() == {}
    d = DFlashDrafter(make_spec())
    d.load_target_head(tmp_path)
    assert list(d.state_dict()) == list(expected_tensors(d.spec))
