"""The reference SFT corpus: every TRAIN prompt of the four domains, several samples where prompts are scarce.

Drafter training data is the target's own responses (SpecForge regenerates its data sets with the target). The
wheels hold 131 dialogue and 428 agentic train prompts against 2,858 coding and any number of math problems, so
a corpus of ~1M response tokens would be mostly code. Scarce domains get extra responses sampled at
``sample_temperature`` (ids ``<prompt id>#s<k>``, seeded by ``k`` so a rerun regenerates the same request);
sample 0 of every prompt is greedy, as the drafter is evaluated at T=0 first.

Records are interleaved round-robin over the domains, so a collection stopped early is still balanced. Held-out
prompts (:func:`~specopd_trainer.data.splits.domain_split`) never enter.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Mapping

from specopd_trainer.data.splits import domain_split

DOMAIN_ORDER = ("dialogue", "coding", "math", "agentic")


@dataclass(frozen=True)
class CorpusSpec:
    """What :func:`corpus_records` yields.

    ``samples``: responses per train prompt by domain (1 = greedy only). ``math_problems``: gsm_symbolic problems
    generated before the split (the first 1,000 are the benchmark's; held-out ones among them stay held out).
    ``sample_temperature``: temperature of the extra samples (sample 0 is greedy).
    """

    samples: Mapping[str, int] = field(default_factory=lambda: {"dialogue": 8, "coding": 1, "math": 1,
                                                                 "agentic": 3})
    math_problems: int = 3000
    sample_temperature: float = 0.8

    def __post_init__(self) -> None:
        bad = {d: n for d, n in self.samples.items() if d not in DOMAIN_ORDER or int(n) < 0}
        if bad:
            raise ValueError(f"samples: unknown domain or negative count: {bad}")
        if self.math_problems < 1 or self.sample_temperature <= 0:
            raise ValueError("math_problems must be >= 1 and sample_temperature > 0")

    def as_dict(self) -> Dict[str, object]:
        return {"samples": dict(self.samples), "math_problems": self.math_problems,
                "sample_temperature": self.sample_temperature}


def _domain_records(domain: str, spec: CorpusSpec) -> List[dict]:
    limit = spec.math_problems if domain == "math" else None
    train, _ = domain_split(domain, limit=limit)
    out: List[dict] = []
    for k in range(int(spec.samples.get(domain, 0))):
        for r in train:
            if k == 0:
                out.append(dict(r))
            else:
                out.append({**r, "id": f"{r['id']}#s{k}", "temperature": spec.sample_temperature,
                            "sampling_seed": k})
    return out


def corpus_records(spec: CorpusSpec = CorpusSpec()) -> Iterator[dict]:
    """Prompt records ``{"id", "domain", "messages"[, "temperature", "sampling_seed"]}`` of the corpus, one
    domain after another in turn (dialogue, coding, math, agentic, dialogue, ...) until all are exhausted."""
    lists = [_domain_records(d, spec) for d in DOMAIN_ORDER]
    for i in range(max((len(x) for x in lists), default=0)):
        for lst in lists:
            if i < len(lst):
                yield lst[i]


def corpus_size(spec: CorpusSpec = CorpusSpec()) -> Dict[str, int]:
    """Records per domain that :func:`corpus_records` yields for ``spec``."""
    return {d: len(_domain_records(d, spec)) for d in DOMAIN_ORDER}
