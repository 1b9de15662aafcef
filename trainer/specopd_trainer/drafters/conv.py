"""DFlash V2's grouped dynamic depthwise convolution across a draft block, and the draft layer it wraps.

Numerically SGLang 0.5.23 ``sglang/srt/models/dflash.py`` (``DFlashGroupedConv``, ``_grouped_conv``,
``DFlashDecoderLayer.forward`` with ``attention_conv`` / ``mlp_conv``). Per block of ``Q`` rows (slot ``s`` =
0..Q-1), per tap ``t`` (0..taps-1), per channel group ``g`` (``H / group_size`` groups):

    coef[s, t, c] = base_kernel[side, t, c] + delta[s, side, t, group(c)]
    out[s, c]     = sum_{t <= s} coef[s, t, c] * x[s - t, c]

``delta = kernel_projection(x_in)`` reshaped ``[rows, 2 (side), taps, groups]`` is computed ONCE from the
sublayer's input ``x_in`` (after its RMSNorm): side 0 convolves the sublayer's input (``prepare``), side 1 its
output (``finish``). The conv is causal inside the block and never crosses blocks (SGLang masks taps by
``position % block_size``; here rows are ``[nB, Q]`` blocks). With ``base_kernel[:, 0] = 1``, other taps 0 and a
zero ``kernel_projection`` it is the identity (a fresh V2 drafter's init).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from specopd_trainer.drafters.blocks import DrafterInputError
from specopd_trainer.drafters.layers import DFlashDecoderLayer


class GroupedBlockConv(nn.Module):
    """``base_kernel [2, taps, H]`` and ``kernel_projection: Linear(H, 2*taps*groups, bias=False)``."""

    def __init__(self, hidden: int, taps: int, group_size: int):
        super().__init__()
        if taps < 1 or group_size < 1 or hidden % group_size:
            raise ValueError(f"conv needs taps >= 1 and group_size dividing hidden {hidden}, got {taps}, "
                             f"{group_size}")
        self.taps, self.group_size, self.groups = int(taps), int(group_size), hidden // group_size
        kernel = torch.zeros(2, self.taps, hidden)
        kernel[:, 0] = 1.0
        self.base_kernel = nn.Parameter(kernel)
        self.kernel_projection = nn.Linear(hidden, 2 * self.taps * self.groups, bias=False)

    def _convolve(self, x: torch.Tensor, delta: torch.Tensor, side: int, block_len: int) -> torch.Tensor:
        """``x [N, H]`` (N = nB * block_len, block-major), ``delta [N, taps, groups]`` -> ``[N, H]``."""
        n, h = x.shape
        if n % block_len:
            raise DrafterInputError(f"conv rows {n} are not whole blocks of {block_len}")
        xb = x.view(n // block_len, block_len, self.groups, self.group_size)
        coef = (self.base_kernel[side].view(1, 1, self.taps, self.groups, self.group_size)
                + delta.view(n // block_len, block_len, self.taps, self.groups, 1))
        out = coef[:, :, 0] * xb
        for tap in range(1, min(self.taps, block_len)):
            shifted = torch.cat([torch.zeros_like(xb[:, :tap]), xb[:, :-tap]], dim=1)
            out = out + coef[:, :, tap] * shifted
        return out.reshape(n, h)

    def prepare(self, x: torch.Tensor, block_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Convolve the sublayer input ``x [N, H]``; return it with the output side's ``delta [N, taps, groups]``."""
        coef = self.kernel_projection(x).view(x.shape[0], 2, self.taps, self.groups)
        return self._convolve(x, coef[:, 0], 0, block_len), coef[:, 1]

    def finish(self, y: torch.Tensor, delta: torch.Tensor, block_len: int) -> torch.Tensor:
        """Convolve the sublayer output ``y [N, H]`` with the kernel :meth:`prepare` returned."""
        return self._convolve(y, delta, 1, block_len)


class ConvDecoderLayer(DFlashDecoderLayer):
    """A DFlash layer whose attention and MLP sublayers are each wrapped by a :class:`GroupedBlockConv`
    (checkpoint names ``attention_conv.*``, ``mlp_conv.*``)."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, intermediate: int, eps: float,
                 rope_theta: float, taps: int, group_size: int):
        super().__init__(hidden, heads, kv_heads, head_dim, intermediate, eps, rope_theta)
        self.attention_conv = GroupedBlockConv(hidden, taps, group_size)
        self.mlp_conv = GroupedBlockConv(hidden, taps, group_size)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ctx_k: torch.Tensor,
                ctx_v: torch.Tensor, mask: Optional[torch.Tensor], query_rows: Optional[torch.Tensor] = None,
                block_len: Optional[int] = None) -> torch.Tensor:
        """``[N, H]`` for ``N`` block-major rows in blocks of ``block_len``. ``query_rows`` is refused: the output
        conv of a row reads the row before it. Raises DrafterInputError."""
        if query_rows is not None or block_len is None:
            raise DrafterInputError("a conv layer needs whole blocks: block_len, and no query_rows")
        h, delta = self.attention_conv.prepare(self.input_layernorm(x), block_len)
        x = x + self.attention_conv.finish(self.self_attn(h, cos, sin, ctx_k, ctx_v, mask), delta, block_len)
        h, delta = self.mlp_conv.prepare(self.post_attention_layernorm(x), block_len)
        return x + self.mlp_conv.finish(self.mlp(h), delta, block_len)
