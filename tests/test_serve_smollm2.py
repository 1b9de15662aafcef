"""Real SGLang servers on the prepared SmolLM2-135M-Instruct target, float32 (server_configs/cpu-smollm2-fp32.yaml).

Two servers in all, one at a time (see conftest): plain (the config without drafter) for reference outputs, then
SPECOPD with the config's default drafter, started through ``serve.launch_spec`` and requiring an API key.
Skipped when SmolLM2 is not prepared (``specopd models prepare smollm2``) unless SPECOPD_REQUIRE_SMOLLM2=1.
"""

from __future__ import annotations

import json
import re

import httpx
import pytest

from conftest import SMOLLM2_API_KEY, SMOLLM2_NEW_TOKENS, SMOLLM2_PROMPTS

pytestmark = [pytest.mark.server, pytest.mark.smollm2]

CHAT = {"model": "smollm2", "messages": [{"role": "user", "content": "What is the capital of France? Answer in one "
                                                                   "short sentence."}],
        "temperature": 0, "max_tokens": 40}


def test_specopd_greedy_identity_fp32(smollm2_plain_outputs, smollm2_specopd_server) -> None:
    """SPECOPD (default drafter) greedy output ids == plain output ids, 3 prompts x 32 tokens, float32."""
    for prompt in SMOLLM2_PROMPTS:
        resp = smollm2_specopd_server.generate(prompt, SMOLLM2_NEW_TOKENS)
        assert resp["output_ids"] == smollm2_plain_outputs[prompt], prompt
        assert len(resp["output_ids"]) == SMOLLM2_NEW_TOKENS
        assert resp["meta_info"]["spec_verify_ct"] >= 1, "the request did not go through SPECOPD verify steps"


def test_chat_completion_is_english(smollm2_specopd_server) -> None:
    r = smollm2_specopd_server.post("/v1/chat/completions", CHAT)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    text = choice["message"]["content"]
    assert text and text.strip(), choice
    assert len(re.findall(r"[A-Za-z]", text)) >= 5, text
    assert re.search(r"\b[A-Za-z]{2,}\b", text), text
    assert choice["finish_reason"] in ("stop", "length"), choice


def test_streaming_chat_equals_non_streamed(smollm2_specopd_server) -> None:
    whole = smollm2_specopd_server.post("/v1/chat/completions", CHAT)
    assert whole.status_code == 200, whole.text
    expected = whole.json()["choices"][0]["message"]["content"]
    pieces, finish = [], None
    with httpx.stream("POST", smollm2_specopd_server.url + "/v1/chat/completions", json={**CHAT, "stream": True},
                      headers=smollm2_specopd_server.headers, timeout=300) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data:") or line.strip() == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data:"):])
            for choice in chunk.get("choices", []):
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    pieces.append(piece)
                finish = choice.get("finish_reason") or finish
    assert len(pieces) >= 3, pieces
    assert "".join(pieces) == expected
    assert finish == whole.json()["choices"][0]["finish_reason"]


def test_api_key_is_required(smollm2_specopd_server) -> None:
    url = smollm2_specopd_server.url
    payload = {"text": SMOLLM2_PROMPTS[0], "sampling_params": {"temperature": 0, "max_new_tokens": 4}}
    assert httpx.post(url + "/generate", json=payload, timeout=120).status_code == 401
    assert httpx.post(url + "/generate", json=payload, timeout=120,
                      headers={"Authorization": "Bearer wrong-key"}).status_code == 401
    assert httpx.post(url + "/v1/chat/completions", json=CHAT, timeout=120).status_code == 401
    ok = httpx.post(url + "/generate", json=payload, timeout=120,
                    headers={"Authorization": f"Bearer {SMOLLM2_API_KEY}"})
    assert ok.status_code == 200 and len(ok.json()["output_ids"]) == 4
