"""specopd_kernels: proposal-tree packing / masks / reference tree attention (``tree``), drafter
training losses with fused Triton E2E-TV (``losses``), Gated DeltaNet tree scoring by indexed state replay
for hybrid targets (``gdn``, import it as ``specopd_kernels.gdn``) and QSA sparse attention with the served
indexer's key selection per tree node for sparse-linear hybrid targets (``sparse``, import it as
``specopd_kernels.sparse``).  Installed from the ``kernels/`` folder under the import name ``specopd_kernels``.
Layout follows flash-linear-attention: ``<op>/naive.py`` references beside the fused kernels.
"""

from .losses import (
    LOSSES,
    acceptance_alpha,
    ce_decay_loss,
    draft_opd_loss,
    e2e_tv_from_alpha,
    e2e_tv_loss,
    expected_acceptance_length,
    forward_kl,
    fused_acceptance_alpha,
    fused_e2e_tv_loss,
    get_loss,
    reverse_kl,
    tv_loss,
)
from .tree import (
    FlashInferMask,
    PackedTrees,
    ProposalTree,
    branches_to_parents,
    build_tree_mask,
    flashinfer_custom_mask,
    pack_branches,
    pack_proposal_tree,
    pack_trees_varlen,
    packbits,
    segment_packbits,
    tree_attention_reference,
    unpackbits,
)

__all__ = [
    "LOSSES", "acceptance_alpha", "ce_decay_loss", "draft_opd_loss", "e2e_tv_from_alpha", "e2e_tv_loss",
    "expected_acceptance_length", "forward_kl", "fused_acceptance_alpha", "fused_e2e_tv_loss", "get_loss",
    "reverse_kl", "tv_loss",
    "FlashInferMask", "PackedTrees", "ProposalTree", "branches_to_parents", "build_tree_mask",
    "flashinfer_custom_mask", "pack_branches", "pack_proposal_tree", "pack_trees_varlen", "packbits",
    "segment_packbits", "tree_attention_reference", "unpackbits",
]
