"""sglang_specopd.server.compat: the table of SGLang symbols the plugin uses, and the check ``register()`` runs first.

No server is started. The check runs in this process against the installed SGLang; breakages are simulated with
``monkeypatch`` (a deleted method, a changed signature, a module that is gone). The static tests parse the plugin's
sources so that the table cannot go stale: every SGLang name the plugin uses goes through compat and is listed.
"""

from __future__ import annotations

import ast
import dataclasses
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from sglang_specopd.server import compat
from sglang_specopd.server.compat.check import (
    SGLangCompatError,
    check_compat,
    compat_problems,
    format_problems,
    has_attribute,
    installed_sglang,
    symbol_problems,
)

REPO = Path(__file__).resolve().parents[1]
SERVER = REPO / "sglang_specopd" / "server"
# every plugin module, packages included (not the sgl_kernel stand-in, which is not plugin code)
PLUGIN_FILES = sorted(p for p in SERVER.rglob("*.py") if "sgl_kernel_standin" not in p.parts)
ACCESSORS = {"get", "target", "hook", "patch", "owner", "symbol"}


@pytest.fixture()
def no_hooks(monkeypatch):
    """A fresh, empty HookRegistry for the test (restored afterwards); the CPU engine off."""
    registry = compat.get("HookRegistry")
    monkeypatch.setattr(registry, "_hooks", defaultdict(list))
    monkeypatch.delenv("SGLANG_USE_CPU_ENGINE", raising=False)
    return registry


def _register_error() -> str:
    from sglang_specopd.server.plugin import register

    with pytest.raises(SGLangCompatError) as info:
        register()
    return str(info.value)


def _assert_one_line(msg: str, *needles: str) -> None:
    assert "\n" not in msg, msg
    assert f"pinned sglang=={compat.PINNED_SGLANG}" in msg and f"installed sglang=={installed_sglang()}" in msg, msg
    for needle in needles:
        assert needle in msg, (needle, msg)


# --- the check on the installed SGLang ---

def test_installed_sglang_has_every_symbol() -> None:
    assert installed_sglang() == compat.PINNED_SGLANG
    assert compat_problems(cpu=True) == []
    assert check_compat(cpu=True) is None and check_compat(cpu=False) is None


def test_pin_matches_pyproject() -> None:
    pins = re.findall(r'"sglang==([^"]+)"', (REPO / "pyproject.toml").read_text())
    assert pins == [compat.PINNED_SGLANG]


def test_importing_the_plugin_entry_point_and_compat_does_not_import_sglang() -> None:
    code = ("import sys, sglang_specopd.server.plugin, sglang_specopd.server.compat, sglang_specopd.server.compat.check;"
            " bad = [m for m in sys.modules if m == 'sglang' or m.startswith('sglang.')]; print(bad); assert not bad")
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr


def test_instance_attributes_are_found_in_sglang_source() -> None:
    # DFlashWorkerV2 sets _fused_kv_helper in __init__ (no class attribute): only the source scan can see it, and
    # a rename must be reported (hot_swap would otherwise skip the helper rebuild silently)
    worker = compat.get("DFlashWorkerV2")
    assert not hasattr(worker, "_fused_kv_helper")
    assert has_attribute(worker, "_fused_kv_helper") and has_attribute(worker, "_selector_sample")
    renamed = dataclasses.replace(compat.symbol("DFlashWorkerV2"), attrs=("_fused_kv_helper", "_fused_kv_helper2"))
    assert symbol_problems(renamed) == [
        "DFlashWorkerV2._fused_kv_helper2: attribute not found on sglang.srt.speculative.dflash_worker_v2.DFlashWorkerV2"]


# --- what a broken SGLang looks like ---

def test_deleted_method_fails_register_naming_it(monkeypatch, no_hooks) -> None:
    monkeypatch.delattr(compat.get("DFlashWorkerV2"), "_accept_block")
    msg = _register_error()
    _assert_one_line(msg, "DFlashWorkerV2._accept_block: sglang.srt.speculative.dflash_worker_v2."
                          "DFlashWorkerV2._accept_block not found")
    assert msg.count(";") == 0  # the only problem
    assert dict(no_hooks._hooks) == {}  # nothing registered


def test_deleted_hook_target_fails_register(monkeypatch, no_hooks) -> None:
    monkeypatch.delattr(compat.get("Scheduler"), "init_request_dispatcher")
    _assert_one_line(_register_error(), "Scheduler.init_request_dispatcher:", "not found")
    assert dict(no_hooks._hooks) == {}


def test_changed_signature_is_caught(monkeypatch, no_hooks) -> None:
    def _extend_forward_kwargs(self, batch, pp_proxy_tensors):  # forward_batch renamed
        return {}

    monkeypatch.setattr(compat.owner("ModelRunner._extend_forward_kwargs"), "_extend_forward_kwargs",
                        _extend_forward_kwargs)
    msg = _register_error()
    _assert_one_line(msg, "ModelRunner._extend_forward_kwargs: signature is (self, batch, pp_proxy_tensors), "
                          "missing parameter(s) 'forward_batch'")


def test_removed_attribute_is_caught(monkeypatch, no_hooks) -> None:
    monkeypatch.delattr(compat.get("TypeBasedDispatcher"), "__iadd__")  # control.py does dispatcher += ...
    _assert_one_line(_register_error(), "TypeBasedDispatcher.__iadd__: attribute not found on sglang.utils.")


def test_not_a_class_and_missing_module(monkeypatch) -> None:
    gone = dataclasses.replace(compat.symbol("BaseReq"), module="sglang.srt.no_such_module")
    not_class = dataclasses.replace(compat.symbol("BaseReq"), qualname="hook_custom_types")
    assert symbol_problems(gone)[0].startswith("BaseReq: module sglang.srt.no_such_module cannot be imported "
                                               "(ModuleNotFoundError: ")
    assert symbol_problems(not_class) == ["BaseReq: is a function, not a class to subclass"]
    monkeypatch.setattr(compat, "SYMBOLS", (gone, not_class))
    with pytest.raises(SGLangCompatError) as info:
        check_compat(cpu=False)
    _assert_one_line(str(info.value), "BaseReq: module", "; BaseReq: is a function")


def test_cpu_only_entries_are_checked_only_with_the_cpu_engine(monkeypatch) -> None:
    sym = compat.symbol("chain_speculative_sampling_triton")
    assert sym.cpu_only and sym not in compat.entries(cpu=False) and sym in compat.entries(cpu=True)
    monkeypatch.delattr(compat.owner(sym.name), "chain_speculative_sampling_triton")
    check_compat(cpu=False)
    with pytest.raises(SGLangCompatError, match=r"chain_speculative_sampling_triton: sglang\.kernels\..* not found"):
        check_compat(cpu=True)
    monkeypatch.setenv("SGLANG_USE_CPU_ENGINE", "1")
    monkeypatch.setattr(compat.get("HookRegistry"), "_hooks", defaultdict(list))
    _assert_one_line(_register_error(), "chain_speculative_sampling_triton")


def test_message_stays_one_line_and_bounded() -> None:
    msg = format_problems([f"S{i}: module x cannot be imported (ImportError: a\nb)" for i in range(9)], "9.9")
    assert "\n" not in msg and "installed sglang==9.9" in msg and msg.endswith("; and 3 more")


# --- the accessors ---

def test_hook_uses_the_table_target_and_type(no_hooks) -> None:
    def fn(original_fn, *args, **kwargs):
        return original_fn(*args, **kwargs)

    compat.hook("RadixAttention.forward", fn)
    compat.hook("WeightUpdater.begin_weight_update", fn)
    hook_type = compat.get("HookType")
    assert dict(no_hooks._hooks) == {
        "sglang.srt.layers.radix_attention.RadixAttention.forward": [(hook_type.AROUND, fn, None)],
        "sglang.srt.model_executor.model_runner_components.weight_updater.WeightUpdater.begin_weight_update":
            [(hook_type.BEFORE, fn, None)],
    }
    with pytest.raises(ValueError, match="0 hook kinds"):
        compat.hook("DFlashWorkerV2", fn)
    with pytest.raises(KeyError, match="'Nope' is not in"):
        compat.get("Nope")


def test_patch_sets_and_returns_the_previous_value(monkeypatch) -> None:
    holder = compat.owner("dflash_utils._DFLASH_SAMPLING_VERIFY_AVAILABLE")
    monkeypatch.setattr(holder, "_DFLASH_SAMPLING_VERIFY_AVAILABLE", "before")
    assert compat.patch("dflash_utils._DFLASH_SAMPLING_VERIFY_AVAILABLE", "after") == "before"
    assert holder._DFLASH_SAMPLING_VERIFY_AVAILABLE == "after"
    with pytest.raises(ValueError, match="not a monkeypatch target"):
        compat.patch("RadixAttention.forward", None)


# --- static: the table covers every SGLang use in the plugin's sources ---

def _docstrings(tree: ast.AST) -> set:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def _module_name(path: Path) -> str:
    rel = path.relative_to(SERVER).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _scan():
    """Per plugin module: sglang imports, 'sglang.*' string constants, and compat accessor calls (name, arg)."""
    found = {}
    for path in PLUGIN_FILES:
        tree = ast.parse(path.read_text())
        docs = _docstrings(tree)
        imports, strings, calls = [], [], []
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                imports += [a.name for a in node.names if a.name.split(".")[0] == "sglang"]
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "sglang":
                imports.append(node.module)
            elif (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
                  and re.fullmatch(r"sglang(\.\w+)+", node.value)):
                strings.append(node.value)
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and isinstance(node.func.value, ast.Name) and node.func.value.id == "compat"):
                arg = node.args[0] if node.args else None
                calls.append((node.func.attr, arg.value if isinstance(arg, ast.Constant) else None))
        found[_module_name(path)] = (imports, strings, calls)
    return found


def test_only_compat_imports_sglang() -> None:
    bad = {m: imports for m, (imports, _, _) in _scan().items() if imports and m.split(".")[0] != "compat"}
    assert bad == {}


def test_every_sglang_string_is_a_table_target() -> None:
    known = {s.target for s in compat.SYMBOLS} | {s.module for s in compat.SYMBOLS}
    strings = {m: [s for s in strs if s not in known] for m, (_, strs, _) in _scan().items()}
    assert {m: s for m, s in strings.items() if s} == {}


def test_every_compat_call_names_a_table_entry_used_by_that_module() -> None:
    problems, n_calls = [], 0
    for module, (_, _, calls) in _scan().items():
        for accessor, name in calls:
            if accessor not in ACCESSORS:
                assert hasattr(compat, accessor), f"{module}: compat.{accessor} does not exist"
                continue
            n_calls += 1
            if name is None:  # only the prefix cache loops over a table-defined tuple of names
                assert module == "prefix_cache" and accessor == "hook", module
                continue
            sym = compat.BY_NAME.get(name)
            if sym is None:
                problems.append(f"{module}: compat.{accessor}({name!r}) is not in the table")
            elif module not in sym.used_by:
                problems.append(f"{module}: uses {name!r}, but its used_by is {sym.used_by}")
            elif accessor == "hook" and not any(k.hook_type for k in sym.kinds):
                problems.append(f"{module}: hooks {name!r}, not a hook in the table")
            elif accessor == "patch" and compat.Kind.MONKEYPATCH not in sym.kinds:
                problems.append(f"{module}: patches {name!r}, not a monkeypatch in the table")
    assert problems == [] and n_calls >= 40
    assert set(compat.WEIGHT_UPDATE_HOOKS) <= set(compat.BY_NAME)


def test_every_table_entry_is_used_where_it_says() -> None:
    sources = {_module_name(p): p.read_text() for p in PLUGIN_FILES}
    unused = []
    for sym in compat.SYMBOLS:
        assert sym.used_by and sym.kinds and sym.target.startswith("sglang."), sym
        for module in sym.used_by:
            text = sources[module]
            words = {sym.name, sym.qualname.rsplit(".", 1)[-1], *sym.attrs}
            if sym.name in compat.WEIGHT_UPDATE_HOOKS:
                words.add("compat.WEIGHT_UPDATE_HOOKS")
            if not any(w in text for w in words):
                unused.append(f"{sym.name} in {module}")
    assert unused == []


def test_sglang_load_plugins_does_not_swallow_the_compat_error(no_hooks, monkeypatch) -> None:
    # SGLang's load_plugins logs and skips a plugin raising Exception; the server would then start without our
    # plugin. The compat error must stop the process instead: it passes through load_plugins as a SystemExit.
    import sglang.srt.plugins as sglang_plugins

    monkeypatch.delattr(compat.get("DFlashWorkerV2"), "_accept_block")
    monkeypatch.setattr(sglang_plugins, "_plugins_loaded", False)
    monkeypatch.setattr(sglang_plugins, "load_plugins_by_group",
                        lambda *a, **k: {"specopd": (__import__("sglang_specopd.server.plugin",
                                                                fromlist=["register"]).register, "sglang-specopd")})
    with pytest.raises(SystemExit) as info:
        sglang_plugins.load_plugins()
    assert isinstance(info.value, SGLangCompatError) and "_accept_block" in str(info.value)
    assert "\n" not in str(info.value)
