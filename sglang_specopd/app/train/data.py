"""Data and run configuration of ``specopd train``: ``--data`` parsing, training sequences and rollout prompts,
and the run_config.json check that guards resumes. Heavy dependencies are imported inside the functions."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

from sglang_specopd.app.train.options import _TrainFail
from sglang_specopd.app.train.session import _Session

# options that may change between a run and its resume (the rest must match run_config.json)
_RESUMABLE_CHANGES = ("steps", "max_minutes", "push_every", "log_every", "ckpt_every", "parallel")


def _parse_domains(data: str) -> Optional[List[str]]:
    """The domain list of ``--data``, or None when it names a directory; raises for anything else."""
    from specopd_trainer.data import DOMAINS

    if Path(data).is_dir():
        return None
    if "/" in data or data.startswith(".") or Path(data).exists():
        raise _TrainFail(f"--data {data}: not a directory (a data directory holds responses.jsonl and features/)")
    names = [d.strip() for d in data.split(",") if d.strip()]
    unknown = [d for d in names if d not in DOMAINS]
    if not names or unknown:
        what = f"unknown domain {unknown[0]!r}" if unknown else "empty"
        raise _TrainFail(f"--data {data!r}: {what}; pass a directory holding responses.jsonl and features/, or a "
                         f"comma list of domains ({', '.join(DOMAINS)})")
    return names


def _rank_zero_first(rank: int, world: int, fn):
    """``fn()`` on rank 0, then (after a barrier) on the others: rank 0 fills caches the others then read."""
    if world == 1:
        return fn()
    import torch.distributed as dist

    out = fn() if rank == 0 else None
    dist.barrier()
    return out if rank == 0 else fn()


def _load_sequences(sess: _Session, data: str, layer_ids, run_dir: Path, *, per_domain: int, max_new_tokens: int,
                    rank: int, world: int, say):
    """(train, holdout) Sequence lists from ``--data`` (see :func:`~sglang_specopd.app.train.options._o_data`)."""
    from specopd_trainer.pipeline import prepare_sequences, split_holdout

    domains = _parse_domains(data)
    if domains is not None:
        tok = sess.tokenizer()
        say(f"target responses for {', '.join(domains)} ({per_domain} prompts each, up to {max_new_tokens} "
            f"tokens), cached in {run_dir / 'data'}")
        return _rank_zero_first(rank, world, lambda: prepare_sequences(
            sess.client, tok, layer_ids, run_dir / "data", domains=domains, per_domain=per_domain,
            max_new_tokens=max_new_tokens))
    root = Path(data)
    responses, features = root / "responses.jsonl", root / "features"
    for need in (responses, features):
        if not need.exists():
            raise _TrainFail(f"--data {root}: {need.name} is missing (a data directory holds responses.jsonl and "
                             "features/, as `prepare_sequences` writes them)")

    def load():
        from specopd_trainer.collect import iter_responses
        from specopd_trainer.features import FeatureStore

        try:
            store = FeatureStore(features, list(layer_ids))
        except ValueError as exc:
            raise _TrainFail(f"--data {root}: {exc} (features of another drafter's layers)") from None
        missing = [r for r in iter_responses(responses) if r.id not in store]
        if missing:
            say(f"fetching context features of {len(missing)} responses from the server")
            store.build(sess.client, missing)
        return store.load()

    seqs = _rank_zero_first(rank, world, load)
    if not seqs:
        raise _TrainFail(f"--data {root}: no sequences in {responses}")
    return split_holdout(seqs)


def _load_prompts(sess: _Session, data: str, *, per_domain: int, max_prompt_tokens: int) -> List[List[int]]:
    """Rollout prompts (token ids) from ``--data``: the prompts of responses.jsonl, or the train split of domains."""
    domains = _parse_domains(data)
    if domains is None:
        from specopd_trainer.collect import iter_responses

        path = Path(data) / "responses.jsonl"
        if not path.is_file():
            raise _TrainFail(f"--data {data}: responses.jsonl is missing")
        prompts = [list(r.prompt_ids) for r in iter_responses(path)]
    else:
        from specopd_trainer.collect import chat_prompt_ids
        from specopd_trainer.data import domain_split

        tok = sess.tokenizer()
        prompts = []
        for d in domains:
            train, _ = domain_split(d)
            prompts += [chat_prompt_ids(tok, r["messages"]) for r in train[:per_domain]]
    seen, out = set(), []
    for p in prompts:
        if len(p) <= max_prompt_tokens and tuple(p) not in seen:
            seen.add(tuple(p))
            out.append(p)
    if not out:
        raise _TrainFail(f"--data {data}: no prompts of at most {max_prompt_tokens} tokens")
    return out


def _check_run_config(run_dir: Path, record: dict, rank: int) -> bool:
    """Refuse to resume a run with different method/data options; record them. Returns True when resuming."""
    import json

    from specopd_trainer.checkpoint import latest_checkpoint

    path = run_dir / "run_config.json"
    resuming = latest_checkpoint(run_dir) is not None
    if resuming and path.is_file():
        old = json.loads(path.read_text())
        diff = sorted(k for k in set(old) | set(record) if old.get(k) != record.get(k))
        if diff:
            raise _TrainFail(f"{run_dir} holds a run with other options ("
                             + "; ".join(f"{k}: {old.get(k)!r} then, {record.get(k)!r} now" for k in diff)
                             + "); pass the same options to resume, or a new --run-dir")
    if rank == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, indent=2) + "\n")
    return resuming


def _record(method: str, cfg, data: str, domains_opts: dict) -> dict:
    opts = {k: v for k, v in cfg.model_dump().items() if k not in _RESUMABLE_CHANGES}
    return {"method": method, "data": data, **({} if Path(data).is_dir() else domains_opts), **opts}
