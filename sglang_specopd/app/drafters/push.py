"""``specopd drafter push``: hot-swap a drafter checkpoint directory (trained anywhere) into a running server.

The same validated swap the trainer uses (:func:`specopd_trainer.pipeline.push_checkpoint`: a safetensors body
with the config and a checksum; the server checks architecture, every spec field, names, shapes, dtypes and
finiteness, and swaps all or nothing). Before sending, the directory is read and checked here as far as it can be
without the target: the config resolves as SGLang resolves it (any published layout), and the tensors are exactly
the architecture's names and shapes. A published checkpoint's ``model.`` name prefix is dropped (SGLang's loader
drops it too).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional


class DrafterPushError(ValueError):
    """The directory cannot be pushed (unreadable, invalid config, tensors that are not the drafter's), or the
    server refused or could not be reached; the message says which."""


@dataclass(frozen=True)
class PushResult:
    """The server's reply to a push: new and previous drafter versions, swap count, whether the radix cache was
    flushed, and the number of tensors sent."""

    version: str
    previous_version: str
    swaps: int
    cache_flushed: bool
    tensors: int


def read_checkpoint(drafter_dir: str | Path, target_dir: Optional[str | Path] = None) -> tuple[dict, dict, Any]:
    """``(config dict, {name: CPU tensor}, spec or None)`` of a drafter directory, checked locally.

    With ``target_dir`` the full :func:`sglang_specopd.app.drafters.check.check_drafter_report` runs (SGLang's
    resolution against that target included). Without it the config is resolved as far as SGLang can without the
    target (a value only the target gives, e.g. an absent ``mask_token_id``, is left to the server: spec None).

    Raises DrafterPushError (missing directory or config, no safetensors, what SGLang refuses, wrong tensors).
    """
    from safetensors.torch import load_file

    from sglang_specopd.app.drafters.check import check_drafter_report
    from sglang_specopd.wire.drafters.archs import arch_for_spec, resolve_drafter_config
    from sglang_specopd.wire.drafters.format import DrafterConfigError, read_drafter_config

    d = Path(drafter_dir).expanduser()
    if not d.is_dir():
        raise DrafterPushError(f"drafter path does not exist: {d}")
    spec = None
    if target_dir is not None:
        report = check_drafter_report(d, target_dir)
        if report.problems:
            raise DrafterPushError("; ".join(p.message for p in report.problems))
        spec = report.spec
    try:
        config = read_drafter_config(d)
        if spec is None:
            spec = resolve_drafter_config(config, None, None, str(d))[0]
    except DrafterConfigError as exc:
        if any(code != "needs_target" for code, _ in exc.problems):
            raise DrafterPushError(str(exc)) from None
    files = sorted(d.glob("*.safetensors"))
    if not files:
        raise DrafterPushError(f"no *.safetensors file in {d}")
    tensors: dict = {}
    for f in files:
        try:
            loaded = load_file(str(f))
        except Exception as exc:  # safetensors raises its own error types for truncated files
            raise DrafterPushError(f"cannot read {f}: {exc}") from None
        tensors.update({name.removeprefix("model."): t for name, t in loaded.items()})
    if spec is not None:
        want = arch_for_spec(spec).expected_tensors(spec)
        missing, extra = sorted(set(want) - set(tensors)), sorted(set(tensors) - set(want))
        shapes = [n for n in want if n in tensors and tuple(tensors[n].shape) != want[n]]
        if missing or extra or shapes:
            raise DrafterPushError(f"tensors are not the drafter's: missing {missing[:5]}, unexpected {extra[:5]}, "
                                   f"wrong shape {shapes[:5]}")
    return config, tensors, spec


def push_drafter_dir(drafter_dir: str | Path, server: str, admin_key: str, version: Optional[str] = None,
                     target_dir: Optional[str | Path] = None, timeout: float = 300.0) -> PushResult:
    """Check ``drafter_dir`` (:func:`read_checkpoint`) and hot-swap it into the server at ``server`` under
    ``version`` (default: the directory's name). Raises DrafterPushError with the local problem, the server's
    refusal (``HTTP 400: refused: ...``; the old drafter keeps serving) or the connection error."""
    import httpx

    from specopd_trainer.client.http import ServerRequestError
    from specopd_trainer.pipeline import push_checkpoint

    config, tensors, _ = read_checkpoint(drafter_dir, target_dir)
    name = version or Path(drafter_dir).expanduser().resolve().name
    try:
        reply = push_checkpoint(server, config, tensors, name, admin_key, timeout)
    except ServerRequestError as exc:
        raise DrafterPushError(f"the server refused the drafter: {exc}") from None
    except httpx.HTTPError as exc:
        raise DrafterPushError(f"cannot reach {server}: {exc}") from None
    return PushResult(str(reply.get("version")), str(reply.get("previous_version")), int(reply.get("swaps", 0)),
                      bool(reply.get("cache_flushed")), len(tensors))
