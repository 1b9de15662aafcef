"""The two shifted-traffic domains (``japanese``, ``wordsort``): loaded offline from the pinned wheels, each with a
train split and a held-out split of at least 24 prompts, and ``wordsort`` equal to reasoning-gym's own generator."""

from __future__ import annotations

import pytest

# reasoning_gym.create_dataset("word_sorting", seed=42, size=5)[i]["question"] with reasoning-gym 0.1.25 installed
# in a separate venv (it cannot be a dependency: eleven runtime requirements): the word lists of items 0..4.
RG_WORD_SORTING_SEED42 = (
    ("ascending", "DIRECT, given, exclaims, dreaming"),
    ("descending", "heat, begun, sometimes"),
    ("ascending", "violates, yes, already, completing, pages, duty, his, EXPRESS, duly"),
    ("ascending", "reaching, telephote, fifteen, THE, infinite, marriage, City"),
    ("ascending", "present, HAVE, edifice, using"),
)


def test_word_sorting_reproduces_reasoning_gym():
    from specopd_trainer.data.domains_shift import word_sorting_questions

    rows = word_sorting_questions(5, seed=42)
    for row, (direction, words) in zip(rows, RG_WORD_SORTING_SEED42):
        assert row["question"].startswith("Your task is to sort words in ascending or descending order")
        assert row["question"].endswith(f"sort these words in {direction} order (using ASCII/Unicode ordering) and "
                                        f"return them as a comma-separated list: {words}\n")
        assert row["answer"] == ", ".join(sorted(words.split(", "), reverse=direction == "descending"))


@pytest.mark.parametrize("domain, total", [("japanese", 200), ("wordsort", 1000)])
def test_shift_domains_have_a_train_and_a_24_prompt_held_out_split(domain, total):
    from specopd_trainer.data import domain_split, load_domain

    records = load_domain(domain)
    assert len(records) == total and all(r["domain"] == domain for r in records)
    train, held = domain_split(domain)
    assert len(held) >= 24 and len(train) + len(held) == total
    assert not {r["id"] for r in train} & {r["id"] for r in held}
    assert all(len(r["messages"]) == 1 and r["messages"][0]["role"] == "user" for r in records)


def test_japanese_prompts_are_japanese_and_come_from_three_benchmarks():
    from specopd_trainer.data import load_domain

    records = load_domain("japanese")
    assert {r["id"].split("/")[0] for r in records} == {"mt-ja", "vicuna-ja", "rakuda-v2-ja"}
    kana = sum(any("\u3040" <= ch <= "\u30ff" for ch in r["messages"][0]["content"]) for r in records)
    assert kana >= 190  # hiragana / katakana in (nearly) every prompt
