"""Prompt records, user JSONL files and the deterministic train/eval split.

A record is a plain JSON-friendly dict ``{"id": str, "domain": str, "messages": [{"role", "content"}, ...]}``;
the messages are a chat prompt (at least one user message; roles system/user/assistant/tool) that the target
answers with its chat template.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Iterable, Sequence, TypedDict

ROLES = ("system", "user", "assistant", "tool")


class Message(TypedDict):
    role: str
    content: str


class PromptRecord(TypedDict):
    id: str
    domain: str
    messages: list[Message]


class DataError(ValueError):
    """Base class of the trainer data errors."""


class DataFormatError(DataError):
    """A record or file that does not follow the record format; the message names the file:line when known."""


class UnknownDomainError(DataError, KeyError):
    """A domain name that no loader provides; the message lists the valid names."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class DataSourceError(DataError):
    """A pinned data package that cannot be downloaded or does not contain the expected files."""


def messages_problem(messages: Any) -> str | None:
    """Why ``messages`` is not a valid chat prompt, or None if it is."""
    if not isinstance(messages, list) or not messages:
        return "messages must be a non-empty list"
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or set(m) != {"role", "content"}:
            return f"messages[{i}] must be an object with exactly the keys role and content"
        if m["role"] not in ROLES:
            return f"messages[{i}].role must be one of {', '.join(ROLES)}, got {m['role']!r}"
        if not isinstance(m["content"], str) or not m["content"].strip():
            return f"messages[{i}].content must be a non-empty string"
    if not any(m["role"] == "user" for m in messages):
        return "messages must contain at least one user message"
    return None


def make_record(record_id: str, domain: str, messages: list[Message]) -> PromptRecord:
    """Build a validated record. Raises DataFormatError naming the record id when invalid."""
    problem = messages_problem(messages)
    if problem or not isinstance(record_id, str) or not record_id:
        raise DataFormatError(f"record {record_id!r}: {problem or 'id must be a non-empty string'}")
    return {"id": record_id, "domain": domain, "messages": messages}


def content_key(record: PromptRecord) -> str:
    """Canonical JSON of a record's messages (identical prompts have identical keys)."""
    return json.dumps(record["messages"], sort_keys=True, ensure_ascii=False)


def dedupe(records: Iterable[PromptRecord]) -> list[PromptRecord]:
    """Drop records whose id or messages repeat an earlier record (first occurrence wins, order kept)."""
    seen_ids: set[str] = set()
    seen_content: set[str] = set()
    out: list[PromptRecord] = []
    for r in records:
        key = content_key(r)
        if r["id"] in seen_ids or key in seen_content:
            continue
        seen_ids.add(r["id"])
        seen_content.add(key)
        out.append(r)
    return out


def _unit_hash(record_id: str, seed: int) -> float:
    """``sha256(f"{seed}:{id}")`` mapped to [0, 1) (first 8 bytes, big-endian, / 2**64)."""
    digest = hashlib.sha256(f"{seed}:{record_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def split(records: Sequence[PromptRecord], eval_fraction: float, seed: int = 0
          ) -> tuple[list[PromptRecord], list[PromptRecord]]:
    """Deterministic split: a record is eval iff ``_unit_hash(id, seed) < eval_fraction``.

    Depends only on (id, seed), not on order or on the other records. A train record whose messages equal an
    eval record's is dropped, so no eval prompt enters training. Returns ``(train, eval)``, input order kept.

    Raises DataError if ``eval_fraction`` is outside [0, 1].
    """
    if not 0.0 <= float(eval_fraction) <= 1.0:
        raise DataError(f"eval_fraction must be in [0, 1], got {eval_fraction}")
    train, held = [], []
    for r in records:
        (held if _unit_hash(r["id"], seed) < eval_fraction else train).append(r)
    held_keys = {content_key(r) for r in held}
    return [r for r in train if content_key(r) not in held_keys], held


def load_jsonl(path: str | os.PathLike[str], domain: str = "user") -> list[PromptRecord]:
    """Read user prompts: one JSON object per line, ``{"messages": [...]}`` or ``{"prompt": str}`` (a single
    user message), optionally with ``"id"`` (default ``"<file stem>:<line>"``) and ``"domain"``. Blank lines
    are skipped.

    Raises:
        DataFormatError: missing/unreadable file, a file without records, or a malformed line (``file:line``).
    """
    p = Path(path)
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise DataFormatError(f"{p}: cannot read: {exc}") from None
    out: list[PromptRecord] = []
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{p}:{no}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataFormatError(f"{where}: not valid JSON: {exc.msg}") from None
        if not isinstance(obj, dict) or ("messages" in obj) == ("prompt" in obj):
            raise DataFormatError(f"{where}: each line must be an object with exactly one of 'messages' or 'prompt'")
        unknown = set(obj) - {"messages", "prompt", "id", "domain"}
        if unknown:
            raise DataFormatError(f"{where}: unknown keys {sorted(unknown)}")
        if "prompt" in obj:
            if not isinstance(obj["prompt"], str) or not obj["prompt"].strip():
                raise DataFormatError(f"{where}: 'prompt' must be a non-empty string")
            messages = [{"role": "user", "content": obj["prompt"]}]
        else:
            messages = obj["messages"]
        problem = messages_problem(messages)
        rid, dom = obj.get("id", f"{p.stem}:{no}"), obj.get("domain", domain)
        if problem is None and not (isinstance(rid, str) and rid and isinstance(dom, str) and dom):
            problem = "'id' and 'domain' must be non-empty strings"
        if problem:
            raise DataFormatError(f"{where}: {problem}")
        out.append({"id": rid, "domain": dom, "messages": messages})
    if not out:
        raise DataFormatError(f"{p}: no records (the file is empty)")
    ids = [r["id"] for r in out]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise DataFormatError(f"{p}: duplicate id {dup!r}")
    return out
