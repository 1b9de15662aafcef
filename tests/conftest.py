"""Shared fixtures: tiny targets/drafters, the prepared SmolLM2 target, real SGLang servers, orphan checks.

Server fixtures start real ``python -m sglang.launch_server`` processes through :class:`LaunchSpec` +
:class:`SGLangServer` on free ports, always inside ``with`` so the whole process group is torn down, and check
after teardown that no process of that server is left (:func:`assert_no_orphans`) and no file it made either: its
``/dev/shm`` entries (``sem.mp-*`` semaphores, SGLang's load snapshots), its unix sockets (ZeroMQ ipc) and its private TMPDIR are gone
(:func:`server_files` / :func:`assert_no_leftover_files`).

Costs on a 2-core CPU machine: ~40-100 s and ~1.5 GB per SGLang process (3 per server) to start. To keep the
suite short and rarely run two servers at once:

* each *plain* reference server lives only inside its ``*_plain_outputs`` fixture: it starts, answers the fixed
  prompts, and is stopped before the fixture returns (the outputs are plain data, session-scoped when several
  modules compare against them); the tiny target's reference comes from transformers instead, unless a greedy
  step is a near tie (:func:`tiny_plain_outputs`);
* each SPECOPD server fixture depends on the matching ``*_plain_outputs`` fixture, so the plain server is always
  gone before the SPECOPD server starts, whatever order the tests run in;
* a server configuration that several modules need is one shared server (``tests/_servers.py``): started by the
  first module that asks for it, put back the way it started before each module (start-up drafter, empty
  caches), stopped after the last module that uses it; those modules run one after another
  (:func:`pytest_collection_modifyitems`). The shared ones: :func:`tiny_admin_server` (admin key, prefix cache,
  1 MB payload limit, traffic spool; :func:`tiny_specopd_server` is the same server under the name the modules
  that need no admin feature use), ``parity_server`` (``tests/test_trainer_parity.py``, the tiny server without an
  admin key), ``hybrid_specopd_server`` (``tests/test_serve_hybrid_gdn.py``) and ``qsa_specopd_server``
  (``tests/test_serve_qsa.py``);
* other server fixtures are module-scoped: used by a single test module, stopped when it ends.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional

import pytest

from _servers import group_modules, lend, mark_server_tests, shared_servers_guard, start_specopd, xdist_groups  # noqa: F401,E501

REPO = Path(__file__).resolve().parents[1]

# Environment variable stamped on every server the tests start (inherited by all of SGLang's processes, which
# rename themselves, e.g. "sglang::scheduler", so their command lines do not show the port).
TEST_TAG_ENV = "SPECOPD_TEST_PROCESS_TAG"
SERVER_START_TIMEOUT_S = 420.0
# Intra-op threads of the test servers (OMP_NUM_THREADS, unless the environment already sets it). On this 2-core
# machine shared with other jobs, SGLang's default (one OpenMP thread per core, spin-waiting) was measured ~13x
# slower than a single thread: 3 x 48 greedy SmolLM2 fp32 tokens took 155-161 s vs 12 s (load average ~4).
SERVER_OMP_THREADS = os.environ.get("SPECOPD_TEST_SERVER_THREADS", "1")
# Every SGLang server the tests start (fixtures, CLIs, benchmark scripts: they all inherit this process's
# environment) skips SGLang's crash diagnostics (py-spy / CUDA core dumps of the schedulers). Stopping a server
# SIGTERMs its process group; the launcher sees its scheduler gone, takes it for a crash and, with the diagnostics on
# (SGLang's default), sleeps 5 s "to let GPU activity settle" before finding nothing to dump: 5 s of every
# server's teardown, ~2 min of the suite.
for _name in ("SGLANG_PYSPY_DUMP_BEFORE_CRASH", "SGLANG_CUDA_COREDUMP_BEFORE_CRASH"):
    os.environ.setdefault(_name, "0")
# ``scripts/test.sh --quick`` sets this (with ``-m "not server"``): a test that starts an SGLang server in this
# process anyway fails, naming the missing ``server`` marker.
NO_SERVERS_ENV = "SPECOPD_TEST_NO_SERVERS"

# ---------------------------------------------------------------------------------------------------------------
# Orphan-process checks
# ---------------------------------------------------------------------------------------------------------------


def _process_matches(proc, port: Optional[int], tag: Optional[str]) -> bool:
    import psutil

    try:
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        if port is not None:
            cmdline = proc.cmdline()
            pairs = zip(cmdline, cmdline[1:])
            if f"--port={port}" in cmdline or any(a == "--port" and b == str(port) for a, b in pairs):
                return True
        if tag is not None:
            try:
                env = proc.environ()
            except (psutil.AccessDenied, OSError):
                env = {}
            if env.get(TEST_TAG_ENV) == tag:
                return True
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return False
    return False


def find_server_processes(port: Optional[int] = None, tag: Optional[str] = None) -> List[str]:
    """Live (non-zombie) processes with ``--port PORT`` on their command line or ``tag`` in their environment."""
    import psutil

    me = os.getpid()
    out = []
    for proc in psutil.process_iter():
        if proc.pid == me:
            continue
        if _process_matches(proc, port, tag):
            try:
                out.append(f"pid {proc.pid}: {' '.join(proc.cmdline())[:200] or proc.name()}")
            except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
                continue
    return out


def assert_no_orphans(port: Optional[int] = None, tag: Optional[str] = None, timeout: float = 15.0) -> None:
    """Fail unless, within ``timeout`` seconds, no process has ``--port PORT`` on its command line or ``tag`` in its
    environment (SGLang's scheduler/detokenizer rename themselves, so the tag is what finds them).

    A short grace period covers processes that were sent SIGKILL and are just being reaped.
    """
    assert port is not None or tag is not None
    deadline = time.monotonic() + timeout
    left = find_server_processes(port, tag)
    while left and time.monotonic() < deadline:
        time.sleep(0.25)
        left = find_server_processes(port, tag)
    assert not left, f"orphan server processes left behind (port {port}, tag {tag}):\n" + "\n".join(left)


@dataclass
class ServerFiles:
    """Files a running server's processes hold: (device, inode) of mapped /dev/shm files, unix socket paths,
    their TMPDIR values."""

    shm: set = field(default_factory=set)
    sockets: set = field(default_factory=set)
    tmpdirs: set = field(default_factory=set)

    def live_shm_paths(self) -> List[str]:
        """The /dev/shm entries that are (hard links to) one of :attr:`shm` right now."""
        out = []
        for entry in os.scandir("/dev/shm"):
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if (st.st_dev, st.st_ino) in self.shm:
                out.append(entry.path)
        return sorted(out)


def server_files(sid: int) -> ServerFiles:
    """What the live processes of session ``sid`` (a server started by ``SGLangServer``: its launcher's pid) map
    from ``/dev/shm`` (by inode: a semaphore is mapped under its temporary name, linked to ``sem.mp-*``), the paths
    of their unix sockets and their ``TMPDIR`` -- read here from /proc and psutil, independently of the launcher's
    own bookkeeping. (By session, not by tag: setproctitle overwrites the scheduler's /proc/PID/environ.)"""
    import psutil

    out = ServerFiles()
    for proc in psutil.process_iter():
        try:
            if proc.pid == os.getpid() or os.getsid(proc.pid) != sid:
                continue
        except OSError:
            continue
        try:
            env = proc.environ()
            if env.get("TMPDIR"):
                out.tmpdirs.add(env["TMPDIR"])
            with open(f"/proc/{proc.pid}/maps") as fh:
                for line in fh:
                    parts = line.split(None, 5)
                    if len(parts) == 6 and parts[5].startswith("/dev/shm/"):
                        major, minor = parts[3].split(":")
                        out.shm.add((os.makedev(int(major, 16), int(minor, 16)), int(parts[4])))
            out.sockets |= {c.laddr for c in proc.net_connections(kind="unix")
                            if isinstance(c.laddr, str) and c.laddr.startswith("/")}
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied, FileNotFoundError,
                ProcessLookupError):
            continue
    return out


def assert_no_leftover_files(files: ServerFiles) -> None:
    """Fail if a /dev/shm file, unix socket or TMPDIR in ``files`` (taken while the server ran) still exists."""
    left = files.live_shm_paths() + sorted(p for p in files.sockets | files.tmpdirs if os.path.exists(p))
    assert not left, "files left behind by a stopped server:\n" + "\n".join(left)


@pytest.fixture(scope="session")
def no_orphans() -> Callable[..., None]:
    """The :func:`assert_no_orphans` helper, for tests: ``no_orphans(port=..., tag=...)``."""
    return assert_no_orphans


def new_process_tag() -> str:
    return f"specopd-test-{uuid.uuid4().hex[:12]}"


@contextlib.contextmanager
def _env_var(name: str, value: Optional[str]) -> Iterator[None]:
    """Set (or, with ``None``, leave alone) one environment variable for the duration of the block."""
    if value is None:
        yield
        return
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


# ---------------------------------------------------------------------------------------------------------------
# Running servers
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class RunningServer:
    """What a test needs from a running server fixture."""

    url: str
    port: int
    spec: object  # sglang_specopd.app.launch.process.LaunchSpec
    log_path: Path
    tag: str
    time_to_healthy_s: float
    block_size: Optional[int] = None
    api_key: Optional[str] = None
    extra: Dict[str, object] = field(default_factory=dict)

    @property
    def headers(self) -> Dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def post(self, path: str, payload: dict, timeout: float = 300.0, **kw):
        import httpx

        headers = {**self.headers, **kw.pop("headers", {})}
        return httpx.post(self.url + path, json=payload, headers=headers, timeout=timeout, **kw)

    def generate(self, text: str, max_new_tokens: int, *, trace: Optional[bool] = None, ignore_eos: bool = True,
                 **sampling) -> dict:
        params = {"temperature": 0.0, "max_new_tokens": max_new_tokens, "ignore_eos": ignore_eos, **sampling}
        if trace is not None:
            params["custom_params"] = {"specopd_trace": trace}
        r = self.post("/generate", {"text": text, "sampling_params": params})
        assert r.status_code == 200, f"/generate -> {r.status_code}: {r.text[:500]}"
        return r.json()


@contextlib.contextmanager
def _sigterm_as_keyboard_interrupt() -> Iterator[None]:
    """While a server runs, SIGTERM to pytest (e.g. a CI timeout) unwinds like Ctrl-C, so fixtures tear it down.

    The server runs in its own session (so its process group can be killed as a whole); by default a SIGTERM'd
    pytest would die without running finalizers and leave the server running, orphaned.
    """
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _raise(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def running_server(spec, log_dir: Path, name: str) -> Iterator[RunningServer]:
    """Start ``spec`` (tagged), yield a :class:`RunningServer` inside ``with SGLangServer``, tear down, check orphans."""
    from sglang_specopd.app.launch.process import SGLangServer

    tag = new_process_tag()
    log_path = log_dir / f"{name}.log"
    server = SGLangServer(spec, log_path=log_path)
    with _sigterm_as_keyboard_interrupt(), _server_lifetime(server, spec, log_path, tag) as running:
        yield running


@contextlib.contextmanager
def _server_lifetime(server, spec, log_path: Path, tag: str) -> Iterator[RunningServer]:
    files = ServerFiles()
    try:
        threads = None if "OMP_NUM_THREADS" in os.environ or not SERVER_OMP_THREADS else SERVER_OMP_THREADS
        with _env_var(TEST_TAG_ENV, tag), _env_var("OMP_NUM_THREADS", threads):
            server.start(timeout=SERVER_START_TIMEOUT_S)  # raises ServeError with SGLang's log tail on failure
        files = server_files(server.proc.pid)
        # SGLang's ipc sockets and semaphores exist while it runs, so the check below looks at something real
        assert server.tmpdir in files.tmpdirs, (files.tmpdirs, server.tmpdir)
        # (sem.mp-* semaphores where SGLang's children spawn; its load snapshots sglang_loads_* either way: on the
        # CPU engine the children fork, and a fork context unlinks its semaphores at once, cpu/fork_start.py)
        assert any(Path(p).name.startswith(("sem.mp-", "sglang_loads_")) for p in files.live_shm_paths()), \
            files.live_shm_paths()
        assert files.sockets and all(p.startswith(server.tmpdir + os.sep) for p in files.sockets), files.sockets
        with server:
            yield RunningServer(url=server.url, port=spec.port, spec=spec, log_path=log_path, tag=tag,
                                time_to_healthy_s=float(server.time_to_healthy_s or 0.0),
                                block_size=spec.block_size if spec.drafter_path else None, api_key=spec.api_key)
    finally:
        server.stop()
        assert_no_orphans(port=spec.port, tag=tag)
        assert_no_leftover_files(files)


# ---------------------------------------------------------------------------------------------------------------
# Targets and drafters
# ---------------------------------------------------------------------------------------------------------------

TINY_BLOCK_SIZE = 4


@pytest.fixture(scope="session")
def tiny_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random fp32 Llama target (hidden 64, 4 layers, tied embeddings, offline BPE tokenizer)."""
    from _tiny_target import make_tiny_target

    path = make_tiny_target(tmp_path_factory.mktemp("tiny-target") / "llama", seed=0)
    assert json.loads((path / "config.json").read_text())["dtype"] == "float32"
    return path


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_target: Path):
    """The tiny target's tokenizer (test_collect, test_evaluate)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_target))


@pytest.fixture(scope="session")
def tiny_target6(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 6-layer tiny Llama: 2 context layers spread to ids [1, 3] (drafter-format and registry tests)."""
    from _tiny_target import make_tiny_target

    return make_tiny_target(tmp_path_factory.mktemp("tgt") / "llama6", num_layers=6)


@pytest.fixture(scope="session")
def tiny_drafter(tiny_target: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random 2-layer, block-4 DFlash drafter for :func:`tiny_target` (fp32)."""
    from sglang_specopd.wire.drafters.init import init_drafter

    out = tmp_path_factory.mktemp("tiny-drafter") / "drafter"
    init_drafter(tiny_target, out, block_size=TINY_BLOCK_SIZE, num_layers=2, seed=0)
    return out


def make_accepting_target(target: Path, mask_token_id: int, out: Path, *, strength: float = 3.0,
                          along_mask: float = 0.5, seed: int = 1) -> Path:
    """Copy of a tiny tied target whose untied LM head makes a *random* drafter's guesses sometimes right.

    A freshly initialised drafter barely moves the residual stream, so at its mask positions it proposes the mask
    token itself. This target gets an untied random LM head whose row for the mask token points along a fixed
    direction (partly along the mask token's embedding): greedy decoding then emits the mask token in runs that
    start and stop depending on the context, so verify steps accept 0..block_size-1 drafts. (With the unmodified
    target a random drafter is never right, and acceptance > 0 paths would go untested.)
    Everything else (tokenizer, layers, dims) is the original's, so the same drafter fits both.
    """
    import torch
    from safetensors.torch import load_file, save_file

    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(target, out)
    cfg = json.loads((out / "config.json").read_text())
    cfg["tie_word_embeddings"] = False
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    tensors = load_file(str(target / "model.safetensors"))
    emb = tensors["model.embed_tokens.weight"]
    hidden = emb.shape[1]
    head = torch.randn(emb.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float32) * 0.02
    e_mask = emb[mask_token_id] / emb[mask_token_id].norm()
    v = torch.randn(hidden, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float32)
    v -= (v @ e_mask) * e_mask
    v /= v.norm()
    u = v + along_mask * e_mask
    head[mask_token_id] = strength * 0.16 * u / u.norm()
    tensors["lm_head.weight"] = head.contiguous()
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


@pytest.fixture(scope="session")
def tiny_serving_target(tiny_target: Path, tiny_drafter: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny target the tiny servers run: :func:`make_accepting_target` of :func:`tiny_target` (fp32)."""
    from sglang_specopd.app.drafters.check import check_drafter

    mask_id = json.loads((tiny_drafter / "config.json").read_text())["dflash_config"]["mask_token_id"]
    out = make_accepting_target(tiny_target, int(mask_id), tmp_path_factory.mktemp("tiny-serving") / "llama")
    assert check_drafter(tiny_drafter, out) == [], "the tiny drafter must fit the serving target too"
    return out


@pytest.fixture(scope="session")
def smollm2_target() -> Path:
    """The prepared SmolLM2-135M-Instruct target; skipped when not prepared, unless SPECOPD_REQUIRE_SMOLLM2=1."""
    from sglang_specopd.app.models import TargetNotFoundError, resolve_target

    try:
        return resolve_target("smollm2")
    except TargetNotFoundError as exc:
        if os.environ.get("SPECOPD_REQUIRE_SMOLLM2", "").strip() == "1":
            pytest.fail(f"SPECOPD_REQUIRE_SMOLLM2=1 but the SmolLM2 target is not prepared: {exc}")
        pytest.skip(f"SmolLM2 target not prepared ({exc})")


@pytest.fixture(scope="session")
def hybrid_target(smollm2_target: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny hybrid Gated DeltaNet target (tiny-qwen3next: Qwen3-Next architecture, SmolLM2's tokenizer, fp32,
    seed 0; :func:`sglang_specopd.app.tiny.hybrid.build_tiny_qwen3next`)."""
    from sglang_specopd.app.tiny.hybrid import build_tiny_qwen3next

    return build_tiny_qwen3next(tmp_path_factory.mktemp("hybrid") / "tiny-qwen3next", smollm2_target, seed=0)


@pytest.fixture(scope="session")
def qsa_target(smollm2_target: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny QSA-GDN target (tiny-qwen4exp-sparse: Qwen4-Exp architecture, 3 GDN layers per QSA attention layer,
    QSA budget 32 in blocks of 4, SmolLM2's tokenizer; :func:`sglang_specopd.app.tiny.qsa.build_tiny_qwen4exp_sparse`)."""
    from sglang_specopd.app.tiny.qsa import build_tiny_qwen4exp_sparse

    return build_tiny_qwen4exp_sparse(tmp_path_factory.mktemp("qsa") / "tiny-qwen4exp-sparse", smollm2_target)


# ---------------------------------------------------------------------------------------------------------------
# Tiny servers (fp32): plain reference outputs, then one SPECOPD server
# ---------------------------------------------------------------------------------------------------------------

TINY_PROMPTS = (
    "Return the sum of the arguments.",
    "Hello world",
    "def add(a, b):",
    "import os\n",
)
TINY_NEW_TOKENS = 32


def tiny_launch_spec(target: Path, port: int, drafter: Optional[Path] = None):
    from sglang_specopd.app.launch.process import LaunchSpec

    return LaunchSpec(
        model_path=str(target), port=port, device="cpu", dtype="float32", attention_backend="torch_native",
        max_total_tokens=4096, disable_cuda_graph=True, disable_overlap_schedule=True, sleep_on_idle=True,
        drafter_path=str(drafter) if drafter else None, speculative_algorithm="SPECOPD" if drafter else None,
        block_size=TINY_BLOCK_SIZE if drafter else None,
    )


# A greedy step of the transformers reference counts as decided when its argmax leads the runner-up by this much (in
# logits). Two correct fp32 implementations of the tiny target (transformers, SGLang's plain or verify forward)
# differ by ~1e-6 there, so every decided step is the token any lossless server must emit.
TINY_REFERENCE_MARGIN = 1e-4


def target_greedy(target: Path, prompts, new_tokens: int, *, cached: bool = False) -> tuple:
    """transformers' fp32 greedy continuation of each prompt (tokenized as SGLang does: the target's tokenizer, no
    chat template), recomputed from the whole sequence at every step (``cached``: with transformers' KV cache, for
    a larger target); ``(ids by prompt, smallest top-2 gap)``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(target))
    model = AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.float32).eval()
    out, gap = {}, float("inf")
    with torch.inference_mode():
        for prompt in prompts:
            seq = list(tok(prompt)["input_ids"])
            if cached:  # one token at a time on the KV cache; an end-of-sequence token is kept (ignore_eos)
                past, step_ids = None, seq
                for _ in range(new_tokens):
                    res = model(torch.tensor([step_ids]), past_key_values=past, use_cache=True)
                    past, top = res.past_key_values, res.logits[0, -1].topk(2)
                    gap = min(gap, float(top.values[0] - top.values[1]))
                    step_ids = [int(top.indices[0])]
                    seq.append(step_ids[0])
                out[prompt] = seq[-new_tokens:]
                continue
            for _ in range(new_tokens):
                top = model(torch.tensor([seq])).logits[0, -1].topk(2)
                gap = min(gap, float(top.values[0] - top.values[1]))
                seq.append(int(top.indices[0]))
            out[prompt] = seq[-new_tokens:]
    return out, gap


@pytest.fixture(scope="session")
def tiny_plain_outputs(tiny_serving_target: Path, tmp_path_factory: pytest.TempPathFactory) -> Dict[str, List[int]]:
    """The reference greedy output ids of the tiny serving target for :data:`TINY_PROMPTS` (what the SPECOPD
    servers must reproduce token for token): the target model's own fp32 greedy decoding in transformers
    (:func:`target_greedy`), when every step is decided by :data:`TINY_REFERENCE_MARGIN`. The tiny tokenizer is
    the same in every process (tests/_tiny_target.py), so the margins are too (smallest ~6e-4 with this
    environment's packages); on a near tie (another environment's docstrings train another tokenizer) the reference
    is a PLAIN fp32 SGLang server's greedy output (started here, stopped on return). transformers here saves that
    server start (~45 s per xdist worker); plain SGLang serving is still checked: against transformers on the hybrid
    and QSA targets, against SPECOPD in ``specopd demo``."""
    from sglang_specopd.app.launch.process import free_port

    ref, gap = target_greedy(tiny_serving_target, TINY_PROMPTS, TINY_NEW_TOKENS)
    if gap >= TINY_REFERENCE_MARGIN:
        return ref
    spec = tiny_launch_spec(tiny_serving_target, free_port())
    with running_server(spec, tmp_path_factory.mktemp("logs"), "tiny-plain") as srv:
        return {p: srv.generate(p, TINY_NEW_TOKENS)["output_ids"] for p in TINY_PROMPTS}


@pytest.fixture(scope="module")
def tiny_specopd_server(tiny_plain_outputs, tiny_admin_server: RunningServer) -> RunningServer:
    """A SPECOPD fp32 server (tiny target + block-4 drafter) for tests that need nothing of an admin server: the
    shared :func:`tiny_admin_server` itself (one server start instead of two; its admin key, caches, payload limit
    and spool do not change what these tests see), asked for after the plain reference server stopped (the
    ``tiny_plain_outputs`` dependency). Used by test_collect, test_evaluate, test_serve_tiny."""
    return tiny_admin_server


# The shared admin server's key: benchmarks/fuzz_routes/strategies.py's strategies send this one (tests/test_fuzz_routes.py).
TINY_ADMIN_KEY = "fuzz-admin"
TINY_ADMIN_PREFIX_CACHE_MB = 64  # the score_trees exactness tests keep reference prefixes' K/V across calls
TINY_ADMIN_SPOOL_MB = 0.005  # a 5,242-byte live-traffic spool: a handful of tiny requests fill it (evictions)
TINY_MAX_PAYLOAD_ENV = "SPECOPD_MAX_PAYLOAD_BYTES"
# Above a tiny drafter's swap payload (~0.3 MB), far below the default 64 MiB, so a 413 costs little.
TINY_MAX_PAYLOAD = 1_000_000
# A stalled request body gets 408 after this many seconds without bytes (default 30 s; tests/test_http_robustness.py)
TINY_BODY_IDLE_ENV = "SPECOPD_BODY_IDLE_S"
TINY_BODY_IDLE_S = 3.0


@pytest.fixture(scope="module")
def tiny_admin_server(request, shared_servers_guard, tiny_serving_target: Path, tiny_drafter: Path,
                      tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """A SPECOPD fp32 server (tiny target + block-4 drafter) with :data:`TINY_ADMIN_KEY`, a score_trees prefix
    cache, a :data:`TINY_MAX_PAYLOAD`-byte payload limit, a :data:`TINY_ADMIN_SPOOL_MB` traffic spool and SGLang's
    ``--enable-metrics`` (score_trees budget off); shared (``tests/_servers.py``) by the modules that swap drafters,
    train against it, fuzz it, read its traffic or take the unbudgeted score_trees replies from it; a request body
    stalled for :data:`TINY_BODY_IDLE_S` gets 408. ``extra["initial_info"]``: ``GET /specopd/drafter/admin`` right
    after start (version ``"initial"``, 0 swaps, the drafter's path)."""
    from sglang_specopd.app.launch.process import free_port

    def start(stack: contextlib.ExitStack) -> RunningServer:
        spec = replace(tiny_launch_spec(tiny_serving_target, free_port(), tiny_drafter), admin_api_key=TINY_ADMIN_KEY,
                       prefix_cache_mb=TINY_ADMIN_PREFIX_CACHE_MB, traffic_spool_mb=TINY_ADMIN_SPOOL_MB,
                       extra_args=["--enable-metrics"])  # SGLang's /metrics with the plugin's series (docs/metrics.md)
        with _env_var(TINY_MAX_PAYLOAD_ENV, str(TINY_MAX_PAYLOAD)), _env_var(TINY_BODY_IDLE_ENV, str(TINY_BODY_IDLE_S)):
            # both read by the HTTP process: set at launch
            return start_specopd(stack, spec, tmp_path_factory.mktemp("logs"), "tiny-admin")

    yield from lend(request, "tiny_admin_server", start)


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects: the marks given here count
def pytest_collection_modifyitems(session, config, items) -> None:
    """Tests that use a server fixture are marked ``server``; modules that share a server run one after another,
    on one xdist worker under ``--dist loadgroup`` (``tests/_servers.py``)."""
    mark_server_tests(items)
    group_modules(items)
    if getattr(config.option, "loadgroup", False):  # an xdist worker of a --dist loadgroup run
        xdist_groups(items)


@pytest.fixture(autouse=True, scope="session")
def _no_servers_in_quick_runs():
    """With :data:`NO_SERVERS_ENV` = 1, starting an SGLang server fails the test (it lacks the ``server`` marker)."""
    if os.environ.get(NO_SERVERS_ENV, "").strip() != "1":
        yield
        return
    from sglang_specopd.app.launch.process import SGLangServer

    def refuse(self, timeout):  # runs right after the launch: start() stops the server and re-raises
        pytest.fail(f"{NO_SERVERS_ENV}=1 but this test started an SGLang server: mark it @pytest.mark.server "
                    "(or use a fixture of tests/_servers.py SERVER_FIXTURES)", pytrace=False)

    real = SGLangServer._wait_healthy
    SGLangServer._wait_healthy = refuse
    try:
        yield
    finally:
        SGLangServer._wait_healthy = real


# ---------------------------------------------------------------------------------------------------------------
# SmolLM2 servers (fp32, cpu-smollm2-fp32.yaml): plain reference outputs, then one SPECOPD server with an API key
# ---------------------------------------------------------------------------------------------------------------

SMOLLM2_CONFIG = "cpu-smollm2-fp32"
SMOLLM2_PROMPTS = (
    "The capital of France is",
    "Write a short poem about the sea.\n",
    "def fibonacci(n):",
)
SMOLLM2_NEW_TOKENS = 32
SMOLLM2_API_KEY = "specopd-test-key"
# The shipped config reserves 65536 KV tokens (~3 GB in fp32 for SmolLM2); the tests need a few hundred.
SMOLLM2_TEST_MAX_TOTAL_TOKENS = 8192


def smollm2_config(**update):
    from sglang_specopd.app.config import ServeConfig
    from sglang_specopd.app.serve.spec import config_path

    cfg = ServeConfig.load(config_path(SMOLLM2_CONFIG))
    assert cfg.dtype == "float32" and cfg.device == "cpu"
    return cfg.model_copy(update={"max_total_tokens": SMOLLM2_TEST_MAX_TOTAL_TOKENS, **update})


# SmolLM2's greedy steps count as decided by transformers when the argmax leads by this much (fp32 logits of two
# implementations of a 30-layer model differ by ~1e-5; the prompts' smallest lead is ~3e-2 at 48 tokens).
SMOLLM2_REFERENCE_MARGIN = 1e-3


@pytest.fixture(scope="module")
def smollm2_plain_outputs(smollm2_target: Path, tmp_path_factory: pytest.TempPathFactory) -> Dict[str, List[int]]:
    """The reference greedy output ids of fp32 SmolLM2 for :data:`SMOLLM2_PROMPTS`: transformers' (KV-cached)
    greedy decoding when every step leads by :data:`SMOLLM2_REFERENCE_MARGIN`, else a PLAIN fp32 SmolLM2 server's
    (started here, stopped on return). Plain SGLang serving against SPECOPD on SmolLM2 is ``specopd demo``'s test."""
    from sglang_specopd.app.launch.process import free_port
    from sglang_specopd.app.serve.spec import launch_spec

    ref, gap = target_greedy(smollm2_target, SMOLLM2_PROMPTS, SMOLLM2_NEW_TOKENS, cached=True)
    if gap >= SMOLLM2_REFERENCE_MARGIN:
        return ref
    spec = launch_spec(smollm2_config(drafter=None, speculative_algorithm=None), port=free_port())
    assert spec.drafter_path is None and spec.dtype == "float32"
    with running_server(spec, tmp_path_factory.mktemp("logs"), "smollm2-plain") as srv:
        return {p: srv.generate(p, SMOLLM2_NEW_TOKENS)["output_ids"] for p in SMOLLM2_PROMPTS}


@pytest.fixture(scope="module")
def smollm2_specopd_server(smollm2_plain_outputs, smollm2_target: Path,
                           tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """SPECOPD fp32 SmolLM2 server with the config's default drafter, requiring :data:`SMOLLM2_API_KEY`."""
    from sglang_specopd.app.launch.process import free_port
    from sglang_specopd.app.serve.spec import launch_spec

    spec = launch_spec(smollm2_config(), port=free_port(), api_key=SMOLLM2_API_KEY)
    assert spec.speculative_algorithm == "SPECOPD" and spec.drafter_path and spec.dtype == "float32"
    with running_server(spec, tmp_path_factory.mktemp("logs"), "smollm2-specopd") as srv:
        yield srv



def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    """The random-order seed again at the end (pytest-randomly's header line is hidden under ``-q``), so a failing
    order can be replayed: ``SPECOPD_TEST_SEED=N bash scripts/test.sh`` (docs/testing.md)."""
    seed = config.getoption("randomly_seed", None) if config.pluginmanager.hasplugin("randomly") else None
    if isinstance(seed, int):
        terminalreporter.write_line(f"random test order, seed {seed}: replay with SPECOPD_TEST_SEED={seed} "
                                    "bash scripts/test.sh (plus the same test selection)")
