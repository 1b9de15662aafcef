"""The server session of ``specopd train`` (server, its drafter, target, tokenizer, initial drafter, pushes) and
the end-of-run summary. Heavy dependencies are imported inside the functions."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, List, Optional

import typer

from sglang_specopd.app.train.options import ADMIN_KEY_ENV, _TrainFail


class _Session:
    """What every ``specopd train`` command needs: the server, its drafter, target, tokenizer, initial drafter."""

    KEPT = "the server kept serving its old drafter"  # what a refused push leaves (the run's error says it)
    deferred: Optional[str] = None  # a push version put off for later (fleets: :meth:`_defer_push`)

    def __init__(self, server: str, api_key: Optional[str], admin_key: Optional[str], init: Optional[Path],
                 target: Optional[str], *, need_push: bool, say: Callable[[str], None]):
        import httpx

        from sglang_specopd.wire.protocol import DRAFTER_INFO_PATH
        from specopd_trainer.client.http import ServerRequestError, ServerUnavailableError, SpecOPDClient

        self.url = self.where = server.rstrip("/")
        self.api_key = api_key
        self.admin_key = admin_key or None
        probe = SpecOPDClient(self.url, api_key=api_key, retries=1, backoff_s=0.5, timeout=60)
        try:
            self.info = probe._request("GET", DRAFTER_INFO_PATH).json()
            try:
                self.model_info = probe._request("GET", "/model_info").json()
            except ServerRequestError:
                self.model_info = {}
        except (ServerUnavailableError, httpx.InvalidURL) as exc:
            raise _TrainFail(f"cannot reach the server at {self.url}: {exc}", 1) from None
        except ServerRequestError as exc:
            if exc.status == 404:
                raise _TrainFail(f"{self.url} is not a sglang-specopd server (GET {DRAFTER_INFO_PATH}: HTTP 404); "
                                 "start one with `specopd serve` (a fleet's router: pass it as --router URL instead, "
                                 "or --fleet-run-dir DIR, or --workers URL,URL)", 1) from None
            if exc.status in (401, 403):
                raise _TrainFail(f"the server refused the API key (HTTP {exc.status}: {exc.reason}); pass its "
                                 "--api-key as --api-key or SPECOPD_API_KEY", 1) from None
            raise _TrainFail(f"GET {DRAFTER_INFO_PATH} on {self.url} failed: {exc}", 1) from None
        except ValueError as exc:
            raise _TrainFail(f"{self.url} sent a non-JSON reply to GET {DRAFTER_INFO_PATH}: {exc}", 1) from None
        finally:
            probe.close()
        self.target = self._resolve_target(target)
        self.init = self._resolve_init(init, say)
        self.push_enabled = self.admin_key is not None
        if need_push and not self.push_enabled:
            raise _TrainFail(f"this method pushes the drafter into the server: pass --admin-key (or "
                             f"{ADMIN_KEY_ENV}) with the server's --admin-api-key")
        if self.push_enabled:
            self._check_push()
        else:
            say(f"no --admin-key ({ADMIN_KEY_ENV}): the trained drafter will not be pushed into the server")
        self.client = SpecOPDClient(self.url, api_key=api_key, admin_api_key=self.admin_key)

    def _resolve_target(self, target: Optional[str]) -> Path:
        from sglang_specopd.app.models import TargetNotFoundError, resolve_target

        name = target or self.model_info.get("model_path")
        if not name:
            raise _TrainFail("the server does not report its model_path (GET /model_info); pass --target")
        try:
            return resolve_target(name)
        except TargetNotFoundError as exc:
            hint = "" if target else " (the server's model_path; on another machine pass --target)"
            raise _TrainFail(f"{exc}{hint}") from None

    def _resolve_init(self, init: Optional[Path], say) -> Path:
        if init is None:
            path = self._server_drafter_path()
            if not path:
                raise _TrainFail("the server reports no drafter checkpoint (GET /specopd/drafter/admin has no "
                                 "path); pass --init DRAFTER_DIR")
            init = Path(path)
            if self.info.get("swaps"):
                say(f"note: the server has swapped drafters since it started (serving version "
                    f"{self.info.get('version')!r}); --init defaults to its start-up checkpoint {init}")
        if not (init / "config.json").is_file() or not (init / "model.safetensors").is_file():
            raise _TrainFail(f"--init {init}: not a drafter directory (needs config.json and model.safetensors)")
        return init

    def _server_drafter_path(self) -> Optional[str]:
        """The serving drafter's start-up checkpoint directory on the server: shown only with the admin key
        (``GET /specopd/drafter/admin``); without one, the user must pass --init."""
        from sglang_specopd.wire.protocol import DRAFTER_ADMIN_INFO_PATH
        from specopd_trainer.client.http import ServerRequestError, ServerUnavailableError, SpecOPDClient

        if not self.admin_key:
            raise _TrainFail("pass --init DRAFTER_DIR: the server shows where its drafter lives only to its admin "
                             f"(--admin-key / {ADMIN_KEY_ENV})")
        probe = SpecOPDClient(self.url, retries=1, backoff_s=0.5, timeout=60)
        try:
            r = probe._request("GET", DRAFTER_ADMIN_INFO_PATH, headers={"Authorization": f"Bearer {self.admin_key}"})
            return r.json().get("path")
        except ServerRequestError as exc:
            if exc.status in (401, 403):  # the same words as the push check's (the key is wrong either way)
                raise _TrainFail(f"push refused: the server rejected the admin key (HTTP {exc.status}: {exc.reason} "
                                 f"on GET {DRAFTER_ADMIN_INFO_PATH}); pass its --admin-api-key as --admin-key or "
                                 f"{ADMIN_KEY_ENV}", 1) from None
            raise _TrainFail(f"GET {DRAFTER_ADMIN_INFO_PATH} failed (HTTP {exc.status}: {exc.reason}); pass "
                             "--init DRAFTER_DIR", 1) from None
        except (ServerUnavailableError, ValueError) as exc:
            raise _TrainFail(f"GET {DRAFTER_ADMIN_INFO_PATH} on {self.url} failed: {exc}", 1) from None
        finally:
            probe.close()

    def load_drafter(self, device: str = "cpu", dtype=None):
        """The drafter to train (from ``--init``) with the target's embedding + LM head, on ``device`` in ``dtype``
        (default float32; ``--device`` / ``--dtype``: :func:`~sglang_specopd.app.train.options.resolve_device_dtype`)."""
        import torch

        from sglang_specopd.wire.drafters.archs import spec_as_dict
        from specopd_trainer.drafters.registry import drafter_class_for_checkpoint

        drafter = drafter_class_for_checkpoint(self.init).from_pretrained(self.init, self.target, device=device,
                                                                          dtype=dtype or torch.float32)
        if self.push_enabled:
            serving_arch, mine_arch = self.info.get("arch"), drafter.drafter_arch.name
            if serving_arch is not None and serving_arch != mine_arch:
                raise _TrainFail(f"the drafter {self.init} is a {mine_arch} drafter but the server serves a "
                                 f"{serving_arch} drafter; pushes would be refused")
            serving, mine = self.info.get("spec") or {}, spec_as_dict(drafter.spec)
            diff = [k for k in serving if k != "dtype" and serving[k] != mine.get(k)]
            if diff:
                raise _TrainFail(f"the drafter {self.init} cannot replace the serving one (differs in "
                                 f"{', '.join(diff)}); pushes would be refused")
        return drafter

    def _check_push(self) -> None:
        self._check_push_at(self.url)

    def _check_push_at(self, url: str) -> None:
        """Is the admin key accepted at ``url``? An empty swap body passes authentication and is then refused (400)
        without touching the serving drafter; 401/403 mean the key (or the server's admin key) is wrong."""
        import httpx

        from sglang_specopd.wire.protocol import SWAP_DRAFTER_PATH

        if not self.info.get("has_drafter", False):
            raise _TrainFail(f"the server at {url} serves no drafter, so nothing can be pushed into it; start "
                             "it with a SPECOPD drafter", 1)
        try:
            r = httpx.post(url + SWAP_DRAFTER_PATH, content=b"", timeout=60,
                           headers={"Authorization": f"Bearer {self.admin_key}"})
        except httpx.HTTPError as exc:
            raise _TrainFail(f"cannot reach the server at {url}: {exc}", 1) from None
        if r.status_code in (401, 403):
            raise _TrainFail(f"push refused: the server rejected the admin key (HTTP {r.status_code}: "
                             f"{r.text.strip()[:200]}); pass its --admin-api-key as --admin-key or "
                             f"{ADMIN_KEY_ENV}", 1)
        if r.status_code != 400:
            raise _TrainFail(f"unexpected reply to the push check (HTTP {r.status_code}: {r.text[:200]})", 1)

    def tokenizer(self):
        from transformers import AutoTokenizer

        path = self.model_info.get("tokenizer_path")
        path = path if path and Path(path).is_dir() else self.target
        try:
            return AutoTokenizer.from_pretrained(str(path))
        except (OSError, ValueError) as exc:
            raise _TrainFail(f"cannot load the target tokenizer {path}: {exc} (pass --target)") from None

    def serving_version(self) -> str:
        from sglang_specopd.wire.protocol import DRAFTER_INFO_PATH

        return str(self.client._request("GET", DRAFTER_INFO_PATH).json().get("version"))

    def push(self, drafter, version: str) -> None:
        """Hot-swap ``drafter`` into the server under ``version``; raises ServerRequestError when refused."""
        from specopd_trainer.pipeline import push_drafter

        push_drafter(self.url, drafter, version, self.admin_key)

    def check_traffic(self) -> None:
        """Can the admin read the server's traffic spool? Raises _TrainFail (exit 1) with the reason otherwise."""
        from specopd_trainer.client.http import ServerRequestError

        try:
            self.client.traffic_page(0, None, 1)
        except ServerRequestError as exc:
            raise _TrainFail(f"cannot read the server's traffic (HTTP {exc.status}: {exc.reason})", 1) from None

    def pusher(self, prefix: str, versions: List[str]):
        from specopd_trainer.client.http import ServerRequestError

        def push(step: int, drafter) -> None:
            version = f"{prefix}-step{step}"
            try:
                self.push(drafter, version)
            except ServerRequestError as exc:
                if self._defer_push(exc, version):
                    return
                raise _TrainFail(f"push refused: {self.KEPT} ({exc}); the training state is checkpointed, rerun "
                                 "the same command to resume", 1) from None
            self.deferred = None
            versions.append(version)

        return push if self.push_enabled else None

    def _defer_push(self, exc: Exception, version: str) -> bool:
        """Whether the failed push of ``version`` is put off (True) rather than ending the run: never for one
        server, where a failed push is a refusal."""
        return False

    def finish_pushes(self, drafter, versions: List[str]) -> None:
        """End of a run: nothing to retry against one server (a refused push already ended the run)."""


def _finish(sess: _Session, drafter, run_dir: Path, method: str, rows: List[tuple],
            versions: List[str]) -> None:
    """Rank 0: save the drafter (SGLang format), metrics.csv, print the summary table and where things are."""
    from rich.console import Console
    from rich.table import Table

    from specopd_trainer.loops.engine import write_metrics_csv

    out = drafter.save_pretrained(run_dir / "drafter", overwrite=True)
    if (run_dir / "metrics.jsonl").is_file():
        write_metrics_csv(run_dir)
    table = Table(title=f"specopd train {method}: {run_dir}")
    table.add_column("")
    table.add_column("value", justify="right")
    for k, v in rows:
        table.add_row(k, v)
    shown = versions if len(versions) <= 3 else [f"({len(versions)} pushes) ...", *versions[-3:]]
    table.add_row("pushed versions", ", ".join(shown) if shown else "-")
    Console().print(table)
    typer.echo(f"drafter saved to {out} (SGLang-loadable: specopd serve ... --drafter {out})")
    if sess.push_enabled:
        typer.echo(f"the server at {sess.where} now serves drafter version {sess.serving_version()!r}")
