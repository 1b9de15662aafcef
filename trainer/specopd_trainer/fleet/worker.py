"""One SPECOPD worker's side of a fleet rollout: stage / commit / abort / verify over HTTP, each as an outcome.

:class:`WorkerAdmin` wraps a :class:`~specopd_trainer.client.http.SpecOPDClient` (admin key, retries) and turns every
call into a result instead of an exception, so :class:`~specopd_trainer.fleet.rollout.FleetRollout` can act on a
whole fleet (one worker's failure never hides another's state). Wire format: :mod:`sglang_specopd.wire.rollout`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Optional, Sequence, Tuple

from sglang_specopd.wire.protocol import BINARY_CONTENT_TYPE, swap_payload
from sglang_specopd.wire.rollout import (
    ABORT_DRAFTER_PATH,
    COMMIT_DRAFTER_PATH,
    STAGE_DRAFTER_PATH,
    AbortReply,
    CommitReply,
    StageReply,
    check_txn_id,
)
from specopd_trainer.client.http import ServerError, ServerRequestError, ServerUnavailableError, SpecOPDClient

VERSIONS_KEY = "specopd_drafter_versions"  # meta_info: the drafter versions that proposed for a response


@dataclass(frozen=True)
class DrafterUpdate:
    """A drafter to roll out: its ``version`` and the swap body that carries it (``body``: safetensors bytes of
    :func:`~sglang_specopd.wire.protocol.swap_payload`, or JSON ``{"path", "version"}`` naming a directory every
    worker can read)."""

    version: str
    body: bytes

    @classmethod
    def from_checkpoint(cls, config: dict, tensors: Dict[str, Any], version: str) -> "DrafterUpdate":
        """``(config.json dict, {tensor name: CPU tensor})`` sent as bytes, with the checksum."""
        return cls(version, swap_payload(config, tensors, version))

    @classmethod
    def from_path(cls, path: str | Path, version: str) -> "DrafterUpdate":
        """A drafter directory (``config.json`` + ``model.safetensors``) each worker reads from its own disk."""
        return cls(version, json.dumps({"path": str(path), "version": version}).encode())

    @property
    def content_type(self) -> str:
        return "application/json" if self.body[:1] == b"{" else BINARY_CONTENT_TYPE


@dataclass(frozen=True)
class Step:
    """The result of one call on one worker: ``ok``, the reply (JSON dict) or the ``error`` with its HTTP
    ``status`` (None when the worker could not be reached)."""

    ok: bool
    reply: Optional[Dict[str, Any]] = None
    error: Optional[str] = None
    status: Optional[int] = None

    @property
    def conflict(self) -> bool:
        return self.status == 409


def _step(call) -> Step:
    """``call()`` as a Step: a 4xx keeps its status, a 5xx after the retries its last status, a worker that could not
    be reached status None; a reply that is not the route's JSON is an error with status 502."""
    try:
        return Step(True, reply=call())
    except ServerRequestError as exc:
        return Step(False, error=exc.reason, status=exc.status)
    except ServerUnavailableError as exc:  # unreachable (status None) / 5xx after the retries
        return Step(False, error=str(exc), status=exc.status)
    except ServerError as exc:
        return Step(False, error=str(exc))
    except ValueError as exc:  # pydantic's ValidationError is a ValueError: a malformed reply
        return Step(False, error=f"malformed reply: {str(exc)[:300]}", status=502)


class WorkerAdmin:
    """The rollout calls on one worker.

    Args:
        url: the worker's base URL.
        admin_api_key: the workers' ``--admin-api-key`` (stage / commit / abort are admin routes).
        api_key: the normal ``--api-key`` when the workers have one (``GET /specopd/drafter``, ``/generate``).
        timeout / retries / backoff_s: of the underlying client (a down worker costs about
            ``backoff_s * (2**retries - 1)`` seconds plus the connect timeouts before it is reported).
    """

    def __init__(self, url: str, *, admin_api_key: str, api_key: Optional[str] = None, timeout: float = 300.0,
                 retries: int = 2, backoff_s: float = 0.5):
        self.url = url.rstrip("/")
        self.client = SpecOPDClient(self.url, api_key=api_key, admin_api_key=admin_api_key, timeout=timeout,
                                    retries=retries, backoff_s=backoff_s)

    def close(self) -> None:
        self.client.close()

    def stage(self, txn: str, update: DrafterUpdate, ttl_s: float) -> Step:
        """``POST /specopd/drafter/stage?txn=..&ttl_s=..``; reply a :class:`StageReply` dict."""
        check_txn_id(txn)
        return _step(lambda: StageReply.model_validate_json(self.client.admin_request(
            "POST", STAGE_DRAFTER_PATH, params={"txn": txn, "ttl_s": repr(float(ttl_s))}, content=update.body,
            headers={"Content-Type": update.content_type}).content).model_dump())

    def _txn_call(self, path: str, txn: str, model):
        return _step(lambda: model.model_validate_json(self.client.admin_request(
            "POST", path, content=json.dumps({"txn": check_txn_id(txn)}).encode(),
            headers={"Content-Type": "application/json"}).content).model_dump())

    def commit(self, txn: str) -> Step:
        """``POST /specopd/drafter/commit``; reply a :class:`CommitReply` dict (409: ``txn`` not staged)."""
        return self._txn_call(COMMIT_DRAFTER_PATH, txn, CommitReply)

    def abort(self, txn: str) -> Step:
        """``POST /specopd/drafter/abort``; reply an :class:`AbortReply` dict."""
        return self._txn_call(ABORT_DRAFTER_PATH, txn, AbortReply)

    def info(self) -> Step:
        """``GET /specopd/drafter`` (``version``, ``staged`` ...)."""
        return _step(self.client.drafter_info)

    def probe_versions(self, input_ids: Sequence[int], max_new_tokens: int) -> Step:
        """A greedy ``/generate`` started now; reply ``{"versions": meta_info["specopd_drafter_versions"]}``: every
        drafter version that proposed for it."""
        def call():
            out = self.client.generate(list(input_ids), max_new_tokens=max_new_tokens, ignore_eos=True)
            return {"versions": list((out.get("meta_info") or {}).get(VERSIONS_KEY) or [])}

        return _step(call)

    def serving(self, version: str, probe: Optional[Tuple[Sequence[int], int]] = None) -> Step:
        """Whether the worker serves ``version``: ``GET /specopd/drafter`` says so and, with ``probe`` (input ids,
        new tokens), a response started now was drafted by ``version`` only. ``reply``: ``{"version",
        "probe_versions"}`` (what was seen); ``ok`` False with the reason otherwise."""
        info = self.info()
        if not info.ok:
            return info
        seen = {"version": info.reply.get("version"), "probe_versions": None}
        if seen["version"] != version:
            return Step(False, reply=seen, error=f"serves version {seen['version']!r}, not {version!r}")
        if probe is not None:
            got = self.probe_versions(*probe)
            if not got.ok:
                return Step(False, reply=seen, error=f"probe failed: {got.error}", status=got.status)
            seen["probe_versions"] = got.reply["versions"]
            if not seen["probe_versions"] or set(seen["probe_versions"]) != {version}:
                return Step(False, reply=seen, error=f"a response started after the commit was drafted by "
                                                     f"{seen['probe_versions']!r}, not only {version!r}")
        return Step(True, reply=seen)
