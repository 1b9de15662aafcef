"""Which drafter versions a Draft-OPD run has served, and how stale a verify record is.

The run keeps an ordered ledger of the versions the server served since it started: the serving version when
the run began, then every version it pushed (``push(step, drafter)`` returns the version it pushed, else the
server's drafter info is asked). A record's staleness is the number of pushes since its version was pushed
(0: the latest). With ``max_staleness`` set, records staler than it are dropped, and so are records whose version
the ledger does not know (no ``drafter_version``, or another trainer's push), unless ``keep_unknown``.
The ledger is persisted in the run directory (``versions.json``, written atomically) and a resumed run keeps
the entries of the steps before the checkpoint it resumes from, so it judges staleness as the uninterrupted
run did.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from specopd_trainer.algorithms.draft_opd.rollouts import TracedRollout

VERSIONS_FILE = "versions.json"


def serving_version(client) -> Optional[str]:
    """The drafter version the server serves now (``GET`` drafter info), or None when the client cannot say."""
    from sglang_specopd.wire.protocol import DRAFTER_INFO_PATH

    request = getattr(client, "_request", None)
    if request is None:
        return None
    version = request("GET", DRAFTER_INFO_PATH).json().get("version")
    return None if version is None else str(version)


class VersionLedger:
    """Ordered versions served during the run: entries ``{"step", "version"}`` (step -1: before the first step).

    run_dir: where ``versions.json`` lives; start_step: the step the run (re)starts from (entries of later steps,
    written before a crash, are dropped); write: persist (rank 0)."""

    def __init__(self, run_dir: Path, start_step: int, write: bool = True):
        self.path = Path(run_dir) / VERSIONS_FILE
        self.write = write
        entries = json.loads(self.path.read_text()) if self.path.is_file() else []
        self.entries: List[Dict] = [e for e in entries if int(e["step"]) < start_step]

    @property
    def versions(self) -> List[str]:
        """Versions in serving order."""
        return [e["version"] for e in self.entries]

    def note(self, step: int, version: Optional[str]) -> None:
        """Record that ``version`` serves from ``step`` on (a repeat of the latest version is not a new push)."""
        if version is None or (self.entries and self.entries[-1]["version"] == version):
            return
        self.entries.append({"step": int(step), "version": version})
        if self.write:
            from specopd_trainer.checkpoint import atomic_write_bytes

            data = json.dumps(self.entries).encode()
            atomic_write_bytes(self.path, lambda fh: fh.write(data))

    def staleness(self, version: Optional[str]) -> Optional[int]:
        """Pushes since ``version`` was served (0: the latest), None when unknown."""
        versions = self.versions
        if version is None or version not in versions:
            return None
        return versions[::-1].index(version)


def drop_stale(rollouts: List[TracedRollout], ledger: VersionLedger, max_staleness: Optional[int],
               keep_unknown: bool = False) -> Tuple[List[TracedRollout], Dict[str, int]]:
    """``rollouts`` without the records staler than ``max_staleness`` pushes (None: keep all) and, unless
    ``keep_unknown``, without records of versions the ledger does not know. Returns (rollouts, counts) with counts
    ``stale_records`` and ``unknown_version_records`` (dropped)."""
    counts = {"stale_records": 0, "unknown_version_records": 0}
    if max_staleness is None:
        return rollouts, counts
    out = []
    for r in rollouts:
        kept = []
        for x in r.records:
            s = ledger.staleness(x.drafter_version)
            if s is None and not keep_unknown:
                counts["unknown_version_records"] += 1
            elif s is not None and s > max_staleness:
                counts["stale_records"] += 1
            else:
                kept.append(x)
        out.append(TracedRollout(r.token_ids, r.prompt_len, kept))
    return out, counts
