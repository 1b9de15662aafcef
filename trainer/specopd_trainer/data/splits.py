"""The one train / held-out split of the four benchmark domains, used by every command and benchmark.

A record is held out iff the hash of its id falls below its domain's eval fraction (:func:`records.split`):
10% by default, 16% for dialogue, whose wheels ship only 158 distinct prompts, so that its held-out set reaches
the 24 prompts per domain that acceptance claims need (27 held out), and 16% for japanese (200 prompts). Raising a fraction only moves records from
train to held-out, never back: a prompt held out before stays held out.
"""

from __future__ import annotations

from typing import Optional, Tuple

from specopd_trainer.data.domains import load_domain
from specopd_trainer.data.records import PromptRecord, split

EVAL_SEED = 0
DEFAULT_EVAL_FRACTION = 0.1
EVAL_FRACTIONS = {"dialogue": 0.16, "japanese": 0.16}


def eval_fraction(domain: str) -> float:
    """The held-out fraction of ``domain`` (0.16 for dialogue and japanese, 0.1 otherwise)."""
    return EVAL_FRACTIONS.get(domain, DEFAULT_EVAL_FRACTION)


def domain_split(domain: str, limit: Optional[int] = None) -> Tuple[list[PromptRecord], list[PromptRecord]]:
    """(train, held-out) records of ``domain``; ``limit`` is passed to the loader (math: how many generated
    problems; the held-out records of a smaller ``limit`` stay held out at a larger one, ids being stable).

    Raises the loaders' errors (``UnknownDomainError``, ``DataSourceError``).
    """
    return split(load_domain(domain, limit=limit), eval_fraction=eval_fraction(domain), seed=EVAL_SEED)
