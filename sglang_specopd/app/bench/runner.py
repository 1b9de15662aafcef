"""The serving benchmark: the same held-out prompts at each concurrency level on a speculative and a plain server.

Per run: each server answers one warm-up request (not measured; it also proves the speculative server reports
verify steps and the baseline does not). Per level, for each server (the order alternates between levels so
neither always goes first): ``/flush_cache`` (so the prompts of the previous level are not prefix-cache hits),
then every prompt once with ``concurrency`` requests in flight (:func:`client.run_level`).

No statistics are read from the servers' global counters: every number of a level is computed from that level's
own per-request records (client timings + SGLang's per-request ``spec_tokens_details``), so earlier traffic
cannot pollute it, and a launched server is fresh anyway. :func:`launched_servers` starts both servers from one
config (the baseline is the same config without the drafter), so one command line reproduces a result.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

from sglang_specopd.app.bench import BenchError
from sglang_specopd.app.bench.client import BenchPrompt, RequestParams, RequestRecord, run_level
from sglang_specopd.app.bench.metrics import acceptance, speedup, summarize_level

SPEC, BASE = "specopd", "baseline"
WARMUP_TOKENS = 16
INFO_KEYS = ("model_path", "tokenizer_path", "dtype", "device", "speculative_algorithm",
             "speculative_draft_model_path", "speculative_dflash_block_size", "speculative_num_draft_tokens",
             "attention_backend", "max_running_requests", "max_total_num_tokens", "version")


@dataclass(frozen=True)
class BenchServer:
    """One server under test: ``role`` is ``"specopd"`` (speculative) or ``"baseline"`` (plain), plus provenance."""

    role: str
    url: str
    api_key: Optional[str] = None
    admin_api_key: Optional[str] = None
    launched: bool = False
    config: Optional[str] = None
    drafter: Optional[str] = None
    drafter_choice: Optional[str] = None
    time_to_healthy_s: Optional[float] = None
    log_path: Optional[str] = None
    server_threads: Optional[str] = None

    def headers(self, admin: bool = False) -> Dict[str, str]:
        key = (self.admin_api_key or self.api_key) if admin else self.api_key
        return {"Authorization": f"Bearer {key}"} if key else {}


def load_prompts(tokenizer: Any, domains: Sequence[str], limit: Optional[int], *,
                 records: Optional[Mapping[str, Sequence[Mapping[str, Any]]]] = None,
                 max_prompt_tokens: int = 2048) -> Tuple[List[BenchPrompt], Dict[str, int]]:
    """The first ``limit`` held-out prompts per domain (``specopd eval``'s split and chat rendering).

    Returns the prompts and, per domain, how many were skipped for exceeding ``max_prompt_tokens`` tokens.
    ``records`` replaces the held-out data (tests). Raises the data module's errors for unknown domains.
    """
    from specopd_trainer.collect import chat_prompt_ids
    from specopd_trainer.evaluate import eval_records

    prompts: List[BenchPrompt] = []
    skipped = {d: 0 for d in domains}
    for d in domains:
        recs = list(records[d]) if records is not None else eval_records(d, limit)
        for rec in recs[:limit] if limit is not None else recs:
            ids = chat_prompt_ids(tokenizer, rec["messages"])
            if len(ids) > max_prompt_tokens:
                skipped[d] += 1
            else:
                prompts.append(BenchPrompt(str(rec["id"]), d, tuple(ids)))
    return prompts, skipped


def server_info(server: BenchServer) -> Dict[str, Any]:
    """A subset of SGLang's ``/server_info`` (model, dtype, speculative settings, version) and ``block_size``;
    ``{"error": ...}`` if unavailable."""
    import httpx

    try:
        r = httpx.get(server.url.rstrip("/") + "/server_info", headers=server.headers(), timeout=30)
        r.raise_for_status()
        full = r.json()
    except (httpx.HTTPError, ValueError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    info = {k: full.get(k) for k in INFO_KEYS if k in full}
    block = full.get("speculative_dflash_block_size") or full.get("speculative_num_draft_tokens")
    info["block_size"] = int(block) if full.get("speculative_algorithm") and block else None
    return info


def flush_cache(server: BenchServer) -> bool:
    """``POST /flush_cache`` (SGLang's radix cache; admin key if any). True if the server flushed it."""
    import httpx

    try:
        r = httpx.post(server.url.rstrip("/") + "/flush_cache", headers=server.headers(admin=True), timeout=60)
        return r.status_code == 200
    except httpx.HTTPError:
        return False


def warm_up(server: BenchServer, prompt: BenchPrompt, *, attempts: int = 3, timeout_s: float = 600.0,
            api: str = "completions") -> RequestRecord:
    """One unmeasured greedy request of :data:`WARMUP_TOKENS` tokens (ignore_eos); checks the server's role.

    Raises:
        BenchError: every attempt failed; the "specopd" server reports no verify steps (it runs no drafter);
            the "baseline" server reports verify steps (it runs one).
    """
    params = RequestParams(max_new_tokens=WARMUP_TOKENS, temperature=0.0, ignore_eos=True)
    for attempt in range(attempts):
        rec = run_level(server.url, [prompt], 1, params, headers=server.headers(), timeout_s=timeout_s,
                        api=api).records[0]
        if rec.ok:
            break
        if attempt + 1 < attempts:
            time.sleep(min(2.0 ** attempt, 5.0))
    else:
        raise BenchError(f"{server.role} server {server.url} failed the warm-up request {attempts} times: "
                         f"{rec.error}")
    if server.role == SPEC and rec.verify_ct is None and rec.completion_tokens >= 2:
        raise BenchError(f"the speculative server {server.url} reports no verify steps (no "
                         "sglext.spec_tokens_details): it runs no drafter. Start it with a drafter, e.g. "
                         "`specopd serve -c cpu-smollm2`, or use --launch.")
    if server.role == BASE and rec.verify_ct is not None:
        raise BenchError(f"the baseline server {server.url} runs speculative decoding (it reports "
                         f"{rec.verify_ct} verify steps); the baseline must be a plain server on the same target")
    return rec


def _check_servers(servers: Sequence[BenchServer]) -> None:
    roles = [s.role for s in servers]
    if roles.count(SPEC) != 1 or roles.count(BASE) > 1 or set(roles) - {SPEC, BASE}:
        raise BenchError(f"need one '{SPEC}' server and at most one '{BASE}' server, got roles {roles}")


def run_benchmark(servers: Sequence[BenchServer], prompts: Sequence[BenchPrompt], levels: Sequence[int],
                  params: RequestParams, *, timeout_s: float = 600.0,
                  say: Callable[[str], None] = print, api: str = "completions") -> Dict[str, Any]:
    """Run every level on every server; return the result payload (without the common header). ``api``: the
    streaming route (:func:`client.run_level`; "generate" for a server behind sglang-router).

    Returns ``{"levels": [{"concurrency", "order", "specopd": summary, "baseline": summary, "speedup"}],
    "acceptance": pooled over levels, "servers": {role: provenance + server_info}, "prompts", ...}``; each
    summary (:func:`metrics.summarize_level`) carries its raw ``per_request`` records.

    Raises:
        BenchError: bad roles, no prompts, bad levels, servers on different targets, a failed warm-up.
    """
    _check_servers(servers)
    if not prompts:
        raise BenchError("no prompts to benchmark")
    if not levels or any(int(c) < 1 for c in levels):
        raise BenchError(f"concurrency levels must be positive integers, got {list(levels)}")
    servers = sorted(servers, key=lambda s: s.role != SPEC)
    info = {s.role: server_info(s) for s in servers}
    paths = {info[r].get("model_path") for r in info if info[r].get("model_path")}
    if len(paths) > 1:
        raise BenchError(f"the servers run different targets: {sorted(paths)}")
    block = info[SPEC].get("block_size")
    for s in servers:
        rec = warm_up(s, prompts[0], timeout_s=timeout_s, api=api)
        say(f"{s.role}: warm-up ok ({rec.completion_tokens} tokens in {rec.latency_s:.1f} s)")
    out_levels: List[Dict[str, Any]] = []
    spec_records: List[RequestRecord] = []
    t_start = time.monotonic()
    for i, conc in enumerate(levels):
        order = servers if i % 2 == 0 else servers[::-1]
        entry: Dict[str, Any] = {"concurrency": int(conc), "order": [s.role for s in order]}
        for s in order:
            flushed = flush_cache(s)
            run = run_level(s.url, prompts, int(conc), params, headers=s.headers(), timeout_s=timeout_s, api=api)
            summary = summarize_level(run.records, run.duration_s, speculative=s.role == SPEC, block_size=block)
            summary["cache_flushed"] = flushed
            summary["per_request"] = [asdict(r) for r in run.records]
            entry[s.role] = summary
            if s.role == SPEC:
                spec_records.extend(run.records)
            tau = summary.get("mean_acceptance_length")
            say(f"concurrency {conc:>3} {s.role:>8}: {summary['output_tokens_per_s']:7.2f} tok/s, "
                f"{summary['completed']}/{summary['requests']} ok, {summary['errors']} errors"
                + (f", tau {tau:.3f}" if tau is not None else ""))
        if BASE in entry:
            entry["speedup"] = speedup(entry[SPEC], entry[BASE])
        out_levels.append(entry)
    return {
        "endpoint": ("/generate (stream, meta_info)" if api == "generate" else
                     "/v1/completions (stream, continuous_usage_stats, return_spec_tokens_details)"),
        "levels": out_levels, "acceptance": acceptance(spec_records, block),
        "servers": {s.role: {**asdict(s), "api_key": None, "admin_api_key": None, "server_info": info[s.role]}
                    for s in servers},
        "block_size": block, "max_new_tokens": params.max_new_tokens, "temperature": params.temperature,
        "ignore_eos": params.ignore_eos, "concurrency_levels": [int(c) for c in levels],
        "request_timeout_s": timeout_s, "bench_wall_s": time.monotonic() - t_start,
        "prompts": [{"id": p.id, "domain": p.domain, "prompt_tokens": len(p.prompt_ids)} for p in prompts],
    }


def best_drafter(block_size: int, target_dir: Path) -> Tuple[Optional[str], str]:
    """The best drafter available for a target: the SFT drafter ``$SPECOPD_HOME/drafters/<target>-sft-b<B>``
    (what ``specopd main`` trains) if present, else None (the config's own drafter). Returns (dir, reason)."""
    from sglang_specopd.wire.home import drafters_dir

    sft = drafters_dir() / f"{target_dir.name}-sft-b{block_size}"
    if (sft / "model.safetensors").is_file():
        return str(sft), f"SFT-trained drafter {sft} (best available)"
    return None, f"the config's drafter (no SFT drafter at {sft})"


def _start_all(servers: Sequence[Any], timeout_s: float) -> None:
    """Start every server at once (one thread each) and wait for all; the first failure is raised after every start
    has returned (the caller stops them all)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=max(1, len(servers)), thread_name_prefix="bench-start") as pool:
        futures = [pool.submit(srv.start, timeout_s) for srv in servers]
    for f in futures:
        f.result()


@contextlib.contextmanager
def launched_servers(config: str, *, drafter: Optional[str] = None, baseline: bool = True,
                     log_dir: Optional[Path] = None, api_key: Optional[str] = None,
                     start_timeout_s: float = 900.0,
                     say: Callable[[str], None] = print) -> Iterator[Tuple[List[BenchServer], Path]]:
    """Start the speculative server of ``config`` (and, if ``baseline``, the same config without drafter) on free
    ports; yield ``(servers, target_dir)``; stop them all on exit.

    Raises: ``ConfigError`` (bad config), ``ServeError`` (target missing, drafter invalid, start-up failed),
    :class:`BenchError` (the config runs no drafter).
    """
    from sglang_specopd.app.config import ServeConfig
    from sglang_specopd.app.launch.process import SGLangServer, ServeError, free_port, server_env
    from sglang_specopd.app.models import ModelsError, resolve_target
    from sglang_specopd.app.serve.spec import config_path, launch_spec

    cfg = ServeConfig.load(config_path(config))
    if cfg.speculative_algorithm is None or (cfg.drafter is None and drafter is None):
        raise BenchError(f"config {config!r} runs no drafter; --launch needs a speculative config (cpu-smollm2)")
    try:
        target = resolve_target(cfg.target)
    except ModelsError as exc:
        raise ServeError(str(exc)) from None
    choice = "given with --drafter"
    if drafter is None:
        drafter, choice = best_drafter(cfg.block_size or 8, Path(target))
    plans = [(SPEC, cfg, drafter)]
    if baseline:
        plans.append((BASE, cfg.model_copy(update={"drafter": None, "speculative_algorithm": None}), None))
    threads = server_env(cfg.device).get("OMP_NUM_THREADS") if cfg.device == "cpu" else None
    with contextlib.ExitStack() as stack:
        started, used = [], set()
        for role, c, d in plans:
            port = free_port()
            while port in used:
                port = free_port()
            used.add(port)
            spec = launch_spec(c, port=port, api_key=api_key, drafter=d)
            log = (Path(log_dir) / f"bench-{role}.log") if log_dir else None
            srv = SGLangServer(spec, log_path=log)
            stack.callback(srv.stop)  # whatever happens below (stop is a no-op on a server that never started)
            say(f"starting {role} server ({c.name}{', drafter ' + spec.drafter_path if spec.drafter_path else ''}); "
                f"log {srv.log_path}")
            started.append((role, spec, srv))
        _start_all([srv for _, _, srv in started], start_timeout_s)  # at once: the imports overlap the waits
        servers = []
        for role, spec, srv in started:
            say(f"{role} server healthy after {srv.time_to_healthy_s:.0f} s at {srv.url}")
            servers.append(BenchServer(
                role=role, url=srv.url, api_key=api_key, launched=True, config=str(config_path(config)),
                drafter=spec.drafter_path, drafter_choice=choice if role == SPEC else None,
                time_to_healthy_s=srv.time_to_healthy_s, log_path=str(srv.log_path), server_threads=threads))
        yield servers, Path(target)
