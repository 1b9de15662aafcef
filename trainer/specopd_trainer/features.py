"""Target context features for training sequences, fetched from the live server and cached on disk.

The trainer never runs the target: for each sequence (prompt + target response) the server returns the hidden
states at the drafter's ``target_layer_ids`` (SGLang's DFlash capture convention) as a binary payload from
``POST /specopd/score_trees`` (``feature_layer_ids``, no trees). Measured cost and the alternative (SGLang's
JSON hidden-state return) are in the README. Features are stored as safetensors shards
``<dir>/shard-<k>.safetensors`` with tensors ``ids.<n>`` (int32 [L]) and ``feat.<n>`` ([L, K*H], bf16 by
default) plus ``index.json`` ({sequence id: [shard, n, prompt_len]}); an interrupted build resumes.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Tuple

import torch


@dataclass(frozen=True)
class Sequence:
    """One training sequence: token ids [L] (int64), features [L, K*H], and where the response starts."""

    id: str
    domain: str
    token_ids: torch.Tensor
    features: torch.Tensor
    prompt_len: int


class FeatureStore:
    """Disk cache of (token ids, context features) per sequence id."""

    def __init__(self, root: str | Path, layer_ids: List[int]):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.layer_ids = list(layer_ids)
        self._index_path = self.root / "index.json"
        self.index: Dict[str, list] = json.loads(self._index_path.read_text()) if self._index_path.is_file() else {}
        meta = self.root / "meta.json"
        if meta.is_file():
            stored = json.loads(meta.read_text())["layer_ids"]
            if stored != self.layer_ids:
                raise ValueError(f"feature cache {self.root} holds layer ids {stored}, not {self.layer_ids}")
        else:
            meta.write_text(json.dumps({"layer_ids": self.layer_ids}))

    def __contains__(self, seq_id: str) -> bool:
        return seq_id in self.index

    def _write_index(self) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".index.", suffix=".tmp")
        with os.fdopen(fd, "w") as fh:
            json.dump(self.index, fh)
        os.replace(tmp, self._index_path)

    def build(self, client, items: Iterable[dict], *, batch: int = 8, shard_size: int = 64,
              dtype: str = "bfloat16", progress: bool = True) -> int:
        """Fetch features for every response item not cached yet (dicts or
        :class:`specopd_trainer.collect.CachedResponse`: id, domain, prompt_ids, response_ids).

        Returns the number of sequences added. One ``score_trees`` call per ``batch`` sequences; a shard file is
        written atomically every ``shard_size`` sequences, then the index (so a crash loses at most one shard).
        """
        from safetensors.torch import save_file

        from sglang_specopd.wire.protocol import ScoreTreesRequest

        todo = [it if isinstance(it, dict) else {"id": it.id, "domain": it.domain, "prompt_ids": it.prompt_ids,
                                                   "response_ids": it.response_ids} for it in items]
        todo = [it for it in todo if it["id"] not in self.index]
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=sum(len(it["prompt_ids"]) + len(it["response_ids"]) for it in todo), unit="tok",
                       desc="context features", dynamic_ncols=True)
        shard_no = len(list(self.root.glob("shard-*.safetensors")))
        pending: Dict[str, torch.Tensor] = {}
        pending_index: Dict[str, list] = {}
        added = 0

        def flush():
            nonlocal shard_no, pending, pending_index
            if not pending:
                return
            name = f"shard-{shard_no:05d}.safetensors"
            fd, tmp = tempfile.mkstemp(dir=self.root, prefix=f".{name}.", suffix=".tmp")
            os.close(fd)
            save_file(pending, tmp)
            os.replace(tmp, self.root / name)
            for k, v in pending_index.items():
                self.index[k] = [name] + v
            self._write_index()
            shard_no += 1
            pending, pending_index = {}, {}

        for start in range(0, len(todo), batch):
            chunk = todo[start : start + batch]
            refs = [{"input_ids": list(it["prompt_ids"]) + list(it["response_ids"])} for it in chunk]
            req = ScoreTreesRequest(references=refs, block_size=2, returns=[], feature_layer_ids=self.layer_ids,
                                    output_dtype=dtype)
            scored = client.score_trees(req)
            for it, ref, sc in zip(chunk, refs, scored):
                n = len(pending_index)
                pending[f"ids.{n}"] = torch.tensor(ref["input_ids"], dtype=torch.int32)
                pending[f"feat.{n}"] = sc.features
                pending_index[it["id"]] = [n, len(it["prompt_ids"]), it.get("domain", "")]
                added += 1
                if bar is not None:
                    bar.update(len(ref["input_ids"]))
            if len(pending_index) >= shard_size:
                flush()
        flush()
        if bar is not None:
            bar.close()
        return added

    def load(self, ids: Optional[Iterable[str]] = None) -> List[Sequence]:
        """Load sequences (all, or the given ids) into memory, features as stored (bf16 by default)."""
        from safetensors.torch import load_file

        wanted = list(self.index) if ids is None else [i for i in ids if i in self.index]
        by_shard: Dict[str, List[Tuple[str, list]]] = {}
        for sid in wanted:
            shard, n, prompt_len, domain = self.index[sid]
            by_shard.setdefault(shard, []).append((sid, [n, prompt_len, domain]))
        out = []
        for shard, members in sorted(by_shard.items()):
            tensors = load_file(str(self.root / shard))
            for sid, (n, prompt_len, domain) in members:
                out.append(Sequence(id=sid, domain=domain, token_ids=tensors[f"ids.{n}"].long(),
                                    features=tensors[f"feat.{n}"], prompt_len=int(prompt_len)))
        return out
