"""Serve a blob over HTTP as the Hub and its CDN do: Content-Length, Range (206 / 416), chunked streaming."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from sandbox.hub.blobs import CHUNK_BYTES, Blob

_RANGE = re.compile(r"bytes=(\d*)-(\d*)")


class RangeNotSatisfiable(Exception):
    """The requested range starts at or beyond the end of the content."""


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """``(start, end_exclusive)`` for a single ``bytes=`` range, None for the whole content.

    Malformed and multi-part ranges are ignored (a server may answer them with 200 and the full body).
    """
    if not header:
        return None
    match = _RANGE.fullmatch(header.strip())
    if match is None:
        return None
    first, last = match.groups()
    if not first:
        if not last:
            return None
        length = min(int(last), size)
        if length == 0:
            raise RangeNotSatisfiable
        return size - length, size
    start = int(first)
    end = min(int(last) + 1, size) if last else size
    if start >= size or start >= end:
        raise RangeNotSatisfiable
    return start, end


async def _chunks(blob: Blob, start: int, end: int) -> AsyncIterator[bytes]:
    # Disk-backed blobs are read in a worker thread so a slow disk never stalls other requests.
    blocking = getattr(blob, "blocking", False)
    while start < end:
        stop = min(end, start + CHUNK_BYTES)
        yield await asyncio.to_thread(blob.read, start, stop) if blocking else blob.read(start, stop)
        start = stop


def blob_response(request: Request, blob: Blob, headers: dict[str, str], media_type: str) -> Response:
    """HEAD or GET of ``blob``, honouring a Range header on GET."""
    size = blob.size
    headers = {"Accept-Ranges": "bytes", **headers}
    if request.method == "HEAD":
        return Response(status_code=200, headers={**headers, "Content-Length": str(size)}, media_type=media_type)
    try:
        wanted = parse_range(request.headers.get("range"), size)
    except RangeNotSatisfiable:
        return Response(status_code=416, headers={**headers, "Content-Range": f"bytes */{size}"})
    start, end = wanted or (0, size)
    status = 200
    if wanted is not None:
        status = 206
        headers["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
    headers["Content-Length"] = str(end - start)
    if end - start <= CHUNK_BYTES and not getattr(blob, "blocking", False):
        return Response(blob.read(start, end), status_code=status, headers=headers, media_type=media_type)
    return StreamingResponse(_chunks(blob, start, end), status_code=status, headers=headers, media_type=media_type)
