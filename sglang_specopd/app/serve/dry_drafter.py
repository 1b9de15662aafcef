"""The drafter part of ``specopd serve --dry-run`` (:mod:`sglang_specopd.app.serve.dry_run`): the drafter's config
resolved as SGLang resolves it against the target's config.json (and tokenizer, when here), checked against the
target and the tensor-parallel size, its weights when here, and the algorithm and block size SGLang will use."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence


def tp_size(args: Sequence[str]) -> int:
    """The tensor-parallel size in SGLang flags (``--tp-size N``, ``--tp N``, ``--tensor-parallel-size N``, or
    ``=N``); 1 when absent. Raises ValueError for a non-integer value."""
    names = ("--tp-size", "--tp", "--tensor-parallel-size")
    args = list(args)
    for i, a in enumerate(args):
        key, eq, val = a.partition("=")
        if key in names:
            return int(val if eq else args[i + 1])
    return 1


def _split(what: str, total: Any, tp: int, replicate: bool = False) -> Optional[str]:
    """The problem of splitting ``total`` units of ``what`` over ``tp`` ranks (None when fine or not known)."""
    if not isinstance(total, int) or tp <= 1:
        return None
    if total >= tp or not replicate:
        return None if total % tp == 0 else f"{what} {total} is not divisible by --tp-size {tp}"
    return None if tp % total == 0 else f"{what} {total} < --tp-size {tp} must divide it (replicated)"


def tp_problems(cfg: Dict[str, Any], tp: int, who: str) -> List[str]:
    """Tensor-parallel splits of a model config dict (``text_config`` used when present) that SGLang refuses."""
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    checks = [("attention heads", text.get("num_attention_heads"), False),
              ("KV heads", text.get("num_key_value_heads"), True),
              ("MLP width (intermediate_size)", text.get("intermediate_size"), False),
              ("expert MLP width (moe_intermediate_size)", text.get("moe_intermediate_size"), False),
              ("GDN key heads (linear_num_key_heads)", text.get("linear_num_key_heads"), False),
              ("GDN value heads (linear_num_value_heads)", text.get("linear_num_value_heads"), False)]
    return [f"{who}: {p}" for what, total, rep in checks if (p := _split(what, total, tp, rep))]


def _facts(tdir: Optional[Path]):
    """``(TargetInfo, TargetFacts)`` of a target directory holding at least config.json; a missing tokenizer gives
    facts without one (mask ids are then not checked against it). ``(None, None)`` without a directory. Raises
    TargetConfigError."""
    from sglang_specopd.wire.checkpoint_info import read_target_info, read_tokenizer_vocab
    from sglang_specopd.wire.drafters.layouts import TargetFacts

    if tdir is None:
        return None, None
    info = read_target_info(tdir)
    try:
        vocab = read_tokenizer_vocab(tdir)
    except ValueError:
        return info, TargetFacts(info.num_hidden_layers, info.vocab_size, lambda token: None, None)
    return info, TargetFacts(info.num_hidden_layers, info.vocab_size, vocab.get, max(vocab.values(), default=-1) + 1)


def check_drafter_dir(out: Any, cfg: Any, ddir: Path, tdir: Optional[Path], tp: int) -> Optional[str]:
    """Add the drafter's ``ok`` / ``notes`` / ``problems`` lines to ``out`` (a
    :class:`~sglang_specopd.app.serve.dry_run.DryRun`) and return the ``--speculative-algorithm`` that serves it
    (None when its config cannot be read)."""
    from sglang_specopd.app.drafters.check import describe, target_problems, tensor_problems
    from sglang_specopd.app.serve.choice import DrafterInvalidError, serving_algorithm
    from sglang_specopd.wire.checkpoint_info import TargetConfigError
    from sglang_specopd.wire.drafters.archs import arch_for_spec, resolve_drafter_config
    from sglang_specopd.wire.drafters.format import DrafterConfigError, read_drafter_config

    try:
        algorithm = serving_algorithm(ddir, cfg.speculative_algorithm)
        out.ok.append(f"drafter {ddir}: served by --speculative-algorithm {algorithm}")
    except DrafterInvalidError as exc:
        out.problems.append(str(exc))
        return None
    try:
        info, facts = _facts(tdir)
    except TargetConfigError as exc:
        out.problems.append(str(exc))
        info, facts = None, None
    if facts is not None and facts.tokenizer_len is None:
        out.notes.append("not checked: the target tokenizer is not here (mask token ids are checked against its "
                         "vocabulary size only)")
    try:
        spec, res = resolve_drafter_config(read_drafter_config(ddir), None, facts, str(ddir))
    except DrafterConfigError as exc:
        for code, msg in exc.problems:
            (out.notes if code == "needs_target" else out.problems).append(
                f"not checked: {msg}" if code == "needs_target" else f"drafter: {msg}")
        return algorithm
    out.ok.append(f"drafter: {describe(spec)}")
    out.ok += [f"sglang will use: {k} {v}" for k, v in res.used.items()]
    out.notes += [f"SGLang will warn: {n}" for n in res.notes]
    if info is not None:
        out.problems += [f"drafter: {p.message}" for p in target_problems(spec, arch_for_spec(spec).target_facts(
            res.config), info)]
    out.problems += tp_problems(res.config, tp, "drafter")
    if any(ddir.glob("*.safetensors")):
        out.problems += [f"drafter: {p.message}" for p in tensor_problems(spec, ddir)]
    else:
        out.notes.append(f"not checked: drafter weights are not in {ddir} (tensor names and shapes)")
    gamma = hasattr(spec, "gamma")
    if cfg.block_size is not None and cfg.block_size != spec.block_size:
        out.notes.append(f"block_size {cfg.block_size} in the config, {spec.block_size} in the drafter"
                         f"{' (verify block, gamma + 1)' if gamma else ''}: SGLang serves the config's and warns")
    elif cfg.block_size is None:
        out.notes.append(f"block_size not in the config: SGLang serves the drafter's {spec.block_size}")
    return algorithm
