"""What target a worker serves, for ``GET /specopd/drafter`` (``target``): a trainer driving several workers checks
they all serve the same one (:mod:`specopd_trainer.fleet.check`).

``{"fingerprint": str, "dtype": str}``: :func:`sglang_specopd.wire.target_fingerprint.target_fingerprint` of the
scheduler's ``server_args.model_path`` (computed once per path, in the scheduler process, at the first
``drafter_info`` op: a few KiB read per tensor), and ``server_args.dtype`` (the served dtype as the launch resolved
it; ``auto`` when SGLang picks it from the checkpoint). A checkpoint that cannot be fingerprinted reports
``"unreadable: <reason>"``, which matches no other worker's.
"""

from __future__ import annotations

from typing import Dict

_FINGERPRINTS: Dict[str, str] = {}


def target_identity(scheduler) -> Dict[str, str]:
    """``{"fingerprint", "dtype"}`` of the target ``scheduler`` serves (SGLang's ``Scheduler.server_args``)."""
    from sglang_specopd.wire.target_fingerprint import FingerprintError, target_fingerprint

    args = scheduler.server_args
    path = str(args.model_path)
    if path not in _FINGERPRINTS:
        try:
            _FINGERPRINTS[path] = target_fingerprint(path)
        except (FingerprintError, OSError) as exc:
            _FINGERPRINTS[path] = f"unreadable: {exc}"
    return {"fingerprint": _FINGERPRINTS[path], "dtype": str(getattr(args, "dtype", "auto"))}
