"""Two prompt domains the shipped reference drafter never trained on: the "shifted traffic" of ``specopd adapt``.

Both are read offline from pinned wheels that the four original domains already use (``wheels.py``):

* ``japanese`` -- another language: flexeval 0.18.3's Japanese chat benchmarks, first turn as the user message:
  ``mt-ja.jsonl`` (80 MT-Bench questions, Japanese), ``vicuna-ja.jsonl`` (80), ``rakuda-v2-ja.jsonl`` (40);
  ids ``<file>/<question_id>``. SmolLM2 answers in a mix of Japanese and English, tokenised mostly as byte pieces:
  nothing like the English the reference drafter learned.
* ``wordsort`` -- another task family: reasoning-gym 0.1.25's ``word_sorting`` task (sort 3..10 words of 3..12
  letters taken from the wheel's ``data/in_the_year_2889.txt`` in ASCII order, ascending or descending), reproduced
  from the wheel's own source without importing reasoning-gym (it needs eleven runtime dependencies): the word list
  and the question template are read from the wheel, and item ``idx`` of seed ``s`` draws with ``Random(s + idx)``
  exactly as ``WordSortingDataset.__getitem__`` does (``_generate_words``, then the direction). Ids
  ``word_sorting/<seed>/<idx>``.
"""

from __future__ import annotations

import ast
import json
import re
from functools import lru_cache
from random import Random
from typing import Optional

from specopd_trainer.data.records import DataSourceError, PromptRecord, dedupe, make_record
from specopd_trainer.data.wheels import FLEXEVAL, REASONING_GYM, read_member

JAPANESE_FILES = ("mt-ja", "vicuna-ja", "rakuda-v2-ja")
DEFAULT_WORDSORT_SIZE = 1000
_WS_SOURCE = "reasoning_gym/algorithmic/word_sorting.py"


def load_japanese(limit: Optional[int] = None, seed: int = 0) -> list[PromptRecord]:
    """flexeval's Japanese MT-Bench (80), Vicuna (80) and Rakuda v2 (40) questions, first turn only."""
    out = []
    for name in JAPANESE_FILES:
        member = f"flexeval/core/chat_dataset/chatbot_bench_datasets/{name}.jsonl"
        for line in read_member(FLEXEVAL, member).decode("utf-8").splitlines():
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                text = row["turns"][0]
            except (json.JSONDecodeError, KeyError, IndexError, TypeError) as exc:
                raise DataSourceError(f"{FLEXEVAL.requirement} {member}: unexpected record ({exc})") from None
            out.append(make_record(f"{name}/{row['question_id']}", "japanese", [{"role": "user", "content": text}]))
    return dedupe(out)[:limit]


@lru_cache(maxsize=1)
def _word_sorting_spec() -> tuple[list[str], str, int, int, int, int]:
    """(sorted word list, question template, min_words, max_words, min_len, max_len) from the wheel's source."""
    src = read_member(REASONING_GYM, _WS_SOURCE).decode()
    tree = ast.parse(src)
    template = next((ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                     and any(getattr(t, "id", None) == "QUESTION_TEMPLATE" for t in n.targets)), None)
    defaults = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "WordSortingConfig":
            for stmt in node.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
                    try:
                        defaults[stmt.target.id] = ast.literal_eval(stmt.value)
                    except ValueError:
                        pass
    keys = ("min_words", "max_words", "min_word_length", "max_word_length")
    if not isinstance(template, str) or not all(isinstance(defaults.get(k), int) for k in keys) \
            or 'read_data_file("in_the_year_2889.txt")' not in src or "{direction}" not in template:
        raise DataSourceError(f"{_WS_SOURCE} of {REASONING_GYM.requirement} has an unexpected layout")
    lo, hi = defaults["min_word_length"], defaults["max_word_length"]
    text = read_member(REASONING_GYM, "reasoning_gym/data/in_the_year_2889.txt").decode("utf-8")
    words = sorted(set(w for w in re.findall(r"\b\w+\b", text) if lo <= len(w) <= hi))
    return words, template, defaults["min_words"], defaults["max_words"], lo, hi


def word_sorting_questions(size: int, seed: int = 0) -> list[dict]:
    """The first ``size`` items of reasoning-gym's ``word_sorting`` with ``seed`` (default config: original case):
    ``[{"index", "question", "answer"}]`` where answer is the sorted comma-separated list."""
    words, template, n_lo, n_hi, _, _ = _word_sorting_spec()
    out = []
    for idx in range(size):
        rng = Random(seed + idx)
        chosen = rng.sample(words, rng.randint(n_lo, n_hi))  # transformation ORIGINAL draws nothing more
        ascending = rng.choice([True, False])
        answer = sorted(chosen, reverse=not ascending)
        out.append({"index": idx, "question": template.format(direction="ascending" if ascending else "descending",
                                                                words=", ".join(chosen)),
                    "answer": ", ".join(answer)})
    return out


def load_wordsort(limit: Optional[int] = None, seed: int = 0) -> list[PromptRecord]:
    """``limit`` (default 1000) distinct word_sorting questions with ``seed``; ids ``word_sorting/<seed>/<index>``."""
    size = DEFAULT_WORDSORT_SIZE if limit is None else int(limit)
    rows = word_sorting_questions(size + size // 20 + 8, seed)
    out = dedupe(make_record(f"word_sorting/{seed}/{r['index']}", "wordsort",
                             [{"role": "user", "content": r["question"]}]) for r in rows)
    return out[:size]
