"""Raw ASGI helpers shared by the sandbox's middlewares (conformance, permission checks).

A middleware that inspects the request body must read all of it before the app runs, then hand the app a
``receive`` that yields the same bytes again; a middleware that answers by itself sends one complete response.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

Receive = Callable[[], Awaitable[dict[str, Any]]]


async def buffer_body(receive: Receive) -> tuple[bytes, Receive]:
    """The whole request body, and a ``receive`` that replays it to the app (then defers to the real one)."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    raw = b"".join(chunks)
    sent = False

    async def replay() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": raw, "more_body": False}
        return await receive()

    return raw, replay


async def send_response(send, status: int, body: bytes, content_type: bytes) -> None:
    """One complete response: status, content type and length, body."""
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
