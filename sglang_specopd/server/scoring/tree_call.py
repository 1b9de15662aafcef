"""The state of one tree forward (``/specopd/score_trees``), shared by the layer hooks that answer it.

While :func:`sglang_specopd.server.scoring.forward.tree_forward` runs the served target on a packed row
``[reference prefix | proposal-tree nodes]``, :data:`TREE_CALL` holds a :class:`TreeCall` and the forward batch
is a :class:`TreeForwardBatch`; the attention hooks (full attention:
:func:`sglang_specopd.server.scoring.forward.tree_attention_override`; Gated DeltaNet:
:func:`sglang_specopd.server.scoring.gdn.gdn_tree_override`) answer from the row itself when both are set, so
neither SGLang's KV cache nor its mamba state pool is read or written (QSA layers: the index step too,
:mod:`sglang_specopd.server.scoring.qsa`). Outside a tree forward the ContextVar is
None and every hook passes straight through.
"""

from __future__ import annotations

import contextvars

from sglang_specopd.server import compat

TREE_CALL: contextvars.ContextVar = contextvars.ContextVar("specopd_tree_layout", default=None)


class TreeForwardBatch:
    """The few ForwardBatch fields a Llama/Qwen layer stack reads outside attention; everything else is None."""

    def __init__(self, num_tokens: int, device):
        self.forward_mode = compat.get("ForwardMode").EXTEND
        self.logical_forward_mode = self.forward_mode  # read by Qwen3.5 / Qwen4-Exp GDN layers on CUDA
        self.residual_stream = None
        self.batch_size = 1
        self.num_tokens = num_tokens
        self.can_run_tbo = False
        self.device = device

    def __getattr__(self, name):
        return None


class TreeCall:
    """What one tree forward's attention layers need: the row's layout, and optionally a cached reference prefix
    to attend to (``prefix``: the row holds the tree nodes only), an entry to record the prefix K/V into, or
    ``grow = (entry, start)``: the row is prefix rows ``start..`` of ``entry`` (a prefix chunk), whose K/V are
    written into the entry's full-length buffers and which attend to the entry's rows before ``start``.
    ``gdn_layout``: the row's :class:`specopd_kernels.gdn.GDNTreeLayout`, built by the first GDN layer and shared
    by the others (None until then)."""

    def __init__(self, layout, prefix=None, record=None, grow=None):
        self.layout, self.prefix, self.record, self.grow = layout, prefix, record, grow
        self.gdn_layout = None
