"""Which served requests the live-traffic spool may keep: a request sent with ``custom_params: {"specopd_spool":
false}`` is never kept, and neither are its context features (measurement requests of held-out prompts, users who
did not agree to training on their traffic). Used by :mod:`.spool` and :mod:`.features` (no import between them
for this).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

SPOOL_PARAM = "specopd_spool"  # custom_params.specopd_spool: false keeps a request out of the spool


def opted_out(req: Any) -> bool:
    """True if the request asked not to be kept (``custom_params: {"specopd_spool": false}``): e.g. measurement
    requests of held-out prompts, or users who did not agree to training on their traffic."""
    params = getattr(getattr(req, "sampling_params", None), "custom_params", None)
    return isinstance(params, dict) and params.get(SPOOL_PARAM) is False


def any_kept(reqs: Optional[Sequence[Any]]) -> bool:
    """Whether a batch holds a request that did not opt out (whose features a capturing server keeps); a batch of
    only opted-out requests may run its k = 0 steps as plain decode steps (server/goodput/plain.py)."""
    return any(not opted_out(r) for r in reqs or ())
