"""What an SGLang server leaves on disk, and how :class:`~sglang_specopd.app.launch.process.SGLangServer` removes it.

SGLang's processes write two kinds of files that outlive them when the process group is killed:

* ZeroMQ ``ipc://`` sockets and ``NamedTemporaryFile(delete=False)`` placeholders, prometheus scratch dirs, ... in
  :func:`tempfile.gettempdir` -- handled by giving the server a private ``TMPDIR`` (:func:`make_private_tmpdir`)
  that is removed on stop;
* POSIX shared memory in ``/dev/shm``: ``sem.mp-*`` named semaphores of ``multiprocessing`` (spawn start method:
  named, unlinked only by a Python finalizer or by the resource tracker, which SGLang's own shutdown SIGKILLs;
  e.g. tqdm's write lock in the scheduler) and ``sglang_loads_*.shm`` load snapshots -- handled by recording the
  ``/dev/shm`` files the server's processes map or hold open while they run (:func:`shm_refs_of_session`) and
  unlinking those still there once every process of the server is gone (:func:`remove_shm_files`).

Only files seen in this server's own processes (its session), identified by inode, are removed: other servers'
semaphores on the same machine are never touched.
"""

from __future__ import annotations

import getpass
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Dict, Iterable, List, Set, Tuple

SHM_DIR = "/dev/shm"
TMPDIR_PREFIX = "specopd-sglang-"


def make_private_tmpdir(env: Dict[str, str]) -> str:
    """Create a fresh temp directory for one server and point ``TMPDIR``/``TMP``/``TEMP`` of ``env`` at it.

    ``env`` is modified in place. torch's inductor cache, which defaults to ``$TMPDIR/torchinductor_<user>``, is
    pinned to where it would have been without the private directory (``TORCHINDUCTOR_CACHE_DIR``, unless already
    set), so compiled kernels stay cached across servers. Returns the directory (mode 0700).
    """
    base = tempfile.gettempdir()
    path = tempfile.mkdtemp(prefix=TMPDIR_PREFIX, dir=base)
    if "TORCHINDUCTOR_CACHE_DIR" not in env:
        try:
            user = getpass.getuser()
        except (KeyError, OSError):
            user = "unknown"
        user = "".join(c if c.isalnum() or c in "._-" else "_" for c in user)
        env["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(base, f"torchinductor_{user}")
    for key in ("TMPDIR", "TMP", "TEMP"):
        env[key] = path
    return path


def session_pids(sid: int, proc_root: str = "/proc") -> List[int]:
    """Pids of the live processes whose session id or process group id is ``sid`` (Linux ``/proc``; [] elsewhere).

    Zombies (exited, not yet reaped: they hold no files any more) do not count.
    """
    out: List[int] = []
    try:
        names = os.listdir(proc_root)
    except OSError:
        return out
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(os.path.join(proc_root, name, "stat"), "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        # "pid (comm) state ppid pgrp session ..."; comm may contain spaces or parentheses: split after the last ')'
        fields = stat[stat.rfind(b")") + 2:].split()
        try:
            if fields[0] in (b"Z", b"X"):
                continue
            if int(fields[2]) == sid or int(fields[3]) == sid:
                out.append(int(name))
        except (IndexError, ValueError):
            continue
    return out


ShmRef = Tuple[int, int]  # (st_dev, st_ino) of a file in /dev/shm


def shm_refs_of_pids(pids: Iterable[int], proc_root: str = "/proc") -> Set[ShmRef]:
    """(device, inode) of every ``/dev/shm`` file that the processes ``pids`` map (``/proc/PID/maps``) or hold
    open (``/proc/PID/fd``). Processes that vanish meanwhile are skipped.

    Inodes, not paths: glibc creates a named semaphore under a temporary name and links it to ``sem.mp-*``, so the
    mapping of a live semaphore reads ``/dev/shm/sem.XXXXXX (deleted)`` while ``sem.mp-*`` is the same inode.
    """
    prefix = SHM_DIR + "/"
    found: Set[ShmRef] = set()
    for pid in pids:
        base = os.path.join(proc_root, str(pid))
        try:
            with open(os.path.join(base, "maps"), "r", errors="replace") as fh:
                for line in fh:
                    if prefix not in line:
                        continue
                    # address perms offset dev(major:minor, hex) inode path
                    parts = line.split(None, 5)
                    if len(parts) < 6 or not parts[5].startswith(prefix):
                        continue
                    major, _, minor = parts[3].partition(":")
                    found.add((os.makedev(int(major, 16), int(minor, 16)), int(parts[4])))
        except (OSError, ValueError):
            pass
        try:
            fds = os.listdir(os.path.join(base, "fd"))
        except OSError:
            fds = []
        for fd in fds:
            path = os.path.join(base, "fd", fd)
            try:
                if os.readlink(path).startswith(prefix):
                    st = os.stat(path)
                    found.add((st.st_dev, st.st_ino))
            except OSError:
                continue
    return found


def shm_refs_of_session(sid: int) -> Set[ShmRef]:
    """:func:`shm_refs_of_pids` over every live process of session/process group ``sid``."""
    return shm_refs_of_pids(session_pids(sid))


def remove_shm_files(refs: Set[ShmRef], shm_dir: str = SHM_DIR) -> List[str]:
    """Unlink every file directly in ``shm_dir`` whose (device, inode) is in ``refs``; return the paths removed."""
    removed: List[str] = []
    if not refs:
        return removed
    try:
        entries = list(os.scandir(shm_dir))
    except OSError:
        return removed
    for entry in entries:
        try:
            st = entry.stat(follow_symlinks=False)
            if (st.st_dev, st.st_ino) in refs:
                os.unlink(entry.path)
                removed.append(entry.path)
        except OSError:
            continue
    return removed


def remove_tree(path: str | os.PathLike[str] | None) -> None:
    """Remove a private temp directory made by :func:`make_private_tmpdir` (missing is fine, never raises)."""
    if not path:
        return
    import shutil

    p = Path(path)
    if p.name.startswith(TMPDIR_PREFIX):
        shutil.rmtree(p, ignore_errors=True)


def stop_process_group(proc: "subprocess.Popen[bytes]", timeout: float = 20.0) -> None:
    """SIGTERM the process group led by ``proc`` (started with ``start_new_session``), SIGKILL it after ``timeout`` s,
    and once the leader has exited SIGKILL what is left of the group (no child outlives it); then wait up to 10 s
    until no process of the group is left (SIGKILLed ones being reaped still hold their files). Idempotent."""
    pgid = proc.pid
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        break
    deadline = time.monotonic() + 10.0
    while session_pids(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
