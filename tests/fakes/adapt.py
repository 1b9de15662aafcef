"""The adapter tests' fake traffic server (:class:`FakeSpool`: traffic pages, captured features, score_trees
features, the served version) and synthetic served sequences (:func:`seq_ids`, :func:`run_ids`, :func:`features`);
used by test_adapt.py and test_fleet_adapt.py."""

from __future__ import annotations

from types import SimpleNamespace

import torch


D = 32  # the tiny drafter's context-feature width (1 target layer x hidden 32)


def seq_ids(seed: int, length: int):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, 97, (length,), generator=g)
    ids[1::2] = ids[0::2] % 50 + 4  # learnable: every odd token follows the even one before it
    return ids.tolist()


def run_ids(seed: int, length: int, prompt_len: int = 8):
    """A random prompt, then a response of runs of 8 equal tokens: a drafter that learns to repeat its anchor
    token accepts most of a block; the random-init tiny drafter accepts almost nothing."""
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(4, 97, (prompt_len,), generator=g).tolist()
    runs = torch.randint(4, 97, ((length - prompt_len) // 8 + 1,), generator=g).tolist()
    return prompt + [t for t in runs for _ in range(8)][:length - prompt_len]


def features(ids, layer=0):
    """Deterministic per-prefix features: row p depends only on ids[:p+1] (as a causal target's would)."""
    rows = []
    acc = torch.zeros(D)
    for t in ids:
        g = torch.Generator().manual_seed(int(t) * 7919 + layer)
        acc = 0.5 * acc + torch.randn(D, generator=g)
        rows.append(acc.clone())
    return torch.stack(rows)


class FakeSpool:
    """Stands in for SpecOPDClient's traffic / features / score_trees / version routes."""

    def __init__(self, items=(), spool_id="spool-a", prefix=0):
        self.spool_id, self.items, self.prefix = spool_id, list(items), prefix
        self.pages, self.feature_calls, self.score_calls, self.version = 0, 0, 0, "initial"

    def add(self, seq, ids, prompt_len, trace=None, features=True, **extra):
        item = {"seq": seq, "input_ids": ids, "prompt_len": prompt_len, "finished_at": 1.0,
                "trace": trace if trace is not None else [{"anchor": prompt_len - 1, "proposed": [5, 6, 7],
                                                           "accepted": 1, "drafter_version": self.version}]}
        if features:
            item["features"] = {"start": self.prefix, "rows": len(ids) - 1 - self.prefix}
        item.update(extra)
        self.items.append(item)
        return item

    def traffic_page(self, after, spool_id, max_items):
        self.pages += 1
        if spool_id is not None and spool_id != self.spool_id:
            after = 0
        todo = [it for it in self.items if it.get("seq", 0) > after][:max_items]
        nxt = max([after] + [it["seq"] for it in todo if isinstance(it.get("seq"), int)])
        newest = max([0] + [it["seq"] for it in self.items if isinstance(it.get("seq"), int)])
        return {"spool_id": self.spool_id, "items": todo, "next_after": nxt, "missed": 0,
                "stats": {"newest_seq": newest}}

    def traffic_features(self, seqs, spool_id):
        self.feature_calls += 1
        out = {}
        for it in self.items:
            if it["seq"] in seqs and it.get("features"):
                s = it["features"]["start"]
                out[it["seq"]] = (s, features(it["input_ids"])[s:len(it["input_ids"]) - 1].to(torch.bfloat16))
        return out, [s for s in seqs if s not in out]

    def score_trees(self, req):
        self.score_calls += 1
        return [SimpleNamespace(features=features(list(r.input_ids))) for r in req.references]
