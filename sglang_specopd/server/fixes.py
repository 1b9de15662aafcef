"""Device-independent fixes to SGLang 0.5.23 bugs that the SPECOPD path hits (each one upstreamable).

1. ``ModelRunner._extend_forward_kwargs`` casts ``forward_batch.input_embeds`` with a hard-coded
   ``.bfloat16()``. DFLASH feeds the draft model the target's token embeddings as ``input_embeds``, so with
   ``--dtype float32`` (or float16) the draft layers received bf16 activations against fp32 weights and the
   scheduler crashed with "expected m1 and m2 to have the same dtype" (the crash seen with DFLASH in fp32).
   Fix: cast to the runner's model dtype instead; for bf16 models this is exactly the old behaviour.
   Upstream patch: ``kwargs["input_embeds"] = forward_batch.input_embeds.to(self.dtype)``.
"""

from __future__ import annotations


def extend_kwargs_in_model_dtype(result, self, forward_batch, pp_proxy_tensors=None):
    """AFTER hook for ``ModelRunner._extend_forward_kwargs``: input_embeds in the model's dtype, not bf16."""
    embeds = getattr(forward_batch, "input_embeds", None)
    if embeds is not None and isinstance(result, dict) and "input_embeds" in result:
        dtype = getattr(self, "dtype", None)
        if dtype is not None and result["input_embeds"].dtype != dtype and forward_batch.replace_embeds is None:
            result["input_embeds"] = embeds.to(dtype)
    return result


def register_fixes() -> None:
    """Register the fixes above with SGLang's HookRegistry."""
    from sglang_specopd.server import compat

    compat.hook("ModelRunner._extend_forward_kwargs", extend_kwargs_in_model_dtype)
