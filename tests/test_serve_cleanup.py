"""What a stopped server leaves behind: the private TMPDIR and /dev/shm semaphores (no SGLang server needed).

The real servers of the ``server`` tests check the end-to-end result (conftest ``assert_no_leftover_files``); here
the pieces are checked on a small stand-in: a process group that leaks a ``multiprocessing`` semaphore the way
SGLang's scheduler does when the whole group is SIGKILLed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from sglang_specopd.app.launch.cleanup import (TMPDIR_PREFIX, make_private_tmpdir, remove_shm_files, remove_tree,
                                               session_pids, shm_refs_of_session)

LEAKER = """
import multiprocessing as mp, sys, time
lock = mp.get_context("spawn").Lock()  # a named semaphore /dev/shm/sem.mp-*, registered with the resource tracker
print(lock._semlock.name, flush=True)
time.sleep(120)
"""


def test_private_tmpdir_in_env_and_removed() -> None:
    env = {"PATH": "/bin"}
    path = make_private_tmpdir(env)
    try:
        assert Path(path).is_dir() and Path(path).name.startswith(TMPDIR_PREFIX)
        assert Path(path).parent == Path(tempfile.gettempdir())
        assert env["TMPDIR"] == env["TMP"] == env["TEMP"] == path
        # torch's compile cache stays where it would be without the private dir
        assert Path(env["TORCHINDUCTOR_CACHE_DIR"]).parent == Path(tempfile.gettempdir())
        assert Path(env["TORCHINDUCTOR_CACHE_DIR"]).name.startswith("torchinductor_")
        (Path(path) / "ipc-socket-placeholder").write_text("")
    finally:
        remove_tree(path)
    assert not os.path.exists(path)
    kept = {"TORCHINDUCTOR_CACHE_DIR": "/somewhere"}
    remove_tree(make_private_tmpdir(kept))
    assert kept["TORCHINDUCTOR_CACHE_DIR"] == "/somewhere"


def test_remove_tree_only_removes_private_dirs(tmp_path: Path) -> None:
    other = tmp_path / "not-a-server-tmpdir"
    other.mkdir()
    remove_tree(other)
    remove_tree(None)
    assert other.is_dir()


@pytest.mark.skipif(not os.path.isdir("/dev/shm") or not os.path.isdir("/proc"), reason="Linux /proc and /dev/shm")
def test_semaphore_of_a_killed_group_is_found_and_removed() -> None:
    proc = subprocess.Popen([sys.executable, "-c", LEAKER], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        name = proc.stdout.readline().strip()
        sem = Path("/dev/shm") / ("sem." + name.lstrip("/"))
        assert name.startswith("/mp-") and sem.exists(), name
        assert proc.pid in session_pids(proc.pid) and len(session_pids(proc.pid)) >= 2  # + resource tracker
        refs = shm_refs_of_session(proc.pid)
        st = sem.stat()
        assert (st.st_dev, st.st_ino) in refs, (refs, st.st_ino)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # like SGLang's teardown: the resource tracker dies too
        proc.wait(timeout=10)
    deadline = time.monotonic() + 10
    while session_pids(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not session_pids(proc.pid)
    assert sem.exists(), "the semaphore should leak when the whole group is SIGKILLed"
    assert remove_shm_files(refs) == [str(sem)]  # that one, nothing else
    assert not sem.exists()
