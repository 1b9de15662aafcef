"""Which served requests are held out, and which slice of the traffic each belongs to (``specopd adapt``).

**Held-out membership** (:func:`held_out`): by a hash of the request's whole prompt (its token ids, chat template
included), not by its request number: a prompt is held out (never trained on, used to judge candidates) or trained
on, never both, however often the traffic repeats it (at T=0 a repeated prompt has the same response, so a held-out
prompt that was also trained on would measure memory, not generalisation). The whole prompt rather than its first N
tokens: two requests that share a long system prompt but ask different things are different prompts, and each
falls on its own side. The decision is a pure function of the ids (blake2b, so the same across processes, resumes
and fleet workers); the held-out share is ~1/``holdout_every`` of the distinct prompts.
"""

from __future__ import annotations

import hashlib
from array import array
from typing import Sequence


def prompt_digest(prompt_ids: Sequence[int]) -> int:
    """A stable 64-bit hash of the prompt's token ids (blake2b; not Python's salted ``hash``)."""
    data = array("q", [int(t) for t in prompt_ids]).tobytes()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def held_out(prompt_ids: Sequence[int], holdout_every: int) -> bool:
    """Whether the prompt ``prompt_ids`` is held out: its digest divisible by ``holdout_every`` (~1/k of prompts)."""
    return prompt_digest(prompt_ids) % holdout_every == 0
