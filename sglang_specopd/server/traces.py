"""Per-request acceptance traces recorded by the SPECOPD worker.

A request asks for its trace with ``sampling_params.custom_params = {"specopd_trace": true}`` (``/generate``), or
``custom_params`` + ``return_meta_info`` in the OpenAI API. Each verify step then appends one record to
``meta_info["specopd_trace"]``::

    {"anchor": int,          # position of the anchor token (the last verified token) in the sequence
     "proposed": [int, ...],  # the drafter's block_size - 1 proposed token ids for positions anchor+1 ...
     "accepted": int}         # how many leading proposals the target accepted (0 .. block_size - 1)

Tokens emitted by that verify step = accepted + 1 (the bonus token). SGLang itself reports the request's mean
acceptance length (``spec_accept_length``) and verify count (``spec_verify_ct``) in ``meta_info`` always.
Pure Python, no torch import: the scheduler hands lists in.
"""

from __future__ import annotations

from typing import Any, List, Sequence

TRACE_KEY = "specopd_trace"
_PENDING_ATTR = "_specopd_trace_pending"


def wants_trace(req: Any) -> bool:
    """True if the request's ``custom_params`` ask for a trace (``{"specopd_trace": true}``)."""
    params = getattr(getattr(req, "sampling_params", None), "custom_params", None)
    return bool(isinstance(params, dict) and params.get(TRACE_KEY))


def record_verify_step(
    reqs: Sequence[Any], anchors: Sequence[int], proposed: Sequence[Sequence[int]], accepted: Sequence[int]
) -> None:
    """Append one verify record to every request in ``reqs`` that asked for a trace.

    Args:
        reqs: the batch's requests, row-aligned with the other arguments (len bs).
        anchors: anchor positions per row (ints).
        proposed: per row, the drafted token ids (block_size - 1 ints).
        accepted: per row, number of accepted drafted tokens.
    """
    for req, anchor, prop, acc in zip(reqs, anchors, proposed, accepted):
        if wants_trace(req):
            _push(req, _PENDING_ATTR, {"anchor": int(anchor), "proposed": [int(t) for t in prop], "accepted": int(acc)})


def _push(req: Any, attr: str, item: Any) -> None:
    items = getattr(req, attr, None)
    if items is None:
        items = []
        setattr(req, attr, items)
    items.append(item)


def _take(req: Any, attr: str) -> list:
    items = getattr(req, attr, None)
    if not items:
        return []
    setattr(req, attr, [])
    return items


def take_pending(req: Any) -> List[dict]:
    """Return and clear the records not yet streamed for ``req`` ([] if none)."""
    return _take(req, _PENDING_ATTR)


VERSIONS_KEY = "specopd_drafter_versions"
_VERSIONS_ATTR = "_specopd_versions_seen"
_VERSIONS_PENDING = "_specopd_versions_pending"


def record_versions(reqs: Sequence[Any], version: str) -> None:
    """Note that ``version`` of the drafter proposed for every request in ``reqs`` at this verify step."""
    for req in reqs:
        seen = getattr(req, _VERSIONS_ATTR, None)
        if not seen or seen[-1] != version:
            _push(req, _VERSIONS_ATTR, version)
            _push(req, _VERSIONS_PENDING, version)


def take_pending_versions(req: Any) -> List[str]:
    """Drafter versions first used by ``req`` since its last streamed output (appended to meta_info)."""
    return _take(req, _VERSIONS_PENDING)
