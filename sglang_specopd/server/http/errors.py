"""The plugin routes' shared HTTP pieces: the payload limit and the JSON error reply."""

from __future__ import annotations

import os
from typing import Dict, Optional

from sglang_specopd.wire.protocol import DEFAULT_MAX_PAYLOAD_BYTES


def max_payload_bytes() -> int:
    """The largest request body the plugin's routes take: ``SPECOPD_MAX_PAYLOAD_BYTES`` (default 64 MiB)."""
    return int(os.environ.get("SPECOPD_MAX_PAYLOAD_BYTES", DEFAULT_MAX_PAYLOAD_BYTES))


def error_response(status: int, message: str, headers: Optional[Dict[str, str]] = None):
    """``{"error": {"code": status, "message": message}}`` with that HTTP status (and ``headers``)."""
    from fastapi.responses import JSONResponse

    return JSONResponse({"error": {"code": status, "message": message}}, status_code=status, headers=headers)
