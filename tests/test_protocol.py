"""The trainer <-> plugin wire protocol (no server): tree flattening, request validation, the binary codec."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from sglang_specopd.wire.protocol import (
    AnchorTree,
    ScoreTreesError,
    ScoreTreesRequest,
    decode_tensors,
    encode_tensors,
    request_from_binary,
    request_to_binary,
    swap_payload,
    tensors_digest,
    validate_request,
)

VOCAB = 100
LAYERS = 4


def _req(trees, input_ids=(1, 2, 3, 4, 5), block_size=4, **kw) -> ScoreTreesRequest:
    return ScoreTreesRequest(references=[{"input_ids": list(input_ids), "trees": trees}], block_size=block_size, **kw)


# ---------------------------------------------------------------------------------------------------------------
# AnchorTree.flat
# ---------------------------------------------------------------------------------------------------------------


def test_flat_branches() -> None:
    tree = AnchorTree(anchor=2, branches=[[7, 8, 9], [5], [6, 4]])
    assert tree.flat() == ([7, 8, 9, 5, 6, 4], [-1, 0, 1, -1, -1, 4])


def test_flat_tree_with_parents() -> None:
    tree = AnchorTree(anchor=0, tokens=[10, 11, 12, 13], parents=[-1, 0, 0, -1])
    assert tree.flat() == ([10, 11, 12, 13], [-1, 0, 0, -1])


def test_flat_tokens_without_parents_is_one_chain() -> None:
    assert AnchorTree(anchor=1, tokens=[3, 4, 5]).flat() == ([3, 4, 5], [-1, 0, 1])


@pytest.mark.parametrize("kw", [{}, {"branches": [[1]], "tokens": [1]}])
def test_anchor_tree_needs_exactly_one_form(kw) -> None:
    with pytest.raises(ValidationError, match="either 'branches' or 'tokens'"):
        AnchorTree(anchor=0, **kw)


def test_anchor_tree_parents_length_must_match() -> None:
    with pytest.raises(ValidationError, match="'parents' has 1 entries for 2 tokens"):
        AnchorTree(anchor=0, tokens=[1, 2], parents=[-1])


# ---------------------------------------------------------------------------------------------------------------
# validate_request
# ---------------------------------------------------------------------------------------------------------------


def test_valid_request_passes() -> None:
    req = _req([{"anchor": 0, "branches": [[1, 2, 3], [4]]},
                {"anchor": 4, "tokens": [5, 6, 7, 8], "parents": [-1, 0, 1, -1]}], feature_layer_ids=[0, 2])
    validate_request(req, vocab_size=VOCAB, num_layers=LAYERS)


@pytest.mark.parametrize("trees, input_ids, match", [
    ([{"anchor": 0, "branches": [[1, VOCAB]]}], (1, 2), rf"trees\[0\]: token id {VOCAB} outside the vocabulary \[0, {VOCAB}\)"),
    ([{"anchor": 0, "tokens": [1, -1]}], (1, 2), r"token id -1 outside the vocabulary"),
    ([], (1, VOCAB + 5), rf"input_ids: token id {VOCAB + 5} outside the vocabulary"),
    ([{"anchor": 0, "branches": [[1], [1, 2, 3, 4]]}], (1, 2), r"branches\[1\] has 4 tokens; at most block_size - 1 = 3"),
    ([{"anchor": 0, "branches": [[1], []]}], (1, 2), r"branches\[1\] is empty"),
    ([{"anchor": 0, "tokens": [1, 2, 3, 4], "parents": [-1, 0, 1, 2]}], (1, 2),
     r"a path of 4 tokens is longer than block_size - 1 = 3"),
    ([{"anchor": 2, "branches": [[1]]}], (1, 2), r"trees\[0\]: anchor 2 is past the reference end \(length 2\)"),
    ([{"anchor": 0, "tokens": [1, 2], "parents": [-1, 1]}], (1, 2),
     r"parents\[1\] = 1 is a cycle or forward reference \(must be -1 or < 1\)"),
    ([{"anchor": 0, "tokens": [1, 2, 3], "parents": [-1, 2, 1]}], (1, 2),
     r"parents\[1\] = 2 is a cycle or forward reference"),
    ([{"anchor": 0, "tokens": [1, 2], "parents": [-1, -2]}], (1, 2), r"parents\[1\] = -2 is .*out of range"),
])
def test_validate_request_rejects(trees, input_ids, match) -> None:
    with pytest.raises(ScoreTreesError, match=match):
        validate_request(_req(trees, input_ids), vocab_size=VOCAB, num_layers=LAYERS)


@pytest.mark.parametrize("lid", [LAYERS - 1, LAYERS, -1])
def test_feature_layer_ids_exclude_the_last_layer(lid) -> None:
    with pytest.raises(ScoreTreesError, match=rf"feature layer id {lid} outside \[0, {LAYERS - 1}\) \(the last layer"):
        validate_request(_req([], feature_layer_ids=[0, lid]), vocab_size=VOCAB, num_layers=LAYERS)


def test_error_names_the_reference_and_tree() -> None:
    req = ScoreTreesRequest(references=[{"input_ids": [1, 2]}, {"input_ids": [1], "trees": [
        {"anchor": 0, "branches": [[1]]}, {"anchor": 0, "branches": [[VOCAB + 1]]}]}], block_size=4)
    with pytest.raises(ScoreTreesError, match=r"^references\[1\]\.trees\[1\]: token id"):
        validate_request(req, vocab_size=VOCAB, num_layers=LAYERS)


# ---------------------------------------------------------------------------------------------------------------
# pydantic models
# ---------------------------------------------------------------------------------------------------------------


def test_empty_references_rejected() -> None:
    with pytest.raises(ValidationError, match="references"):
        ScoreTreesRequest(references=[], block_size=4)
    with pytest.raises(ValidationError):
        ScoreTreesRequest.model_validate_json('{"references": [], "block_size": 4}')


@pytest.mark.parametrize("body", [
    '{"references": [{"input_ids": [1]}], "block_size": 4, "bogus": 1}',
    '{"references": [{"input_ids": [1], "extra": 2}], "block_size": 4}',
    '{"references": [{"input_ids": [1], "trees": [{"anchor": 0, "branches": [[1]], "depth": 3}]}], "block_size": 4}',
])
def test_unknown_keys_rejected(body) -> None:
    with pytest.raises(ValidationError, match="(?i)extra"):
        ScoreTreesRequest.model_validate_json(body)


@pytest.mark.parametrize("body, loc", [
    ('{"references": [{"input_ids": []}], "block_size": 4}', "input_ids"),
    ('{"references": [{"input_ids": [1]}], "block_size": 1}', "block_size"),
    ('{"references": [{"input_ids": [1]}], "block_size": 4, "top_k": 0}', "top_k"),
    ('{"references": [{"input_ids": [1]}], "block_size": 4, "returns": ["all"]}', "returns"),
    ('{"references": [{"input_ids": [1], "trees": [{"anchor": -1, "branches": [[1]]}]}], "block_size": 4}', "anchor"),
    ('{"references": [{"input_ids": [1]}], "block_size": 4, "output_dtype": "float16"}', "output_dtype"),
])
def test_field_constraints(body, loc) -> None:
    with pytest.raises(ValidationError) as info:
        ScoreTreesRequest.model_validate_json(body)
    assert loc in ".".join(str(p) for p in info.value.errors()[0]["loc"])


# ---------------------------------------------------------------------------------------------------------------
# binary form
# ---------------------------------------------------------------------------------------------------------------


def _as_tokens_parents(req: ScoreTreesRequest):
    return [(ref.input_ids, [(t.anchor, t.flat()) for t in ref.trees]) for ref in req.references]


def test_binary_round_trip() -> None:
    req = ScoreTreesRequest(
        references=[
            {"input_ids": [1, 2, 3, 4], "trees": [{"anchor": 1, "branches": [[5, 6], [7]]},
                                                    {"anchor": 3, "tokens": [8, 9, 10], "parents": [-1, 0, 0]}]},
            {"input_ids": [9]},
            {"input_ids": [3, 3], "trees": [{"anchor": 0, "tokens": [1]}]},
        ],
        block_size=5, returns=["topk", "logprobs"], top_k=7, feature_layer_ids=[1], output_dtype="bfloat16")
    back = request_from_binary(request_to_binary(req))
    assert _as_tokens_parents(back) == _as_tokens_parents(req)
    assert back.model_dump(exclude={"references"}) == req.model_dump(exclude={"references"})
    # Trees always come back in the tokens + parents form.
    assert all(t.tokens is not None and t.branches is None for r in back.references for t in r.trees)


def test_binary_accepts_int32() -> None:
    req = _req([{"anchor": 1, "branches": [[5, 6]]}])
    tensors, header = decode_tensors(request_to_binary(req))
    back = request_from_binary(encode_tensors({k: v.to(torch.int32) for k, v in tensors.items()}, header))
    assert _as_tokens_parents(back) == _as_tokens_parents(req)


def test_binary_float_tensor_rejected() -> None:
    tensors, header = decode_tensors(request_to_binary(_req([{"anchor": 1, "branches": [[5, 6]]}])))
    tensors["ref0.node_tokens"] = tensors["ref0.node_tokens"].float()
    with pytest.raises(ScoreTreesError, match=r"ref0\.node_tokens.*int32/int64.*torch\.float32"):
        request_from_binary(encode_tensors(tensors, header))


def test_binary_2d_tensor_rejected() -> None:
    tensors, header = decode_tensors(request_to_binary(_req([{"anchor": 1, "branches": [[5, 6]]}])))
    tensors["ref0.input_ids"] = tensors["ref0.input_ids"].view(1, -1)
    with pytest.raises(ScoreTreesError, match=r"1-D"):
        request_from_binary(encode_tensors(tensors, header))


def test_binary_missing_tensor_and_bad_header() -> None:
    tensors, header = decode_tensors(request_to_binary(_req([{"anchor": 1, "branches": [[5, 6]]}])))
    del tensors["ref0.node_parents"]
    with pytest.raises(ScoreTreesError, match="missing tensor 'ref0.node_parents'"):
        request_from_binary(encode_tensors(tensors, header))
    with pytest.raises(ScoreTreesError, match="num_references"):
        request_from_binary(encode_tensors({"x": torch.zeros(1)}, {"block_size": 4}))


def test_binary_node_anchor_out_of_range() -> None:
    tensors, header = decode_tensors(request_to_binary(_req([{"anchor": 1, "branches": [[5, 6]]}])))
    tensors["ref0.node_anchor"] = torch.tensor([0, 3])
    with pytest.raises(ScoreTreesError, match="node_anchor 3 does not index an anchor"):
        request_from_binary(encode_tensors(tensors, header))


def test_binary_garbage_is_value_error() -> None:
    good = request_to_binary(_req([{"anchor": 1, "branches": [[5, 6]]}]))
    for bad in (b"", b"\x00" * 3, b"not safetensors at all", good[: len(good) // 2]):
        with pytest.raises(ValueError):
            request_from_binary(bad)


# ---------------------------------------------------------------------------------------------------------------
# tensor codec and digest
# ---------------------------------------------------------------------------------------------------------------


def test_encode_decode_round_trip() -> None:
    g = torch.Generator().manual_seed(0)
    tensors = {"a": torch.randn(3, 4, generator=g), "b": torch.arange(5), "c": torch.randn(2, generator=g).bfloat16(),
               "empty": torch.zeros(0, 3)}
    header = {"version": "v1", "nested": {"x": [1, 2]}, "unicode": "é"}
    back, h = decode_tensors(encode_tensors(tensors, header))
    assert h == header
    assert set(back) == set(tensors)
    for k in tensors:
        assert back[k].dtype == tensors[k].dtype and torch.equal(back[k], tensors[k]), k
    assert decode_tensors(encode_tensors({"a": torch.ones(1)}))[1] == {}


def test_encode_non_contiguous() -> None:
    t = torch.arange(12.0).view(3, 4).t()
    assert torch.equal(decode_tensors(encode_tensors({"t": t}))[0]["t"], t)


def test_tensors_digest() -> None:
    g = torch.Generator().manual_seed(1)
    tensors = {"w": torch.randn(4, 4, generator=g), "b": torch.randn(4, generator=g)}
    d = tensors_digest(tensors)
    assert d == tensors_digest({k: v.clone() for k, v in reversed(list(tensors.items()))}), "order independent"
    assert d == tensors_digest(decode_tensors(encode_tensors(tensors))[0]), "stable across the codec"
    changed = {k: v.clone() for k, v in tensors.items()}
    changed["w"][2, 3] += 1e-6
    assert tensors_digest(changed) != d
    assert tensors_digest({"w": tensors["w"], "c": tensors["b"]}) != d, "names count"
    assert tensors_digest({"w": tensors["w"], "b": tensors["b"].double()}) != d, "dtypes count"
    assert tensors_digest({"w": tensors["w"].reshape(2, 8), "b": tensors["b"]}) != d, "shapes count"


def test_swap_payload_header() -> None:
    tensors = {"w": torch.ones(2, 2)}
    back, header = decode_tensors(swap_payload({"architectures": ["DFlashDraftModel"]}, tensors, "v7"))
    assert header == {"config": {"architectures": ["DFlashDraftModel"]}, "version": "v7",
                      "sha256_of_tensors": tensors_digest(tensors)}
    assert torch.equal(back["w"], tensors["w"])


def test_root_only_tree_is_valid_in_both_forms() -> None:
    """A tree with no nodes asks for its anchor row only (SpecOPD's root anchors); JSON and binary agree."""
    from sglang_specopd.wire.protocol import request_from_binary, request_to_binary

    req = _req([{"anchor": 1, "tokens": []}, {"anchor": 0, "branches": [[1, 2]]}], (1, 2, 3))
    validate_request(req, vocab_size=VOCAB, num_layers=LAYERS)
    back = request_from_binary(request_to_binary(req))
    assert [t.flat() for t in back.references[0].trees] == [([], []), ([1, 2], [-1, 0])]


@pytest.mark.parametrize("ids", [[2, 1], [0, 0], [1, 1, 2], [2, 0, 1]])
def test_feature_layer_ids_unsorted_or_repeated_rejected(ids) -> None:
    # features come back one block per layer in ascending order: an unsorted / repeated list was answered 200
    # with the blocks reordered and duplicates dropped (issue 18); now it is a 400 with the reason
    with pytest.raises(ScoreTreesError, match="strictly increasing"):
        validate_request(_req([], feature_layer_ids=ids), vocab_size=VOCAB, num_layers=LAYERS)
    body = request_to_binary(_req([], feature_layer_ids=[0, 1]))
    tensors, header = decode_tensors(body)
    header["feature_layer_ids"] = ids
    with pytest.raises(ScoreTreesError, match="strictly increasing"):
        validate_request(request_from_binary(encode_tensors(tensors, header)), vocab_size=VOCAB, num_layers=LAYERS)


def test_binary_parse_is_linear_in_the_anchors() -> None:
    # 4,000 one-node anchors: parsing used to match every node against every anchor (O(anchors x nodes), ~2 s
    # here and 23 s for a 768 KB body); bucketed in one pass it is the pydantic validation that dominates.
    # Measured as a ratio to parsing 1/8 of the anchors, so the machine's speed cancels out.
    import time

    def body(n: int) -> bytes:
        trees = [{"anchor": i % 40, "tokens": [5], "parents": [-1]} for i in range(n)]
        return request_to_binary(_req(trees, input_ids=range(1, 41), block_size=4))

    def parse_s(data: bytes) -> float:
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            req = request_from_binary(data)
            best = min(best, time.perf_counter() - t0)
        assert len(req.references[0].trees) in (500, 4000)
        return best

    small, large = parse_s(body(500)), parse_s(body(4000))
    assert large < 30 * small, (small, large)  # linear: ~8x; quadratic: ~64x


def test_binary_nodes_keep_their_order_per_anchor() -> None:
    req = _req([{"anchor": 1, "tokens": [7, 8, 9], "parents": [-1, 0, 0]}, {"anchor": 3, "tokens": [4, 5],
                "parents": [-1, 0]}, {"anchor": 1, "tokens": [], "parents": []}])
    back = request_from_binary(request_to_binary(req))
    assert [(t.anchor, t.tokens, t.parents) for t in back.references[0].trees] == [
        (1, [7, 8, 9], [-1, 0, 0]), (3, [4, 5], [-1, 0]), (1, [], [])]
