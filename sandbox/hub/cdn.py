"""The LFS CDN: a second origin serving LFS objects by sha256 behind signed, expiring URLs.

huggingface_hub drops the Authorization header when the Hub redirects to another origin, so the CDN cannot
check tokens; like CloudFront, it trusts a signature the Hub put in the query string instead.
"""

from __future__ import annotations

import posixpath
import re
import time
from urllib.parse import quote, urlencode

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from sandbox.hub.repo import RepoFile
from sandbox.hub.state import HubState
from sandbox.hub.transfer import blob_response

_SHA256 = re.compile(r"[0-9a-f]{64}")


def cdn_location(state: HubState, item: RepoFile) -> str:
    """A signed CDN URL for an LFS file, valid for ``state.cdn_url_ttl_s`` seconds."""
    assert item.lfs_sha256 is not None
    sha = item.lfs_sha256
    expires = int(time.time() + state.cdn_url_ttl_s)
    name = posixpath.basename(item.path).encode("ascii", "replace").decode().replace('"', "")
    query = urlencode(
        {
            # The trailing ";" matters: huggingface_hub reads the display name with filename="(.*?)";
            "response-content-disposition": f"inline; filename*=UTF-8''{quote(name)}; filename=\"{name}\";",
            "Expires": expires,
            "Signature": state.sign(sha, expires),
            "Key-Pair-Id": "SANDBOXCDNKEY",
        }
    )
    return f"{state.cdn_url}/repos/{sha[:2]}/{sha[2:4]}/{sha}?{query}"


def _s3_error(status: int, code: str, message: str) -> Response:
    body = f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{message}</Message></Error>'
    return Response(body, status_code=status, media_type="application/xml")


def cdn_routes(state: HubState) -> list[BaseRoute]:
    """``GET``/``HEAD /repos/{sha[:2]}/{sha[2:4]}/{sha256}?Expires=..&Signature=..`` with Range support."""

    async def lfs_object(request: Request) -> Response:
        sha = request.path_params["sha"]
        a, b = request.path_params["a"], request.path_params["b"]
        if not _SHA256.fullmatch(sha) or (a, b) != (sha[:2], sha[2:4]):
            return _s3_error(404, "NoSuchKey", "The specified key does not exist.")
        query = request.query_params
        if not state.check_signature(sha, query.get("Expires", ""), query.get("Signature", "")):
            return _s3_error(403, "AccessDenied", "Request has expired or the signature does not match.")
        blob = state.lfs_blob(sha)
        if blob is None:
            return _s3_error(404, "NoSuchKey", "The specified key does not exist.")
        headers = {"ETag": f'"{sha}"', "Cache-Control": "public, max-age=604800, immutable"}
        if disposition := query.get("response-content-disposition"):
            headers["Content-Disposition"] = disposition
        return blob_response(request, blob, headers, "application/octet-stream")

    return [Route("/repos/{a}/{b}/{sha}", lfs_object, methods=["GET", "HEAD"])]
