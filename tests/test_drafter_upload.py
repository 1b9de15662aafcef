"""Drafters of real size (issue 54, item 2): a drafter push streamed to a temporary file with the limit
(``drafter_max_payload_mb``) enforced while it streams, memory bounded, then loaded by the scheduler from the file
(:mod:`sglang_specopd.server.drafter.upload`). No server: the route functions on a stand-in request."""

from __future__ import annotations

import asyncio
import hashlib
import tempfile
import time
import tracemalloc
from pathlib import Path

import pytest
import torch

from sglang_specopd.server.drafter import upload as drafter_upload
from sglang_specopd.server.drafter.upload import UPLOAD_PREFIX, decode_upload, drafter_limit, is_upload, receive
from sglang_specopd.server.http.body import BodyError
from sglang_specopd.wire.protocol import decode_tensors, swap_payload

MiB = 2**20


class Request:
    """A Starlette request stand-in: ``headers`` and ``stream()`` yielding ``chunks`` (an iterable)."""

    def __init__(self, chunks, content_length=None):
        self.chunks = chunks
        self.headers = {} if content_length is None else {"content-length": str(content_length)}

    async def stream(self):
        for chunk in self.chunks:
            yield chunk


@pytest.fixture(autouse=True)
def upload_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def _uploads(d: Path):
    return sorted(p.name for p in d.glob(UPLOAD_PREFIX + "*"))


def test_limit_from_the_config_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPECOPD_MAX_PAYLOAD_BYTES", raising=False)
    size, source = drafter_limit({})
    assert size == 64 * MiB and "drafter_max_payload_mb" in source  # unset: the payload limit, as before
    assert drafter_limit({"SPECOPD_DRAFTER_MAX_PAYLOAD_MB": "4096"}) == (4096 * MiB, "server config key "
                                                                         "drafter_max_payload_mb = 4096")
    for bad in ("0", "-3", "abc", "inf"):
        with pytest.raises(ValueError, match="drafter_max_payload_mb"):
            drafter_limit({"SPECOPD_DRAFTER_MAX_PAYLOAD_MB": bad})
    assert drafter_upload.limit_env(None) == {} and drafter_upload.limit_env(2048.0) == {
        "SPECOPD_DRAFTER_MAX_PAYLOAD_MB": "2048"}


def test_over_the_limit_is_413_naming_the_key_while_streaming(upload_tmp: Path) -> None:
    """50 MB streamed against a 10 MB limit: 413 as soon as it grows past it, the key named, no file left;
    a declared Content-Length over it is refused before any byte is read."""
    limit = (10 * MiB, "server config key drafter_max_payload_mb = 10")
    read = []

    def chunks():
        for _ in range(50):
            read.append(1)
            yield b"\x01" * MiB

    with pytest.raises(BodyError) as err:
        asyncio.run(receive(Request(chunks()), limit))
    assert err.value.status == 413 and "drafter_max_payload_mb = 10" in err.value.message
    assert len(read) == 11 and _uploads(upload_tmp) == []
    with pytest.raises(BodyError) as err:
        asyncio.run(receive(Request(iter(()), content_length=50 * MiB), limit))
    assert err.value.status == 413 and str(50 * MiB) in err.value.message
    assert "drafter_max_payload_mb" in err.value.message


def test_json_and_empty_bodies_pass_as_they_are(upload_tmp: Path) -> None:
    body = b'{"path": "/drafters/d1", "version": "v1"}'
    assert asyncio.run(receive(Request([body[:10], body[10:]]))) == (body, None)
    assert asyncio.run(receive(Request([]))) == (b"", None)
    with pytest.raises(BodyError, match="JSON drafter body"):
        asyncio.run(receive(Request([b"{" + b" " * (70 * 1024) + b"}"])))
    assert _uploads(upload_tmp) == []


def test_an_upload_decodes_as_the_bytes_do(upload_tmp: Path) -> None:
    """The scheduler reads the upload file to the same tensors, header and digest as the body in memory; the
    hot swap's request reader takes it (sglang_specopd.server.drafter.swap)."""
    from sglang_specopd.server.drafter.swap import _read_request

    tensors = {"layers.0.mlp.up_proj.weight": torch.randn(64, 32), "norm.weight": torch.ones(32)}
    body = swap_payload({"architectures": ["DFlashDraftModel"]}, tensors, "v7")
    payload, path = asyncio.run(receive(Request([body[i:i + 1000] for i in range(0, len(body), 1000)])))
    assert is_upload(payload) and path.is_file() and len(payload) < 300
    got, header, digest = decode_upload(payload)
    want, want_header = decode_tensors(body)
    assert digest == hashlib.sha256(body).hexdigest() and header == want_header
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    config, loaded, version = _read_request(payload)
    assert version == "v7" and config == {"architectures": ["DFlashDraftModel"]} and loaded.keys() == want.keys()
    drafter_upload.discard(path)
    assert _uploads(upload_tmp) == []
    with pytest.raises(ValueError, match="not an upload file"):
        decode_upload(drafter_upload.UPLOAD_MARK + b'{"file": "/etc/passwd", "sha256": "0"}')


def test_a_1_gib_drafter_streams_in_bounded_memory(upload_tmp: Path) -> None:
    """A 1 GiB body (a real-size drafter: DFlash's Qwen3-8B drafter is ~2 GB in bf16) under a 2 GiB limit: written
    to the upload file with its SHA-256, Python memory peak under 16 MiB (one chunk at a time: memory does not
    grow with the body)."""
    chunk = bytes(range(256)) * (MiB // 256)
    n = 1024
    expected = hashlib.sha256()
    for _ in range(n):
        expected.update(chunk)
    t0 = time.monotonic()
    tracemalloc.start()
    try:
        payload, path = asyncio.run(receive(Request(chunk for _ in range(n)), (2048 * MiB, "test")))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    try:
        assert path.stat().st_size == n * MiB
        assert payload.endswith(f'"sha256": "{expected.hexdigest()}"}}'.encode())
        assert peak < 16 * MiB, peak
        print(f"1 GiB upload: {time.monotonic() - t0:.1f} s, Python memory peak {peak / MiB:.2f} MiB")
    finally:
        drafter_upload.discard(path)
