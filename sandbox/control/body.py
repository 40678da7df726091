"""A request body that must be a JSON object, refused as Google's REST front ends refuse it otherwise."""

from __future__ import annotations

import json

from sandbox.control.errors import invalid_argument


def json_object(raw: bytes) -> dict:
    """The body's JSON object (``{}`` for an empty body); 400 INVALID_ARGUMENT for anything else."""
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except ValueError:
        raise invalid_argument("Invalid JSON payload received.") from None
    if not isinstance(body, dict):
        raise invalid_argument("Invalid JSON payload received: expected an object.")
    return body
