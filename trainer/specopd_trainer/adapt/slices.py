"""Which served requests are held out, and which slice of the traffic each belongs to (``specopd adapt``).

**Held-out membership** (:func:`held_out`): by a hash of the request's whole prompt (its token ids, chat template
included), not by its request number: a prompt is held out (never trained on, used to judge candidates) or trained
on, never both, however often the traffic repeats it (at T=0 a repeated prompt has the same response, so a held-out
prompt that was also trained on would measure memory, not generalisation). The whole prompt rather than its first N
tokens: two requests that share a long system prompt but ask different things are different prompts, and each
falls on its own side. The decision is a pure function of the ids (blake2b, so the same across processes, resumes
and fleet workers); the held-out share is ~1/``holdout_every`` of the distinct prompts.

**Slices** (:class:`SliceKeyer`): real traffic carries no domain label, so requests are grouped by the start of what
they ask: a hash of the first ``k`` (``slice_prefix_tokens``, 4) prompt tokens after the chat template's fixed
header. The header is the longest prefix a prompt shares with a reference header (``slice_header``, else the
majority prefix of the first page the run reads, :func:`majority_header`: the template's tokens plus the default
system prompt when most requests carry it), so a request with its own system prompt (an agent's tool list, an app's
instructions) falls into that system prompt's slice, and one with the default system prompt into the slice of its
user message's first tokens (a task template: "Complete this Python function", "Your task is to sort words").
Cheap (no model, no embedding) and stable (a pure function of the ids and the frozen header). A key becomes a slice
once it was seen ``slice_min_seen`` (4) times, at most ``max_slices`` (32); the rest (one-off prompts, free chat
with no shared start) share the slice :data:`OTHER`, so slices stay few and each gathers enough held-out items to
be judged.
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


# ---- slices -------------------------------------------------------------------------------------------------------
OTHER = "other"  # the requests of prefixes seen fewer than ``min_seen`` times (or past ``max_slices``)
MAX_COUNTED = 4096  # distinct prefixes counted (the rarest forgotten beyond)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two id lists."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def majority_header(prompts: Sequence[Sequence[int]]) -> list:
    """The longest prefix at least half of ``prompts`` start with (the chat template's fixed part, with the default
    system prompt when most requests carry it): grown one token at a time with the most common next token."""
    header: list = []
    need = (len(prompts) + 1) // 2
    alive = [list(p) for p in prompts]
    while alive:
        nxt: dict = {}
        for p in alive:
            if len(p) > len(header):
                nxt[p[len(header)]] = nxt.get(p[len(header)], 0) + 1
        if not nxt:
            break
        tok, count = max(nxt.items(), key=lambda kv: (kv[1], -kv[0]))
        if count < need:
            break
        header.append(tok)
        alive = [p for p in alive if len(p) >= len(header) and p[len(header) - 1] == tok]
    return header


class SliceKeyer:
    """The slice of a prompt: ``s-<hash>`` of its first ``k`` token ids after the header (the longest prefix it
    shares with ``header``), or :data:`OTHER` while that key was seen fewer than ``min_seen`` times or when
    ``max_slices`` keys are already slices. ``seen`` (key -> count) is updated in place (persisted by the caller);
    a key once a slice stays one (its count only grows)."""

    def __init__(self, header: Sequence[int], k: int, min_seen: int, max_slices: int, seen: dict):
        self.header, self.k, self.min_seen, self.max_slices, self.seen = list(header), k, min_seen, max_slices, seen

    def raw_key(self, prompt_ids: Sequence[int]) -> str:
        skip = common_prefix(prompt_ids, self.header)
        return f"s-{prompt_digest(prompt_ids[skip:skip + self.k]):016x}"[:10]

    def slice_of(self, prompt_ids: Sequence[int]) -> str:
        key = self.raw_key(prompt_ids)
        slices = sum(1 for c in self.seen.values() if c >= self.min_seen)
        if key not in self.seen and len(self.seen) >= MAX_COUNTED:  # forget the rarest prefixes (bounded)
            for old in sorted(self.seen, key=self.seen.get)[:MAX_COUNTED // 4]:
                if self.seen[old] < self.min_seen:
                    del self.seen[old]
        was = self.seen.get(key, 0)
        if was < self.min_seen and was + 1 >= self.min_seen and slices >= self.max_slices:
            return OTHER  # no room for another slice: stays counted, never promoted
        self.seen[key] = was + 1
        return key if was + 1 >= self.min_seen else OTHER


def template_header(tokenizer) -> list:
    """The chat template's fixed header as ``tokenizer`` renders it: the ids two one-message chats share before
    their user text (a Hugging Face tokenizer with a chat template)."""
    a, b = (tokenizer(tokenizer.apply_chat_template([{"role": "user", "content": c}], tokenize=False),
                      add_special_tokens=False)["input_ids"] for c in ("Alpha question?", "Zulu question?"))
    return list(a[:common_prefix(list(a), list(b))])
