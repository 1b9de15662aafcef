"""Prompt data for drafter training: four benchmark domains from pinned wheels, user JSONL, a hashed split."""

from specopd_trainer.data.domains import DOMAINS, load_domain
from specopd_trainer.data.records import (
    DataError,
    DataFormatError,
    DataSourceError,
    PromptRecord,
    UnknownDomainError,
    dedupe,
    load_jsonl,
    split,
)
from specopd_trainer.data.splits import domain_split, eval_fraction

__all__ = ["DOMAINS", "DataError", "DataFormatError", "DataSourceError", "PromptRecord", "UnknownDomainError",
           "dedupe", "domain_split", "eval_fraction", "load_domain", "load_jsonl", "split"]
