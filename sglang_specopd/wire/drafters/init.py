"""Create drafter checkpoints for a target: mask-token choice, deterministic init, atomic save.

Any registered architecture (:mod:`sglang_specopd.wire.drafters.archs`, default ``"dflash"``): the entry builds the
spec (``spec_for_target``), names the tensors and writes the config.json.

Mask token. DFlash feeds ``[anchor, MASK x (B-1)]`` through the target's embedding, so the mask must be one
existing token id < the target's vocab_size (SGLang cannot grow the target's embedding) that never occurs as
real context. Rule (:func:`choose_mask_token`): an explicit override wins; else the tokenizer's own
``mask_token``; else a special added token that is not bos/eos/pad/unk/sep/cls and that the chat template never
emits, preferring the names in :data:`PREFERRED_MASK_TOKENS`, then names containing "reserved" (lowest id);
else MaskTokenError asking for ``--mask-token``.

SmolLM2-135M-Instruct has no mask token. Its 17 special tokens are <|endoftext|> (0, unk), <|im_start|> (1, bos
and in the chat template), <|im_end|> (2, eos/pad, in the template) and 14 StarCoder-pretraining markers for code
metadata and Jupyter cells (3 <repo_name> .. 16 <empty_output>). We pick ``<empty_output>`` (id 16): it is not
bos/eos/pad/unk, the ChatML template never emits it, an instruct model never produces it in chat, it is a
single special token (skipped when decoding with skip_special_tokens), and its pretraining meaning -- "this
notebook cell printed nothing" -- is the closest thing in the vocabulary to "no content here yet", so its
embedding carries little lexical content for the drafter to un-learn. (<|endoftext|> would collide with
document boundaries/unk, and the other markers announce code structure.)
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Collection, Mapping, Sequence

from sglang_specopd.wire.checkpoint_info import read_target_info
from sglang_specopd.wire.drafters.archs import DrafterInitRequest, arch_for_spec, get_drafter_arch
from sglang_specopd.wire.drafters.archs import write_drafter_arch_config
from sglang_specopd.wire.drafters.format import DTYPES

PREFERRED_MASK_TOKENS = ("<|MASK|>", "<mask>", "<|mask|>", "<empty_output>")
_SAMPLE_CHAT = [
    {"role": "system", "content": "You are helpful."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello"},
]


class DrafterInitError(ValueError):
    """A drafter cannot be created: output exists, bad arguments, or tensors that do not fit the spec."""


class MaskTokenError(DrafterInitError):
    """No usable mask token: an override that is not a single in-vocab token, or no safe special token."""


def pick_mask_token(special_tokens: Sequence[tuple[int, str]], excluded: Collection[str]) -> tuple[str, int]:
    """Choose among ``(id, token)`` special tokens, skipping ``excluded`` ones (see module docstring for the rule).

    Returns ``(token, id)``. Raises MaskTokenError when no candidate remains.
    """
    candidates = [(i, t) for i, t in special_tokens if t not in excluded]
    by_token = {t: i for i, t in candidates}
    for token in PREFERRED_MASK_TOKENS:
        if token in by_token:
            return token, by_token[token]
    reserved = sorted((i, t) for i, t in candidates if "reserved" in t.lower())
    if reserved:
        return reserved[0][1], reserved[0][0]
    raise MaskTokenError(
        "the target tokenizer has no mask token and no unused special/reserved token; pass --mask-token TOKEN "
        f"(an existing single token). Special tokens seen: {[t for _, t in special_tokens][:20]}"
    )


def choose_mask_token(target_dir: str | os.PathLike[str], override: str | None = None) -> tuple[str, int]:
    """Return ``(mask_token, mask_token_id)`` for the target at ``target_dir`` (rule in the module docstring).

    Raises:
        MaskTokenError: the override is not a single token of the tokenizer, its id is >= the target's
            vocab_size, or no safe token exists.
    """
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(target_dir)
    vocab_size = read_target_info(target_dir).vocab_size
    vocab = tok.get_vocab()
    if override is not None or tok.mask_token:
        token = override if override is not None else str(tok.mask_token)
        token_id = vocab.get(token)
        if token_id is None:
            raise MaskTokenError(f"mask token {token!r} is not a single token of the target tokenizer")
        if token_id >= vocab_size:
            raise MaskTokenError(f"mask token {token!r} has id {token_id} >= target vocab_size {vocab_size}")
        return token, int(token_id)
    excluded = {str(t) for t in (tok.bos_token, tok.eos_token, tok.pad_token, tok.unk_token,
                                 getattr(tok, "sep_token", None), getattr(tok, "cls_token", None)) if t}
    template = tok.chat_template if isinstance(tok.chat_template, str) else str(tok.chat_template or "")
    rendered = tok.apply_chat_template(_SAMPLE_CHAT, tokenize=False, add_generation_prompt=True) if template else ""
    specials = [(int(i), str(t.content)) for i, t in sorted(tok.added_tokens_decoder.items())
                if getattr(t, "special", False) and int(i) < vocab_size]
    excluded |= {t for _, t in specials if t in template or t in rendered}
    return pick_mask_token(specials, excluded)


def init_drafter_tensors(spec: Any, seed: int = 0) -> dict[str, Any]:
    """Fresh weights for ``spec`` (any registered architecture's spec), in the entry's ``expected_tensors`` order.

    Default rule: N(0, 0.02) for tensors of >= 2 dims, ones for vectors (norms). The entry's ``init_rules(spec)``
    overrides it per tensor: ``"normal"``, ``"ones"``, ``"zeros"``, or ``"conv_identity"`` (a
    ``[side, tap, channel]`` conv kernel that is 1 at tap 0 and 0 elsewhere). Normal draws come, in order, from
    ``torch.Generator().manual_seed(seed)`` in fp32 (only for tensors drawn normally), then everything is cast to
    spec.dtype. Returns name -> contiguous ``torch.Tensor``; bit-identical for equal (spec, seed).

    Raises: UnknownDrafterArchError when ``type(spec)`` is not registered; ValueError for an unknown rule kind."""
    import torch

    gen = torch.Generator().manual_seed(int(seed))
    dtype = getattr(torch, spec.dtype)
    arch = arch_for_spec(spec)
    rules = arch.init_rules(spec)
    out: dict[str, Any] = {}
    for name, shape in arch.expected_tensors(spec).items():
        kind = rules.get(name, "ones" if len(shape) == 1 else "normal")
        if kind == "normal":
            t = torch.randn(shape, generator=gen) * 0.02
        elif kind in ("ones", "zeros"):
            t = torch.ones(shape) if kind == "ones" else torch.zeros(shape)
        elif kind == "conv_identity":
            t = torch.zeros(shape)
            t[:, 0] = 1.0
        else:
            raise ValueError(f"{arch.label}: unknown init rule {kind!r} for tensor {name}")
        out[name] = t.to(dtype).contiguous()
    return out


def save_drafter(spec: Any, tensors: dict[str, Any], out_dir: str | os.PathLike[str], *,
                 overwrite: bool = False) -> Path:
    """Atomically write ``model.safetensors`` + ``config.json`` for ``spec`` (any registered architecture's spec)
    into ``out_dir``.

    ``tensors`` must hold exactly the entry's ``expected_tensors`` names with those shapes, in ``spec.dtype``. Files
    go to a temporary sibling directory that is renamed into place (an existing ``out_dir`` is replaced only when
    ``overwrite``). Returns ``out_dir`` as a Path.

    Raises:
        DrafterInitError: missing/extra tensor names, wrong shapes or dtype, or ``out_dir`` exists and not overwrite.
        UnknownDrafterArchError: ``type(spec)`` is not a registered spec type.
    """
    import torch
    from safetensors.torch import save_file

    from sglang_specopd.wire.home import make_world_readable

    out = Path(out_dir).expanduser()
    arch = arch_for_spec(spec)
    expected = arch.expected_tensors(spec)
    want_dtype = getattr(torch, spec.dtype)
    errors = [f"missing tensor {n}" for n in expected if n not in tensors]
    errors += [f"unexpected tensor {n}" for n in tensors if n not in expected]
    errors += [f"{n}: shape {tuple(t.shape)} != {expected[n]}" for n, t in tensors.items()
               if n in expected and tuple(t.shape) != expected[n]]
    errors += [f"{n}: dtype {t.dtype} != {want_dtype}" for n, t in tensors.items() if t.dtype != want_dtype]
    if errors:
        raise DrafterInitError("drafter tensors do not match the spec: " + "; ".join(errors[:10]))
    if out.exists() and not overwrite:
        raise DrafterInitError(f"output directory already exists: {out} (use --force / overwrite=True)")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.tmp-"))
    try:
        save_file({n: t.detach().cpu().contiguous() for n, t in tensors.items()}, str(tmp / "model.safetensors"),
                  metadata={"format": "pt"})
        write_drafter_arch_config(spec, tmp)
        make_world_readable(tmp)
        old = None
        if out.exists():
            old = out.parent / f".{out.name}.old-{os.getpid()}"
            os.replace(out, old)
        os.replace(tmp, out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def init_drafter(
    target_dir: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    block_size: int = 8,
    num_layers: int = 2,
    seed: int = 0,
    mask_token: str | None = None,
    *,
    target_layer_ids: Sequence[int] | None = None,
    num_context_layers: int | None = None,
    dtype: str = "float32",
    overwrite: bool = False,
    arch: str = "dflash",
    options: Mapping[str, Any] | None = None,
) -> Any:
    """Create a randomly initialised drafter of architecture ``arch`` for the HF target at ``target_dir``; return
    its spec.

    The entry's ``spec_for_target`` builds the spec from a :class:`DrafterInitRequest` (DFlash: dims copy the
    target's; context layers ``target_layer_ids`` if given, else ``default_target_layer_ids(N, K)`` with
    K = ``num_context_layers`` or, by default, ``min(num_layers, max(1, N - 3))``, so a 4-layer target gets one
    context layer; mask token: :func:`choose_mask_token`). Weights: :func:`init_drafter_tensors` (deterministic
    by ``seed``); written atomically by :func:`save_drafter`. ``options``: architecture settings (DFlash V2:
    conv/selector sizes, DSpark: Markov head; see their ``DEFAULTS``); DFlash takes none.

    Raises:
        UnknownDrafterArchError: ``arch`` is not registered. TargetConfigError: unreadable target config.
        MaskTokenError: see choose_mask_token. DrafterSpecError: invalid sizes/ids/block_size (< 2), or
        ``options`` the architecture does not take.
        DrafterInitError: ``out_dir`` exists (no overwrite), an unknown dtype, or an architecture that
        ``init`` cannot create.
    """
    entry = get_drafter_arch(arch)
    if dtype not in DTYPES:
        raise DrafterInitError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if entry.spec_for_target is None:
        raise DrafterInitError(f"drafter architecture {entry.label} cannot be created by drafter init")
    info = read_target_info(target_dir)
    if Path(out_dir).expanduser().exists() and not overwrite:
        raise DrafterInitError(f"output directory already exists: {out_dir} (use --force / overwrite=True)")
    request = DrafterInitRequest(
        target_dir=Path(target_dir), target=info, num_layers=int(num_layers), block_size=int(block_size),
        target_layer_ids=None if target_layer_ids is None else tuple(int(i) for i in target_layer_ids),
        num_context_layers=num_context_layers, dtype=dtype,
        resolve_mask_token=lambda: choose_mask_token(target_dir, mask_token), options=dict(options or {}),
    )
    spec = entry.spec_for_target(request)
    save_drafter(spec, init_drafter_tensors(spec, seed), out_dir, overwrite=overwrite)
    return spec
