"""Drafters of real size (issue 54, item 2): the body of ``POST /specopd/drafter/swap`` and ``/stage`` streamed to
a temporary file, with the drafter limit enforced while it streams, and loaded by the scheduler from that file.

The HTTP process never holds a drafter body in memory: :func:`receive` writes it chunk by chunk (SHA-256 on the
way) to ``specopd-upload-*.safetensors`` in the server's temporary directory, and the scheduler op gets a short
payload naming the file (:data:`UPLOAD_MARK` + JSON ``{"file", "sha256"}``); :func:`decode_upload` reads it there
(tensors and the specopd header, as :func:`sglang_specopd.wire.protocol.decode_tensors` does for bytes). The route
removes the file once the op has answered (:func:`discard`). A JSON body (``{"path": DIR, "version"}``: a drafter
directory the worker reads itself) goes to the scheduler as it is (at most :data:`JSON_BODY_MAX_BYTES`).

Limit: the server config key ``drafter_max_payload_mb`` (exported as ``SPECOPD_DRAFTER_MAX_PAYLOAD_MB``); unset,
the plugin's payload limit (``SPECOPD_MAX_PAYLOAD_BYTES``, default 64 MiB) as before. A body over it gets 413
naming the key, refused from its declared ``Content-Length`` before any byte is written, else as soon as it grows
past the limit. Memory in the HTTP process: one chunk (uvicorn's, ~64 KiB) whatever the drafter's size.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Dict, Mapping, Optional, Tuple

LIMIT_ENV = "SPECOPD_DRAFTER_MAX_PAYLOAD_MB"
CONFIG_KEY = "drafter_max_payload_mb"
UPLOAD_MARK = b"\x00specopd-upload\n"
UPLOAD_PREFIX = "specopd-upload-"
JSON_BODY_MAX_BYTES = 64 * 2**10
EMPTY_BODY = "empty body: send drafter safetensors bytes or JSON {\"path\": DIR}"


def limit_env(mb: Optional[float]) -> Dict[str, str]:
    """The server environment for ``drafter_max_payload_mb`` = ``mb`` (empty when unset)."""
    return {LIMIT_ENV: f"{mb:g}"} if mb else {}


def drafter_limit(environ: Optional[Mapping[str, str]] = None) -> Tuple[int, str]:
    """``(bytes, what sets it)``: ``SPECOPD_DRAFTER_MAX_PAYLOAD_MB`` when set (a positive number of MiB), else the
    plugin's payload limit. Raises ValueError for a bad value (read when the routes are added: the start stops)."""
    from sglang_specopd.server.http.errors import max_payload_bytes

    raw = (os.environ if environ is None else environ).get(LIMIT_ENV, "").strip()
    if not raw:
        return max_payload_bytes(), f"server config key {CONFIG_KEY} unset: SPECOPD_MAX_PAYLOAD_BYTES"
    try:
        mb = float(raw)
    except ValueError:
        mb = -1.0
    if not 0 < mb < float("inf"):
        raise ValueError(f"{LIMIT_ENV}={raw!r} ({CONFIG_KEY}) must be a positive number of MiB")
    return int(mb * 2**20), f"server config key {CONFIG_KEY} = {mb:g}"


def upload_dir() -> Path:
    """Where uploads are written: the server's temporary directory (shared by its HTTP and scheduler processes)."""
    return Path(tempfile.gettempdir())


async def receive(request, limit: Optional[Tuple[int, str]] = None) -> Tuple[bytes, Optional[Path]]:
    """``(op payload, upload file or None)`` for a drafter body: a JSON body as it is, an empty one as ``b""``,
    anything else written to an upload file and named by the payload. The caller passes the file to
    :func:`discard` when done. Raises :class:`~sglang_specopd.server.http.body.BodyError` (413 over the limit
    naming ``drafter_max_payload_mb``, 408, 400) with no file left behind."""
    from sglang_specopd.server.http.body import BodyError, iter_body

    max_bytes, source = limit or drafter_limit()
    fd, name = tempfile.mkstemp(prefix=UPLOAD_PREFIX, suffix=".safetensors", dir=upload_dir())
    path, digest, size, head = Path(name), hashlib.sha256(), 0, b""
    try:
        with os.fdopen(fd, "wb") as f:
            async for chunk in iter_body(request, max_bytes, limit_name=source):
                f.write(chunk)
                digest.update(chunk)
                size += len(chunk)
                head = head or chunk[:1]
    except BaseException:
        discard(path)
        raise
    if head != b"{" or size == 0:
        if size == 0:
            discard(path)
            return b"", None
        return UPLOAD_MARK + json.dumps({"file": str(path), "sha256": digest.hexdigest()}).encode(), path
    try:
        if size > JSON_BODY_MAX_BYTES:
            raise BodyError(413, f"a JSON drafter body of {size} bytes exceeds {JSON_BODY_MAX_BYTES} bytes "
                                 "(send {\"path\": DIR, \"version\": str})")
        return path.read_bytes(), None
    finally:
        discard(path)


def discard(path: Optional[Path]) -> None:
    """Remove an upload file (no error when it is gone)."""
    if path is not None:
        try:
            path.unlink()
        except FileNotFoundError:
            pass


def is_upload(payload: bytes) -> bool:
    return payload[: len(UPLOAD_MARK)] == UPLOAD_MARK


def decode_upload(payload: bytes) -> Tuple[Dict[str, object], dict, str]:
    """``(tensors, specopd header, sha256 of the body)`` of an upload payload (scheduler side). Raises ValueError
    (HTTP 400) for a file that is not a specopd swap payload; the file must be one :func:`receive` wrote."""
    from safetensors.torch import load_file

    from sglang_specopd.wire.protocol import specopd_header

    meta = json.loads(payload[len(UPLOAD_MARK):])
    path = Path(meta["file"])
    if path.parent != upload_dir() or not path.name.startswith(UPLOAD_PREFIX):
        raise ValueError(f"refused: {path} is not an upload file")
    try:
        with open(path, "rb") as f:
            header_len = int.from_bytes(f.read(8), "little")
            if not 0 < header_len <= min(100 * 2**20, path.stat().st_size - 8):
                raise ValueError(f"malformed safetensors payload: header length {header_len}")
            header = specopd_header(f.read(header_len))
        tensors = load_file(str(path))
    except ValueError:
        raise
    except Exception as exc:  # safetensors' own errors on truncated or garbled files
        raise ValueError(f"malformed safetensors payload: {exc}") from None
    return tensors, header, str(meta["sha256"])
