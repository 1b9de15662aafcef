"""Gated DeltaNet (GDN) layers of hybrid (GDN + full attention) targets, e.g. Qwen3-Next: scoring a packed
proposal-tree row ``[prefix | nodes of tree 0 | ...]`` by indexed state replay.

Layout follows flash-linear-attention: plain-torch references (``naive``: token recurrence, causal conv1d, tree
scoring with every node as its own sequence), the chunked WY form (``chunk``), indexed state replay (``replay``,
plain torch) and the Triton tree kernel (``triton_replay``, UNVERIFIED ON A GPU). Conventions (gates, L2 norm,
scale, state layout [HV, Dv, Dk] = SGLang's pool layout) are documented in :mod:`.layer` and :mod:`.naive`.
"""

from .chunk import DEFAULT_CHUNK, gdn_chunk
from .layer import GDNParams, GDNTreeOutput, gdn_gates, random_gdn_params, split_mixed_qkv
from .layout import GDNTreeLayout, build_gdn_tree_layout, gdn_layout_from_tree_layout
from .naive import causal_conv1d_naive, gdn_layer_naive, gdn_recurrent_naive, gdn_tree_naive, l2norm
from .replay import PrefixReplay, gdn_tree_replay, replay_prefix
from .triton_replay import gdn_tree_nodes_triton, gdn_tree_replay_triton

__all__ = [
    "DEFAULT_CHUNK", "GDNParams", "GDNTreeLayout", "GDNTreeOutput", "PrefixReplay",
    "build_gdn_tree_layout", "causal_conv1d_naive", "gdn_chunk", "gdn_gates", "gdn_layer_naive",
    "gdn_layout_from_tree_layout", "gdn_recurrent_naive", "gdn_tree_naive", "gdn_tree_nodes_triton",
    "gdn_tree_replay", "gdn_tree_replay_triton", "l2norm", "random_gdn_params", "replay_prefix", "split_mixed_qkv",
]
