"""reasoning-gym's ``gsm_symbolic`` math problems, generated from the wheel's own source without installing it.

reasoning-gym 0.1.25 cannot be imported without its eleven runtime dependencies (its ``__init__`` imports every
dataset family), but the GSM-symbolic generators (``reasoning_gym/arithmetic/gsm_symbolic/generators_*.py``) use
only the standard library plus ``format_number``/``is_integer`` from ``reasoning_gym/utils.py`` (itself stdlib
only). We execute those three files from the wheel zip in private module objects and reproduce
``GSMSymbolicDataset.__getitem__`` exactly (``gsm_symbolic.py``)::

    task_indices = Random(seed).choices(tasks_ok, k=size)
    example = generators[task_indices[idx]](Random(seed + idx), 1.0)
    question = example["question"] + QUESTION_SUFFIX

so item ``idx`` equals ``reasoning_gym.create_dataset("gsm_symbolic", seed=seed, size>idx)[idx]["question"]``.
``tasks_ok`` and the suffix are parsed from the wheel's ``gsm_symbolic.py`` (no copied constants).
"""

from __future__ import annotations

import ast
import re
import types
from functools import lru_cache
from random import Random
from typing import Any, Callable

from specopd_trainer.data.records import DataSourceError
from specopd_trainer.data.wheels import REASONING_GYM, read_member

_PKG = "reasoning_gym/arithmetic/gsm_symbolic/"
_UTILS_IMPORT = "from reasoning_gym.utils import format_number, is_integer"


def _exec_module(name: str, source: str, namespace: dict[str, Any]) -> types.ModuleType:
    mod = types.ModuleType(f"specopd_trainer.data._rg.{name}")
    mod.__dict__.update(namespace)
    exec(compile(source, f"{REASONING_GYM.requirement}/{name}", "exec"), mod.__dict__)  # noqa: S102 - pinned wheel
    return mod


@lru_cache(maxsize=1)
def _load() -> tuple[dict[int, Callable[..., dict[str, Any]]], list[int], str]:
    utils = _exec_module("utils", read_member(REASONING_GYM, "reasoning_gym/utils.py").decode(), {})
    shared = {"format_number": utils.format_number, "is_integer": utils.is_integer}
    generators: dict[int, Callable[..., dict[str, Any]]] = {}
    for part in ("generators_00_49", "generators_50_99"):
        src = read_member(REASONING_GYM, f"{_PKG}{part}.py").decode()
        if _UTILS_IMPORT not in src:
            raise DataSourceError(f"{part}.py of {REASONING_GYM.requirement} no longer imports only "
                                  f"format_number/is_integer from reasoning_gym.utils")
        mod = _exec_module(part, src.replace(_UTILS_IMPORT, ""), shared)
        generators.update({int(n[len("generate_"):]): getattr(mod, n) for n in dir(mod) if n.startswith("generate_")})
    spec_src = read_member(REASONING_GYM, f"{_PKG}gsm_symbolic.py").decode()
    tasks_ok = next((ast.literal_eval(node.value) for node in ast.parse(spec_src).body
                     if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "tasks_ok" for t in node.targets)),
                    None)
    suffix = re.search(r'example\["question"\] \+= "([^"]*)"', spec_src)
    if not tasks_ok or suffix is None or not set(tasks_ok) <= set(generators):
        raise DataSourceError(f"gsm_symbolic.py of {REASONING_GYM.requirement} has an unexpected layout")
    return generators, list(tasks_ok), suffix.group(1)


def gsm_symbolic_questions(size: int, seed: int = 0) -> list[dict[str, Any]]:
    """The first ``size`` items of reasoning-gym's gsm_symbolic dataset with ``seed``.

    Returns dicts ``{"index", "task", "question", "answer"}``. Raises DataSourceError if the wheel is unusable.
    """
    generators, tasks_ok, suffix = _load()
    tasks = Random(seed).choices(tasks_ok, k=size)
    out = []
    for idx, task in enumerate(tasks):
        example = generators[task](Random(seed + idx), 1.0)
        out.append({"index": idx, "task": task, "question": example["question"] + suffix,
                    "answer": str(example["answer"])})
    return out
