"""``pageSize`` / ``pageToken`` list pages with an opaque offset token (IAM and Service Usage list methods)."""

from __future__ import annotations

import base64
from collections.abc import Mapping

from sandbox.control.errors import invalid_argument


def offset_page(rows: list[dict], field: str, query: Mapping[str, str], default_size: int, max_size: int) -> dict:
    """The list response for one page of ``rows``: ``{field: [...], "nextPageToken": ...}``, each key only when
    it has a value (as Google omits empty fields); 400 for a malformed ``pageSize`` or ``pageToken``."""
    try:
        size = int(query.get("pageSize") or default_size)
        start = _decode(query.get("pageToken", ""))
    except ValueError:
        raise invalid_argument("Request contains an invalid argument: pageSize or pageToken.") from None
    size = min(max(size, 1), max_size)
    body: dict = {}
    if rows[start : start + size]:
        body[field] = rows[start : start + size]
    if start + size < len(rows):
        body["nextPageToken"] = base64.urlsafe_b64encode(f"offset:{start + size}".encode()).decode()
    return body


def _decode(token: str) -> int:
    if not token:
        return 0
    text = base64.urlsafe_b64decode(token.encode()).decode()
    if not text.startswith("offset:"):
        raise ValueError(token)
    return int(text.removeprefix("offset:"))
