"""Proposal trees: packing, tree attention masks, FlashInfer mask packing, tree attention (reference, grouped torch,
Triton, FlashInfer) and the per-device backend choice (:func:`get_tree_attention`)."""

from .attention import tree_attention_reference
from .backends import TREE_ATTENTION_BACKENDS, TreeAttentionBackend, get_tree_attention, tree_attention_backend_name
from .batch import PackedTrees, pack_trees_varlen
from .flashinfer_attention import tree_attention_flashinfer, tree_row_mask
from .grouped import tree_attention_grouped
from .layout import TreeLayout, build_tree_layout
from .naive import (
    ProposalTree,
    branches_to_parents,
    build_tree_mask,
    build_tree_mask_loop,
    pack_branches,
    pack_proposal_tree,
    tree_ancestors,
    validate_parents,
)
from .packbits import FlashInferMask, flashinfer_custom_mask, packbits, segment_packbits, unpackbits
from .triton_attention import tree_attention_triton

__all__ = [
    "ProposalTree", "PackedTrees", "FlashInferMask",
    "branches_to_parents", "build_tree_mask", "build_tree_mask_loop", "pack_branches", "pack_proposal_tree",
    "pack_trees_varlen", "tree_ancestors", "validate_parents",
    "packbits", "unpackbits", "segment_packbits", "flashinfer_custom_mask",
    "tree_attention_reference", "TreeLayout", "build_tree_layout", "tree_attention_grouped", "tree_attention_triton",
    "tree_attention_flashinfer", "tree_row_mask",
    "TreeAttentionBackend", "TREE_ATTENTION_BACKENDS", "get_tree_attention", "tree_attention_backend_name",
]
