"""Do all workers of a fleet serve the same target and the same drafter architecture? (checked before a trainer
mixes their answers).

Each worker's ``GET /specopd/drafter`` reports ``target`` (``{"fingerprint", "dtype"}``,
:mod:`sglang_specopd.wire.target_fingerprint`), the serving drafter's ``arch`` and ``spec``. :func:`check_fleet`
accepts the fleet when every worker reports the same target fingerprint and dtype, and the same drafter
architecture and spec (the weights' dtype aside, as a swap ignores it); otherwise it raises
:class:`FleetMismatchError` naming which workers disagree on what. Drafter *versions* may differ (a worker that
missed a rollout): :attr:`FleetIdentity.versions` lists them, and a push brings the fleet to one version.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple

from specopd_trainer.client.http import ServerError


class FleetMismatchError(ServerError):
    """The workers do not serve the same target or drafter architecture (the message says which and how)."""


@dataclass(frozen=True)
class FleetIdentity:
    """What every worker of the fleet serves: the target's ``fingerprint`` and ``dtype``, the drafter's ``arch``
    (None: no drafter) and ``spec`` (dict), and each worker's drafter ``versions`` (url -> version)."""

    fingerprint: str
    dtype: str
    arch: Optional[str]
    spec: Dict[str, Any]
    versions: Tuple[Tuple[str, str], ...]

    @property
    def version(self) -> Optional[str]:
        """The drafter version every worker serves, or None when they differ."""
        seen = {v for _, v in self.versions}
        return seen.pop() if len(seen) == 1 else None


def _short(value: Any) -> str:
    text = str(value)
    return text[:19] + "..." if text.startswith("sha256:") and len(text) > 22 else text


def _groups(values: Mapping[str, Any]) -> List[Tuple[str, List[str]]]:
    out: Dict[str, List[str]] = {}
    for url, v in values.items():
        out.setdefault(repr(v) if not isinstance(v, str) else v, []).append(url)
    return sorted(out.items(), key=lambda kv: kv[1])


def _disagree(what: str, values: Mapping[str, Any]) -> Optional[str]:
    groups = _groups(values)
    if len(groups) <= 1:
        return None
    return f"{what} differs: " + "; ".join(f"{_short(v)} on {', '.join(urls)}" for v, urls in groups)


def check_fleet(infos: Mapping[str, Mapping[str, Any]]) -> FleetIdentity:
    """The fleet's common identity from each worker's ``GET /specopd/drafter`` reply (url -> reply).

    Raises:
        ValueError: ``infos`` is empty.
        FleetMismatchError: a worker does not report its target (a server without this field), or the workers
            differ in target fingerprint, served dtype, drafter architecture or drafter spec.
    """
    if not infos:
        raise ValueError("check_fleet needs at least one worker")
    missing = [u for u, i in infos.items() if not isinstance(i.get("target"), Mapping)
               or not isinstance(i["target"].get("fingerprint"), str)]
    if missing:
        raise FleetMismatchError(f"{', '.join(missing)} do(es) not report the target it serves (GET /specopd/drafter "
                                 "has no target.fingerprint): every worker must run this sglang-specopd")
    fps = {u: i["target"]["fingerprint"] for u, i in infos.items()}
    problems = [_disagree("the target (fingerprint of its checkpoint)", fps),
                _disagree("the served dtype", {u: str(i["target"].get("dtype")) for u, i in infos.items()}),
                _disagree("the drafter architecture", {u: str(i.get("arch")) for u, i in infos.items()})]
    if not any(problems):
        specs = {u: {k: v for k, v in (i.get("spec") or {}).items() if k != "dtype"} for u, i in infos.items()}
        problems.append(_disagree("the drafter spec", specs))
    problems = [p for p in problems if p]
    unreadable = sorted({f for f in fps.values() if f.startswith("unreadable")})
    if problems or unreadable:
        why = problems + [f"a worker could not fingerprint its target ({u})" for u in unreadable]
        raise FleetMismatchError("the workers do not serve the same model, so their answers cannot be mixed: "
                                 + " | ".join(why))
    first = next(iter(infos.values()))
    return FleetIdentity(fingerprint=first["target"]["fingerprint"], dtype=str(first["target"].get("dtype")),
                         arch=first.get("arch"), spec=dict(first.get("spec") or {}),
                         versions=tuple((u, str(i.get("version"))) for u, i in infos.items()))
