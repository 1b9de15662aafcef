"""``specopd adapt --algorithm auto`` (the default schedule): SFT from traffic until the guard's held-out gain
flattens, then the algorithm the table below names for the serving temperature and the drafter's architecture.

**Flattened** (:func:`flattened`): the last ``auto_flat_verdicts`` (K) candidate verdicts that ran all measured a
held-out greedy-walk gain (candidate - deployed tau, ``diff``) below ``auto_flat_gain``. After a push the candidate
trains on from the deployed drafter, so each verdict's gain is what SFT added since the last push: K small gains in a
row mean SFT has plateaued on this traffic.

**The table** (:data:`AUTO_TABLE`) is where measured wins are recorded: ``(arch, temperature) -> Choice``. An entry
names an OPD algorithm only when ``benchmarks/results/opd_regimes_smollm2_cpu.json`` (issue 52) shows that arm
beating continued SFT there with its paired 95% interval above 0. None does yet (the regimes are not yet measured;
every committed comparison from a converged start has OPD at or below SFT at T=0), so today every entry keeps SFT,
and says so in the progress line and the run summary. The switched algorithm keeps the same retention (the
rehearsal share of every step is the adapter's, not the algorithm's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Iterable, Mapping, Optional, Tuple

NO_WIN = ("no measured OPD win for this regime (benchmarks/results/opd_regimes_smollm2_cpu.json: not yet "
          "measured); SFT keeps training")


@dataclass(frozen=True)
class Choice:
    """What ``auto`` trains with after SFT has flattened, and the evidence for it (a result file and its numbers)."""

    algorithm: str
    evidence: str


def temperature_key(temperature: float) -> str:
    """``"T0"`` for greedy serving (temperature 0), ``"T1"`` for sampled serving (any temperature > 0)."""
    return "T0" if temperature <= 0 else "T1"


# (drafter architecture, serving temperature key) -> what auto switches to once SFT has flattened.
AUTO_TABLE: Dict[Tuple[str, str], Choice] = {
    (arch, t): Choice("sft", NO_WIN) for arch in ("dflash", "dflash2", "dspark") for t in ("T0", "T1")
}


def choose(arch: str, temperature: float, table: Optional[Mapping[Tuple[str, str], Choice]] = None) -> Choice:
    """The table's choice for ``arch`` served at ``temperature``; SFT (no measured win) for a pair not in it."""
    table = AUTO_TABLE if table is None else table
    return table.get((arch, temperature_key(temperature)), Choice("sft", NO_WIN))


def flattened(verdicts: Iterable[Dict[str, Any]], k: int, threshold: float) -> bool:
    """True when the last ``k`` candidate verdicts that ran all have a held-out gain (``diff``) below ``threshold``
    (fewer than ``k`` such verdicts: False)."""
    ran = [v for v in verdicts if v.get("kind") == "candidate" and v.get("ran") and v.get("diff") is not None]
    return len(ran) >= k and all(float(v["diff"]) < threshold for v in ran[-k:])


def new_schedule() -> Dict[str, Any]:
    """The schedule record kept in the adapter's state (and its checkpoint): phase ``sft`` until flattened."""
    return {"mode": "auto", "phase": "sft", "algorithm": "sft", "switched_at_step": None, "choice": None,
            "evidence": None}


def advance(schedule: Dict[str, Any], verdicts, *, k: int, threshold: float, arch: str, temperature: float,
            step: int, table: Optional[Mapping[Tuple[str, str], Choice]] = None) -> Optional[str]:
    """Move ``schedule`` (in place) past the SFT phase once the gain has flattened. Returns the algorithm to train
    with from now on when it changed, else None (also when the table keeps SFT: the phase becomes ``chosen``)."""
    if schedule.get("phase") != "sft" or not flattened(verdicts, k, threshold):
        return None
    c = choose(arch, temperature, table)
    schedule.update(phase="chosen", switched_at_step=step, choice=c.algorithm, evidence=c.evidence,
                    temperature=temperature_key(temperature), arch=arch)
    changed = c.algorithm != schedule["algorithm"]
    schedule["algorithm"] = c.algorithm
    return c.algorithm if changed else None


def describe(schedule: Optional[Dict[str, Any]]) -> str:
    """The schedule's part of the progress line: ``auto: sft until the gain flattens`` or ``auto: sft -> draft-opd
    at step 300`` / ``auto: flattened at step 300, sft kept (no measured OPD win ...)``."""
    if not schedule or schedule.get("mode") != "auto":
        return ""
    if schedule["phase"] == "sft":
        return "auto: sft until the held-out gain flattens"
    if schedule["choice"] == "sft":
        return f"auto: flattened at step {schedule['switched_at_step']}, sft kept ({schedule['evidence']})"
    return f"auto: sft -> {schedule['choice']} at step {schedule['switched_at_step']} ({schedule['evidence']})"
