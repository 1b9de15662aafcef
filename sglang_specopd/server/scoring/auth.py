"""Who may ask ``POST /specopd/score_trees`` for the target's hidden states and context features (issue 54).

Top-k ids, log-probs and log-sum-exps are what any API-key holder may have (SGLang's ``/generate`` returns
log-probs too). The final hidden states (``returns: hidden``) and the context features (``feature_layer_ids``) are
the target's internals: enough to fit its LM head or distil it, a model-extraction channel. They need the admin
key, sent as :data:`sglang_specopd.wire.protocol.ADMIN_KEY_HEADER` (``X-SpecOPD-Admin-Key``) or, on a server
without ``--api-key``, as ``Authorization: Bearer <admin key>``:

- a server with ``--admin-api-key``: a request without that key gets 401 with the reason;
- a server with ``--api-key`` but no admin key: 403 (nobody may have them; set ``admin_api_key``);
- a server with no key at all (an open development server, where every route but the admin ones is open): allowed,
  as SGLang's ADMIN_OPTIONAL level allows its routes on a server without keys.

The route's own auth level stays SGLang's NORMAL (``--api-key`` checked by SGLang's middleware first); this check
runs after the body is parsed, when the request's ``returns`` and ``feature_layer_ids`` are known.
"""

from __future__ import annotations

import secrets
from typing import Optional, Sequence, Tuple

from sglang_specopd.wire.protocol import ADMIN_KEY_HEADER

_KEYS = {"api_key": None, "admin_api_key": None}


class ScoreAuthError(Exception):
    """A score_trees request refused for its privileged parts: HTTP ``status`` (401 / 403) and a one-line reason."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


def configure(server_args) -> None:
    """Keep the server's ``--api-key`` and ``--admin-api-key`` (called from the routes' launch_server hook)."""
    _KEYS["api_key"] = getattr(server_args, "api_key", None) or None
    _KEYS["admin_api_key"] = getattr(server_args, "admin_api_key", None) or None


def _matches(given: Optional[str], key: str) -> bool:
    return bool(given) and secrets.compare_digest(given.encode(), key.encode())


def _bearer(authorization: Optional[str]) -> Optional[str]:
    parts = (authorization or "").split(" ", 1)
    return parts[1] if len(parts) == 2 and parts[0].lower() == "bearer" else None


def decide(parts: Sequence[str], *, authorization: Optional[str], admin_header: Optional[str],
           api_key: Optional[str], admin_api_key: Optional[str]) -> Optional[Tuple[int, str]]:
    """``None`` when a request asking for ``parts`` (:func:`sglang_specopd.wire.protocol.privileged_parts`) may
    have them, else ``(status, reason)``. Pure: the module docstring's rules."""
    if not parts:
        return None
    what = " and ".join(parts)
    if admin_api_key:
        if _matches(admin_header, admin_api_key) or (not api_key and _matches(_bearer(authorization), admin_api_key)):
            return None
        return 401, (f"score_trees with {what} needs the admin key (the target's hidden states and features are "
                     f"admin-only): send it in the {ADMIN_KEY_HEADER} header")
    if api_key:
        return 403, (f"score_trees with {what} needs the admin key and this server has none: start it with "
                     f"admin_api_key (--admin-api-key)")
    return None


def checker(headers):
    """A function of a parsed request that raises :class:`ScoreAuthError` when ``headers`` (the HTTP request's)
    do not allow its privileged parts (this server's keys, :func:`configure`)."""
    from sglang_specopd.wire.protocol import privileged_parts

    authorization, admin_header = headers.get("authorization"), headers.get(ADMIN_KEY_HEADER.lower())

    def check(req) -> None:
        refused = decide(privileged_parts(req), authorization=authorization, admin_header=admin_header,
                         api_key=_KEYS["api_key"], admin_api_key=_KEYS["admin_api_key"])
        if refused is not None:
            raise ScoreAuthError(*refused)

    return check
