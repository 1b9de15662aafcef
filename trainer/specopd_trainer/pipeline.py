"""Glue shared by ``specopd train ...`` and the benchmark scripts: data from a live server, pushes, splits."""

from __future__ import annotations

from pathlib import Path
from typing import List, Sequence, Tuple

DOMAINS = ["dialogue", "coding", "math", "agentic"]


def prepare_sequences(client, tokenizer, layer_ids: Sequence[int], run_dir: str | Path, *,
                      domains: Sequence[str] = DOMAINS, per_domain: int = 60, max_new_tokens: int = 160,
                      concurrency: int = 16, records=None) -> Tuple[List, List]:
    """Regenerate target responses for the TRAIN split of ``domains`` (or ``records``), fetch their context
    features from the server, and return (train, holdout) :class:`~specopd_trainer.features.Sequence` lists.

    Everything is cached under ``run_dir`` (``responses.jsonl``, ``features/``), so a re-run resumes. Holdout =
    the first 5% (at least 8) of the sequences sorted by id: responses never used for training, used for the
    offline greedy-walk tau. Evaluation prompts (the eval split) never enter either list.
    """
    from specopd_trainer.collect import iter_responses, regenerate
    from specopd_trainer.features import FeatureStore

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if records is None:
        records = train_split_records(0, per_domain, domains)
    cache = run_dir / "responses.jsonl"
    regenerate(client, tokenizer, records, cache, max_new_tokens=max_new_tokens, concurrency=concurrency)
    store = FeatureStore(run_dir / "features", list(layer_ids))
    store.build(client, iter_responses(cache))
    return split_holdout(store.load())


def train_split_records(offset: int, per_domain: int, domains: Sequence[str] = DOMAINS) -> List[dict]:
    """Prompt records ``[offset, offset + per_domain)`` of each domain's TRAIN split (fewer where it is shorter),
    in domain order. Disjoint ranges give disjoint prompt sets: the SFT data (``[0, per_domain)`` in
    :func:`prepare_sequences`), validation and fresh reference sets are carved out this way; the eval split never
    enters."""
    from specopd_trainer.data import domain_split

    out: List[dict] = []
    for d in domains:
        train, _ = domain_split(d)
        out += list(train[offset:offset + per_domain])
    return out


def split_holdout(seqs: List) -> Tuple[List, List]:
    """(train, holdout): holdout = first max(8, 5%) sequences by id (deterministic)."""
    seqs = sorted(seqs, key=lambda s: s.id)
    n_hold = max(8, len(seqs) // 20) if len(seqs) > 16 else max(1, len(seqs) // 4)
    return seqs[n_hold:], seqs[:n_hold]


def push_drafter(url: str, drafter, version: str, admin_api_key: str, timeout: float = 300.0) -> dict:
    """Hot-swap ``drafter`` into the server at ``url`` (admin route; safetensors body with a checksum).

    Raises ``specopd_trainer.client.http.ServerRequestError`` when the server refuses (the old drafter keeps serving).
    """
    return push_checkpoint(url, drafter.checkpoint_config(), drafter.checkpoint_tensors(), version, admin_api_key,
                           timeout)


def push_checkpoint(url: str, config: dict, tensors: dict, version: str, admin_api_key: str,
                    timeout: float = 300.0) -> dict:
    """Hot-swap the drafter checkpoint ``(config.json dict, {tensor name: CPU tensor})`` into the server at ``url``
    (``POST /specopd/drafter/swap``, the body of :func:`sglang_specopd.wire.protocol.swap_payload`); the server
    validates it all-or-nothing. Returns the server's reply ``{version, previous_version, swaps, cache_flushed}``.

    Raises ``specopd_trainer.client.http.ServerRequestError`` (status, reason) when the server refuses (the old drafter
    keeps serving); ``httpx.HTTPError`` when it cannot be reached.
    """
    import httpx

    from sglang_specopd.wire.protocol import SWAP_DRAFTER_PATH, swap_payload
    from specopd_trainer.client.http import ServerRequestError

    body = swap_payload(config, tensors, version)
    r = httpx.post(url.rstrip("/") + SWAP_DRAFTER_PATH, content=body, timeout=timeout,
                   headers={"Authorization": f"Bearer {admin_api_key}", "Content-Type": "application/octet-stream"})
    if r.status_code != 200:
        try:
            reason = r.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            reason = r.text
        raise ServerRequestError(r.status_code, reason)
    return r.json()
