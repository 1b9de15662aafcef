"""The architectures compared, the phases each one runs, and the run directory that lets a killed run resume.

Per architecture the phases run in :data:`PHASES` order::

    init           a fresh drafter of the architecture, sized like the reference drafter (same layers, widths,
                   block size, context layers, mask token, seed)
    sft            SFT on the SFT data for ``--sft-tokens`` supervised draft tokens (resumes mid-phase from the
                   training run's checkpoints)
    eval_sft       served tau on the held-out prompts at T0 and T1 (each temperature kept as it finishes)
    specopd        SpecOPD from the SFT drafter with the validated recipe for ``--opd-tokens`` supervised tokens
    eval_specopd   as eval_sft, for the SpecOPD drafter
    serve          ``specopd bench serve --launch-baseline``: throughput of the SpecOPD drafter vs plain serving

Layout of ``RUN`` (``--run-dir``): ``setup.json`` (the settings every phase of the run must share; another
invocation with different ones is refused), ``data/`` (the SFT data, :mod:`.data`), and per architecture
``<arch>/phases/<phase>.json`` (one finished phase, written atomically: a crash loses at most the phase in
progress), ``<arch>/phases/<phase>.<T>.json`` (one finished temperature of an evaluation phase),
``<arch>/drafter-{init,sft,specopd}/`` (the drafters), ``<arch>/{sft,specopd}/`` (training runs: metrics.jsonl,
checkpoints) and ``<arch>/serve/`` (the raw ``bench serve`` payload and server logs).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

ARCHS = ("dflash", "dflash2", "dspark")
BASELINE_ARCH = "dflash"  # paired differences: every other architecture against it
PHASES = ("init", "sft", "eval_sft", "specopd", "eval_specopd", "serve")
EVAL_PHASES = {"eval_sft": "sft", "eval_specopd": "specopd"}  # evaluation phase -> the drafter stage it measures
TEMPS = ("T0", "T1")
TEMPERATURES = {"T0": 0.0, "T1": 1.0}


class ArchsError(ValueError):
    """A bad ``--archs`` value (the message is one line for the user)."""


def select_archs(text: Optional[str]) -> List[str]:
    """The architectures named in ``text`` (comma-separated; None, "" or "all": every one), in :data:`ARCHS`
    order, each once. Raises :class:`ArchsError` naming unknown ones and listing the valid ones."""
    from draft_opd_compare.arms import select_names

    return select_names(text, ARCHS, "--archs", ArchsError)


def arch_dir(run_dir: Path, arch: str) -> Path:
    """``RUN/<arch>``."""
    return Path(run_dir) / arch


def drafter_dir(run_dir: Path, arch: str, stage: str) -> Path:
    """``RUN/<arch>/drafter-<stage>`` (stage: init, sft or specopd)."""
    return arch_dir(run_dir, arch) / f"drafter-{stage}"


def phase_path(run_dir: Path, arch: str, phase: str, temp: Optional[str] = None) -> Path:
    """``RUN/<arch>/phases/<phase>.json``, or ``<phase>.<temp>.json`` for one temperature of an evaluation."""
    name = f"{phase}.{temp}.json" if temp else f"{phase}.json"
    return arch_dir(run_dir, arch) / "phases" / name


def save_phase(run_dir: Path, arch: str, phase: str, record: Mapping[str, Any], temp: Optional[str] = None) -> Path:
    """Write one finished phase (or one temperature of an evaluation phase) atomically; returns its path."""
    from draft_opd_compare.store import atomic_write_json

    path = phase_path(run_dir, arch, phase, temp)
    atomic_write_json(path, {"arch": arch, "phase": phase, **({"temp": temp} if temp else {}), **record})
    return path


def load_phase(run_dir: Path, arch: str, phase: str, temp: Optional[str] = None) -> Optional[Dict[str, Any]]:
    """The stored record of a finished phase (or temperature), None if it has not finished."""
    path = phase_path(run_dir, arch, phase, temp)
    return json.loads(path.read_text()) if path.is_file() else None


def finished_phases(run_dir: Path, archs: Sequence[str] = ARCHS) -> Dict[str, Dict[str, Dict[str, Any]]]:
    """{arch: {phase: record}} of every finished phase of ``archs`` (phases in :data:`PHASES` order; an arch with
    none finished maps to {})."""
    return {a: {p: r for p in PHASES if (r := load_phase(run_dir, a, p)) is not None} for a in archs}


def next_phase(done: Mapping[str, Any]) -> Optional[str]:
    """The first phase of :data:`PHASES` not in ``done`` (one arch's finished phases), None when all are."""
    return next((p for p in PHASES if p not in done), None)


def missing_phases(archs: Sequence[str], done: Mapping[str, Mapping[str, Any]]) -> Dict[str, List[str]]:
    """{arch: [phases not finished]} for the architectures of ``archs`` that have any (a complete one is left
    out, so ``{}`` means nothing is missing)."""
    out = {a: [p for p in PHASES if p not in done.get(a, {})] for a in archs}
    return {a: ps for a, ps in out.items() if ps}
