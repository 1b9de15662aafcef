"""Per-request acceptance traces recorded by the SPECOPD worker.

A request asks for its trace with ``sampling_params.custom_params = {"specopd_trace": true}`` (``/generate``), or
``custom_params`` + ``return_meta_info`` in the OpenAI API; the value must be a JSON boolean (anything else is
refused with HTTP 400 by :func:`check_trace_param`). Each verify step then appends one record to
``meta_info["specopd_trace"]``::

    {"anchor": int,          # position of the anchor token (the last verified token) in the sequence
     "proposed": [int, ...],  # the drafter's block_size - 1 proposed token ids for positions anchor+1 ...
     "accepted": int,         # how many leading proposals the target accepted (0 .. block_size - 1)
     "drafter_version": str,  # version of the drafter whose weights proposed this block ("initial" until the
                              # first hot swap; sglang_specopd.server.drafter.swap)
     "verified": int}         # only when the speculative policy verified fewer than block_size - 1 proposals:
                              # how many leading proposals the target checked (server/goodput/step.py)

A step that verified no proposal (the goodput policy's k = 0: a plain decode step) adds no record.

Tokens emitted by that verify step = accepted + 1 (the bonus token). SGLang itself reports the request's mean
acceptance length (``spec_accept_length``) and verify count (``spec_verify_ct``) in ``meta_info`` always.
When the server records live traffic (:mod:`sglang_specopd.server.traffic.spool`), every request's records are also kept
in the scheduler (:func:`take_all`) for the traffic spool; they reach ``meta_info`` only for requests that asked.
Pure Python, no torch import: the scheduler hands lists in.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence

TRACE_KEY = "specopd_trace"
_PENDING_ATTR = "_specopd_trace_pending"
_ALL_ATTR = "_specopd_trace_all"


def check_trace_param(custom_params: Any) -> None:
    """Raise ``ValueError`` (HTTP 400 from SGLang's routes) if ``custom_params["specopd_trace"]`` is present and not
    a JSON boolean (``"yes"``, ``1``, ``{}`` ... were taken by truthiness before).

    Args:
        custom_params: a request's ``sampling_params.custom_params`` (any JSON value; only a dict can hold the key).
    """
    check_bool_param(custom_params, TRACE_KEY)


def check_bool_param(custom_params: Any, key: str) -> None:
    """Raise ``ValueError`` (HTTP 400) if ``custom_params[key]`` is present and not a JSON boolean."""
    if isinstance(custom_params, dict) and key in custom_params:
        value = custom_params[key]
        if not isinstance(value, bool):
            raise ValueError(f"custom_params.{key} must be true or false, got {type(value).__name__} "
                             f"{str(value)[:40]!r}")


def verify_trace_param(result: Any, sampling_params: Any, *args: Any, **kwargs: Any) -> Any:
    """AFTER hook on SGLang's ``SamplingParams.verify`` (HTTP process: ``/generate`` and the OpenAI API):
    :func:`check_trace_param` on the request's ``custom_params``; returns ``result`` unchanged."""
    check_trace_param(getattr(sampling_params, "custom_params", None))
    return result


def wants_trace(req: Any) -> bool:
    """True if the request's ``custom_params`` ask for a trace (``{"specopd_trace": true}``)."""
    params = getattr(getattr(req, "sampling_params", None), "custom_params", None)
    return isinstance(params, dict) and params.get(TRACE_KEY) is True


def record_verify_step(reqs: Sequence[Any], anchors: Sequence[int], proposed: Sequence[Sequence[int]],
                       accepted: Sequence[int], version: str, *, keep_all: bool = False,
                       verified: Optional[int] = None) -> None:
    """Append one verify record to every request in ``reqs`` that asked for a trace (and, with ``keep_all``, to
    every request's full trace, :func:`take_all`).

    Args:
        reqs: the batch's requests, row-aligned with the other arguments (len bs).
        anchors: anchor positions per row (ints).
        proposed: per row, the drafted token ids (block_size - 1 ints).
        accepted: per row, number of accepted drafted tokens.
        version: the version of the drafter that proposed these blocks (the serving one at this verify step).
        keep_all: also keep the record for requests that did not ask (live-traffic recording).
        verified: how many leading proposals the target checked, when fewer than all (None: all of them).
    """
    version = str(version)
    for req, anchor, prop, acc in zip(reqs, anchors, proposed, accepted):
        asked = wants_trace(req)
        if not (asked or keep_all):
            continue
        rec = {"anchor": int(anchor), "proposed": [int(t) for t in prop], "accepted": int(acc),
               "drafter_version": version}
        if verified is not None:
            rec["verified"] = int(verified)
        if asked:
            _push(req, _PENDING_ATTR, rec)
        if keep_all:
            _push(req, _ALL_ATTR, rec)


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


def take_all(req: Any) -> List[dict]:
    """Return and clear every record kept for ``req`` with ``keep_all`` (the live-traffic spool's copy)."""
    return _take(req, _ALL_ATTR)


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


_VERIFY_K_PENDING = "_specopd_verify_k_pending"


def record_verify_k(reqs: Sequence[Any], k: int) -> None:
    """Note that this decode step verified ``k`` drafts for every request in ``reqs`` (the goodput policy's choice;
    ``meta_info["specopd_verify_k"]``: one int per verify step)."""
    for req in reqs:
        _push(req, _VERIFY_K_PENDING, int(k))


def take_pending_verify_k(req: Any) -> List[int]:
    """The k of ``req``'s verify steps since its last streamed output ([] if none)."""
    return _take(req, _VERIFY_K_PENDING)


def has_pending_verify_k(req: Any) -> bool:
    """Whether ``req`` has k values not yet streamed."""
    return bool(getattr(req, _VERIFY_K_PENDING, None))
