"""The router in front of a fleet: ``python -m sglang_router.launch_router`` (the ``sglang-router`` package, SGLang's
Rust load balancer) in its own session, health-checked through its ``/readiness`` route.

``/readiness`` answers ``{"status": "ready", "healthy_workers": H, "total_workers": T}`` (200) once the router has
registered healthy workers; :meth:`RouterProcess.start` waits until all the fleet's workers are healthy there.
``GET /workers`` lists the workers it routes to (:func:`router_workers`: how a trainer given only the router's URL
finds them).
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import List, Optional

from sglang_specopd.app.fleet.plan import FleetError, RouterSpec, router_argv
from sglang_specopd.app.launch.cleanup import make_private_tmpdir, remove_tree, stop_process_group

READINESS_PATH = "/readiness"
WORKERS_PATH = "/workers"  # sglang-router's list of its workers (checked with 0.3.2)


def router_readiness(url: str, timeout: float = 5.0) -> Optional[dict]:
    """The router's ``GET /readiness`` reply (a dict, with ``http_status`` added), or None when it does not answer."""
    import httpx

    try:
        r = httpx.get(url + READINESS_PATH, timeout=timeout)
    except httpx.HTTPError:
        return None
    try:
        body = r.json()
    except ValueError:
        body = {"text": r.text[:200]}
    if not isinstance(body, dict):
        body = {"reply": body}
    return {**body, "http_status": r.status_code}


def router_workers(url: str, api_key: Optional[str] = None, timeout: float = 10.0) -> List[str]:
    """The worker URLs sglang-router sends traffic to (its ``GET /workers``: ``{"workers": [{"url", ...}]}``), in
    its order. Raises ValueError (with the reason) when the router does not answer or answers something else."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        r = httpx.get(url.rstrip("/") + WORKERS_PATH, headers=headers, timeout=timeout)
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        raise ValueError(f"the router at {url} does not answer: {type(exc).__name__}: {exc}") from None
    try:
        body = r.json() if r.status_code == 200 else None
        urls = [str(w["url"]).rstrip("/") for w in body["workers"]]
    except (ValueError, KeyError, TypeError):
        raise ValueError(f"GET {url}{WORKERS_PATH} did not list workers (HTTP {r.status_code}: {r.text[:200]}); is "
                         "it an sglang-router?") from None
    if not urls:
        raise ValueError(f"the router at {url} has no worker")
    return list(dict.fromkeys(urls))


class RouterProcess:
    """A running router; :meth:`stop` tears down its whole process group (idempotent)."""

    def __init__(self, spec: RouterSpec, log_path: Path):
        self.spec = spec
        self.log_path = Path(log_path)
        self.proc: Optional[subprocess.Popen] = None
        self.tmpdir: Optional[str] = None

    @property
    def url(self) -> str:
        return self.spec.url

    def launch(self) -> "RouterProcess":
        """Start the router process (does not wait: :meth:`wait_ready`)."""
        argv = router_argv(self.spec)
        env = dict(os.environ)
        self.tmpdir = make_private_tmpdir(env)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            try:
                self.proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, start_new_session=True)
            except BaseException:
                remove_tree(self.tmpdir)
                self.tmpdir = None
                raise
        return self

    def wait_ready(self, n_workers: int, timeout: float) -> dict:
        """Block until ``/readiness`` reports ``n_workers`` healthy workers; its reply. Raises :class:`FleetError`
        when the router exits or ``timeout`` passes (with the tail of its log)."""
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                code = None if self.proc is None else self.proc.returncode
                raise FleetError(f"the router exited with code {code} during start-up; log {self.log_path}:\n"
                                 f"{self.log_tail()}")
            last = router_readiness(self.url)
            if last and last.get("http_status") == 200 and last.get("healthy_workers", 0) >= n_workers:
                return last
            time.sleep(0.5)
        raise FleetError(f"the router at {self.url} did not report {n_workers} healthy workers within {timeout:.0f} s "
                         f"(last /readiness: {last}); log {self.log_path}:\n{self.log_tail()}")

    def log_tail(self, n: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM the router's process group, SIGKILL after ``timeout`` s; remove its TMPDIR."""
        if self.proc is not None:
            stop_process_group(self.proc, timeout)
            self.proc = None
        remove_tree(self.tmpdir)
        self.tmpdir = None
