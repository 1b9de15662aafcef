"""Sparse full-attention layers of sparse-linear hybrid targets (QSA-GDN, e.g. SGLang's Qwen4-Exp): scoring a packed
proposal-tree row ``[prefix | nodes of tree 0 | ...]`` with the QSA indexer's key selection made exactly as
sequential decoding of each branch makes it.

Layout follows flash-linear-attention: plain-torch references (``naive``: one sequence token by token, a tree node
by node), the indexer's formulas (``indexer``), the vectorized tree selection (``select``, torch: logits + top-k),
the Triton sparse-attention kernel (``triton_sparse``, UNVERIFIED ON A GPU) and the backend choice + whole layer
step (``attention``). Selection rule and tree semantics: docs/sparse_attention.md.
"""

from .attention import (
    SPARSE_ATTENTION_BACKENDS,
    get_sparse_attention,
    qsa_tree_attention,
    sparse_attention_backend_name,
    sparse_attention_torch,
)
from .indexer import QSAConfig, apply_rope, expand_blocks, gemma_rms_norm, qsa_block_keys, qsa_logits
from .naive import (
    node_paths,
    qsa_select_last_naive,
    qsa_select_sequence_naive,
    qsa_sequence_naive,
    qsa_tree_naive,
    sparse_attention_naive,
)
from .select import QSASelection, qsa_tree_select, tree_paths
from .triton_sparse import sparse_attention_triton

__all__ = [
    "QSAConfig", "QSASelection", "SPARSE_ATTENTION_BACKENDS", "apply_rope", "expand_blocks", "gemma_rms_norm",
    "get_sparse_attention", "node_paths", "qsa_block_keys", "qsa_logits", "qsa_select_last_naive",
    "qsa_select_sequence_naive", "qsa_sequence_naive", "qsa_tree_attention", "qsa_tree_naive", "qsa_tree_select",
    "sparse_attention_backend_name", "sparse_attention_naive", "sparse_attention_torch", "sparse_attention_triton",
    "tree_paths",
]
