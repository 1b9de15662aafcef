"""The score_trees tests' view of conftest's shared ``tiny_admin_server`` (:class:`Shared`, :func:`shared_server`)
and request helpers (:func:`post_score`, :func:`score`, :func:`assert_4xx`, :func:`random_tree`,
:func:`node_paths`, :func:`make_scaled_drafter`), used by the score_trees, hot-swap, hybrid, QSA and fleet tests."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path
from typing import Dict, List, Optional

import httpx
import pytest
import torch

from conftest import (
    TINY_ADMIN_KEY,
    TINY_ADMIN_PREFIX_CACHE_MB,
    TINY_MAX_PAYLOAD,
    TINY_PROMPTS,
    RunningServer,
)
from sglang_specopd.wire.protocol import (
    ADMIN_KEY_HEADER,
    BINARY_CONTENT_TYPE,
    SCORE_TREES_PATH,
    ScoreTreesRequest,
    decode_tensors,
    request_to_binary,
)

ADMIN_KEY = TINY_ADMIN_KEY
MAX_PAYLOAD = TINY_MAX_PAYLOAD
PROMPTS = TINY_PROMPTS[:3]
NEW_TOKENS = 16
PREFIX_CACHE_MB = TINY_ADMIN_PREFIX_CACHE_MB  # reference prefixes' K/V kept across calls (exactness tests run on it)


@dataclasses.dataclass
class Shared:
    """The running SPECOPD server and what the two modules need about it."""

    srv: RunningServer
    target: Path
    drafter: Path  # the initial (serving at start) drafter
    scaled_drafter: Path  # same spec, weights scaled up: proposes something other than the mask token
    vocab_size: int
    num_layers: int
    hidden_size: int
    initial_info: dict  # GET /specopd/drafter right after start
    reference: Dict[str, List[int]]  # greedy output ids per prompt, before any swap

    @property
    def url(self) -> str:
        return self.srv.url

    @property
    def admin_headers(self) -> Dict[str, str]:
        return {"Authorization": f"Bearer {ADMIN_KEY}"}


def make_scaled_drafter(drafter: Path, out: Path, seed: int = 123) -> Path:
    """Copy of ``drafter`` with every matrix x10 and every norm vector random in [0.5, 1.5]."""
    from safetensors.torch import load_file

    from sglang_specopd.wire.drafters.format import read_drafter_spec
    from sglang_specopd.wire.drafters.init import save_drafter

    gen = torch.Generator().manual_seed(seed)
    tensors = load_file(str(drafter / "model.safetensors"))
    scaled = {n: (t * 10 if t.dim() == 2 else 0.5 + torch.rand(t.shape, generator=gen, dtype=t.dtype)).contiguous()
              for n, t in tensors.items()}
    save_drafter(read_drafter_spec(drafter), scaled, out)
    return out


@pytest.fixture(scope="module")
def shared_server(tiny_admin_server: RunningServer, tiny_serving_target: Path, tiny_drafter: Path,
                  tmp_path_factory) -> Shared:
    """The SPECOPD server of test_score_trees.py and test_hot_swap.py: conftest's shared ``tiny_admin_server``
    (admin key, prefix cache, 1 MB payload limit; serving its start-up drafter, caches empty, when a module starts)."""
    srv, target = tiny_admin_server, tiny_serving_target
    cfg = json.loads((target / "config.json").read_text())
    scaled = make_scaled_drafter(tiny_drafter, tmp_path_factory.mktemp("scaled-drafter") / "scaled")
    reference = {p: srv.generate(p, NEW_TOKENS)["output_ids"] for p in PROMPTS}
    return Shared(srv=srv, target=target, drafter=tiny_drafter, scaled_drafter=scaled,
                  vocab_size=int(cfg["vocab_size"]), num_layers=int(cfg["num_hidden_layers"]),
                  hidden_size=int(cfg["hidden_size"]), initial_info=srv.extra["initial_info"], reference=reference)


def post_score(url: str, req, *, binary: bool = False, timeout: float = 120.0,
               admin_key: Optional[str] = ADMIN_KEY) -> httpx.Response:
    """POST a score_trees request, with ``admin_key`` (the shared server's by default: hidden states and features
    need it) in the admin-key header."""
    key = {ADMIN_KEY_HEADER: admin_key} if admin_key else {}
    if binary:
        return httpx.post(url + SCORE_TREES_PATH, content=request_to_binary(req),
                          headers={"Content-Type": BINARY_CONTENT_TYPE, **key}, timeout=timeout)
    body = req.model_dump_json() if isinstance(req, ScoreTreesRequest) else json.dumps(req)
    return httpx.post(url + SCORE_TREES_PATH, content=body, headers={"Content-Type": "application/json", **key},
                      timeout=timeout)


def score(url: str, req, **kw):
    r = post_score(url, req, **kw)
    assert r.status_code == 200, f"score_trees -> {r.status_code}: {r.text[:500]}"
    assert r.headers["content-type"].startswith(BINARY_CONTENT_TYPE)
    return decode_tensors(r.content)


def assert_4xx(r: httpx.Response, *needles: str) -> str:
    assert r.status_code in (400, 413, 422), (r.status_code, r.text[:500])
    msg = r.json()["error"]["message"]
    assert msg, r.text
    for n in needles:
        assert n.lower() in msg.lower(), (n, msg)
    return msg


def random_tree(rng: random.Random, vocab: int, n: int, max_depth: int):
    """``n`` nodes, parents -1 or an earlier node, every path at most ``max_depth`` tokens."""
    tokens, parents, depth = [], [], []
    for i in range(n):
        options = [-1] + [j for j in range(i) if depth[j] + 1 < max_depth]
        p = rng.choice(options)
        parents.append(p)
        depth.append(0 if p == -1 else depth[p] + 1)
        tokens.append(rng.randrange(5, vocab))
    return tokens, parents


def node_paths(tokens: List[int], parents: List[int]) -> List[List[int]]:
    """Root-to-node token path of every node."""
    out = []
    for i in range(len(tokens)):
        path, k = [], i
        while k != -1:
            path.append(tokens[k])
            k = parents[k]
        out.append(path[::-1])
    return out
