"""CPU adaptation 17 (sglang_specopd/server/cpu/fork_start.py): the CPU engine's children start by fork.

The hook's decisions on stand-in arguments (no server), and on a real server: its log says the children forked
(``tests/test_http_robustness.py`` shares conftest's tiny admin server, so this module adds no server start)."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from sglang_specopd.server import compat
from sglang_specopd.server.cpu import fork_start


@pytest.fixture
def calls(monkeypatch):
    made = []
    monkeypatch.setattr(fork_start.mp, "set_start_method", lambda method, force=False: made.append((method, force)))
    real_get = compat.get
    monkeypatch.setattr(compat, "get", lambda name: (lambda args: args) if name == "resolving_view" else real_get(name))
    monkeypatch.delenv(fork_start.START_METHOD_ENV, raising=False)
    # the launcher (SGLang's main process) runs one thread when the hook runs; a pytest worker runs more (execnet's)
    monkeypatch.setattr(fork_start.threading, "enumerate", lambda: [threading.current_thread()])
    return made


def test_fork_on_the_cpu_device_only(calls) -> None:
    assert fork_start.fork_children_on_cpu("r", SimpleNamespace(device="cpu")) == "r"
    assert calls == [("fork", True)]
    for device in ("cuda", "cuda:1", "npu", "xpu"):
        assert fork_start.fork_children_on_cpu(None, SimpleNamespace(device=device)) is None
    assert calls == [("fork", True)]  # SGLang's spawn stays for every other device


def test_spawn_when_asked_or_when_another_thread_runs(calls, monkeypatch) -> None:
    monkeypatch.setenv(fork_start.START_METHOD_ENV, "spawn")
    fork_start.fork_children_on_cpu(None, SimpleNamespace(device="cpu"))
    assert calls == []
    monkeypatch.setenv(fork_start.START_METHOD_ENV, "Fork ")
    stop = threading.Event()
    t = threading.Thread(target=stop.wait, name="busy-thread", daemon=True)
    t.start()
    try:
        monkeypatch.setattr(fork_start.threading, "enumerate", lambda: [threading.current_thread(), t])
        fork_start.fork_children_on_cpu(None, SimpleNamespace(device="cpu"))
    finally:
        stop.set()
        t.join()
    assert calls == []  # a fork would copy only this thread: spawn stays
    fork_start.fork_children_on_cpu(None, SimpleNamespace(device="cpu"))  # t has ended (is_alive() False)
    assert calls == [("fork", True)]


def test_a_bad_value_names_the_variable(monkeypatch) -> None:
    monkeypatch.setenv(fork_start.START_METHOD_ENV, "forkserver")
    with pytest.raises(ValueError, match="SPECOPD_CPU_START_METHOD='forkserver': use fork or spawn"):
        fork_start.register_fork_start()
    monkeypatch.setenv(fork_start.START_METHOD_ENV, "")
    assert fork_start.start_method() == "fork"
