"""The data every architecture trains on: the same SFT sequences and the same SpecOPD references for each.

SFT data: ``--sft-per-domain`` target responses per domain taken from the committed reference corpus
(``benchmarks/data/reference_corpus/``, the responses the shipped reference drafter was trained on; greedy samples
first, in snapshot order), leaving out every prompt of the SpecOPD references, so SpecOPD trains on prompts the SFT
never saw. A domain the snapshot cannot fill (a new machine without it, or another target whose prompts render
differently) is filled with the first remaining train-split prompts, generated at T=0 through the data server. The
chosen ids are fixed in ``RUN/data/sft/selection.json`` on first use; responses and their context features are
cached in ``RUN/data/sft/`` (``responses.jsonl``, ``features/``).

SpecOPD references: greedy target responses to the train-split prompts ``[--refs-offset, --refs-offset +
--refs-per-domain)`` of every domain with their features (:func:`specopd_trainer.pipeline.prepare_sequences`,
cached in ``--refs-dir``; the default is the Draft-OPD comparison's cache, the same prompts and settings).
Evaluation prompts (the eval split) enter neither.

Building either needs a server (generation, ``score_trees`` features); :func:`cached` says whether everything is
on disk, so a resumed run starts the data server only when something is missing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

DOMAINS = ("dialogue", "coding", "math", "agentic")


def refs_records(args) -> List[dict]:
    """The SpecOPD references' prompt records (train split ``[refs_offset, refs_offset + refs_per_domain)``)."""
    from specopd_trainer.pipeline import train_split_records

    return train_split_records(args.refs_offset, args.refs_per_domain, list(args.domains))


def choose_sft_ids(snapshot_ids: Sequence[Tuple[str, str]], fallback: Dict[str, List[str]], exclude: set,
                   per_domain: int, domains: Sequence[str]) -> Dict[str, List[str]]:
    """The SFT response ids per domain: ``per_domain`` of ``snapshot_ids`` ((id, domain) in snapshot order; greedy
    ids, without ``#s``, before sampled ones) whose prompt (the id before ``#``) is not in ``exclude``; a domain
    left short is filled from ``fallback[domain]`` (train-split prompt ids in order), skipping excluded and chosen
    ones."""
    out: Dict[str, List[str]] = {d: [] for d in domains}
    ordered = sorted(snapshot_ids, key=lambda x: "#s" in x[0])  # stable: greedy first, snapshot order within
    for rid, dom in ordered:
        if dom in out and len(out[dom]) < per_domain and rid.split("#")[0] not in exclude:
            out[dom].append(rid)
    for d in domains:
        for rid in fallback.get(d, []):
            if len(out[d]) >= per_domain:
                break
            if rid not in exclude and rid not in out[d]:
                out[d].append(rid)
    return out


def sft_selection(args, run_dir: Path) -> Dict[str, List[str]]:
    """The SFT ids per domain: ``RUN/data/sft/selection.json`` when it exists (a resumed run never re-chooses),
    else :func:`choose_sft_ids` over ``--sft-snapshot`` and the train split, written there."""
    from specopd_trainer.data.snapshot import iter_snapshot
    from specopd_trainer.pipeline import train_split_records

    path = Path(run_dir) / "data" / "sft" / "selection.json"
    if path.is_file():
        return json.loads(path.read_text())["ids"]
    snap = [(r["id"], r["domain"]) for r in iter_snapshot(args.sft_snapshot)] if args.sft_snapshot else []
    exclude = {r["id"] for r in refs_records(args)}
    fallback = {d: [r["id"] for r in train_split_records(0, 10**6, [d])] for d in args.domains}
    ids = choose_sft_ids(snap, fallback, exclude, args.sft_per_domain, args.domains)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"ids": ids, "snapshot": args.sft_snapshot, "excluded_prompts": len(exclude)}))
    return ids


def _sft_store(run_dir: Path, layer_ids):
    from specopd_trainer.features import FeatureStore

    return FeatureStore(Path(run_dir) / "data" / "sft" / "features", list(layer_ids))


def _refs_store(args, layer_ids):
    from specopd_trainer.features import FeatureStore

    return FeatureStore(Path(args.refs_dir) / "features", list(layer_ids))


def _refs_marker(args, run_dir: Path) -> Tuple[Path, dict]:
    """``RUN/data/refs_done.json`` and what it must say: the references were built for these settings."""
    return Path(run_dir) / "data" / "refs_done.json", {
        "refs_dir": str(Path(args.refs_dir).resolve()), "offset": args.refs_offset, "per_domain": args.refs_per_domain,
        "max_new_tokens": args.refs_max_new_tokens}


def cached(args, run_dir: Path, layer_ids) -> bool:
    """Whether the SFT sequences and the SpecOPD references all have their features on disk (no server needed):
    every selected SFT id has features, and :func:`build` finished the references for these settings."""
    ids = [i for v in sft_selection(args, run_dir).values() for i in v]
    sft = _sft_store(run_dir, layer_ids)
    marker, want = _refs_marker(args, run_dir)
    return all(i in sft for i in ids) and marker.is_file() and json.loads(marker.read_text()) == want


def build(args, run_dir: Path, client, tok, layer_ids) -> None:
    """Fill both caches through the server behind ``client``: the snapshot's responses imported (prompts
    re-rendered and checked, :func:`specopd_trainer.data.snapshot.import_snapshot`), the missing SFT responses and
    references generated at T=0, then every missing context feature fetched. Resumes."""
    from specopd_trainer.collect import chat_prompt_ids, iter_responses, regenerate
    from specopd_trainer.data.corpus import CorpusSpec, corpus_records
    from specopd_trainer.data.snapshot import import_snapshot
    from specopd_trainer.pipeline import prepare_sequences, train_split_records

    prepare_sequences(client, tok, list(layer_ids), Path(args.refs_dir), max_new_tokens=args.refs_max_new_tokens,
                      records=refs_records(args))
    marker, want = _refs_marker(args, run_dir)
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(json.dumps(want))
    ids = {i for v in sft_selection(args, run_dir).values() for i in v}
    cache = Path(run_dir) / "data" / "sft" / "responses.jsonl"
    records = {r["id"]: r for r in corpus_records(CorpusSpec()) if r["id"] in ids} if args.sft_snapshot else {}
    records.update({r["id"]: r for r in train_split_records(0, 10**6, list(args.domains))
                    if r["id"] in ids and r["id"] not in records})
    if args.sft_snapshot:
        counts = import_snapshot(args.sft_snapshot, cache, records, lambda r: chat_prompt_ids(tok, r["messages"]))
        print(f"SFT data: snapshot {args.sft_snapshot}: {counts}", flush=True)
    have = {r.id for r in iter_responses(cache)} if cache.is_file() else set()
    regenerate(client, tok, [records[i] for i in sorted(ids - have) if i in records], cache,
               max_new_tokens=args.sft_max_new_tokens, max_prompt_tokens=args.sft_max_prompt_tokens)
    _sft_store(run_dir, layer_ids).build(client, [r for r in iter_responses(cache) if r.id in ids])


def load(args, run_dir: Path, layer_ids) -> Tuple[list, list, Dict[str, int]]:
    """(SFT sequences, SpecOPD reference sequences, stats {sft_sequences, sft_response_tokens, refs_sequences,
    refs_response_tokens}) from the caches; SFT sequences in id order."""
    from specopd_trainer.collect import iter_responses

    ids = {i for v in sft_selection(args, run_dir).values() for i in v}
    sft = sorted(_sft_store(run_dir, layer_ids).load(ids), key=lambda s: s.id)
    cache = Path(args.refs_dir) / "responses.jsonl"
    got = {r.id for r in iter_responses(cache)} if cache.is_file() else set()
    wanted = {r["id"] for r in refs_records(args)} & got
    refs = sorted(_refs_store(args, layer_ids).load(wanted), key=lambda s: s.id)

    def tokens(seqs):
        return sum(len(s.token_ids) - s.prompt_len for s in seqs)

    return sft, refs, {"sft_sequences": len(sft), "sft_response_tokens": tokens(sft), "refs_sequences": len(refs),
                       "refs_response_tokens": tokens(refs)}
