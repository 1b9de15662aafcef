"""Proposal trees: packing, tree attention masks, FlashInfer mask packing, reference tree attention."""

from .attention import tree_attention_reference
from .batch import PackedTrees, pack_trees_varlen
from .grouped import TreeLayout, build_tree_layout, tree_attention_grouped
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

__all__ = [
    "ProposalTree", "PackedTrees", "FlashInferMask",
    "branches_to_parents", "build_tree_mask", "build_tree_mask_loop", "pack_branches", "pack_proposal_tree",
    "pack_trees_varlen", "tree_ancestors", "validate_parents",
    "packbits", "unpackbits", "segment_packbits", "flashinfer_custom_mask",
    "tree_attention_reference",
]
