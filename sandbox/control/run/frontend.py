"""Cloud Run's front end for one URL: the service URL splits by traffic percent, a tag URL pins a revision.

Like Cloud Run, a private service refuses requests without a bearer token (403) and the token is not passed
on to the container. Requests are proxied to the instance of the chosen revision, streaming both ways.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import httpx
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response, StreamingResponse

FORBIDDEN = """<html><head><title>403 Forbidden</title></head><body><h1>Error: Forbidden</h1>
<h2>Your client does not have permission to get URL <code>{path}</code> from this server.</h2></body></html>"""
UNAVAILABLE = """<html><head><title>503 Service Unavailable</title></head><body><h1>Error: Service Unavailable</h1>
<h2>The service you requested is not available yet. Please try again in 30 seconds.</h2></body></html>"""
HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "transfer-encoding",
    "te",
    "upgrade",
    "host",
    "authorization",
    "proxy-authorization",
    "content-length",
}


@dataclass
class Routing:
    """Where one URL sends requests: weighted revisions (service URL) or a single one (tag URL)."""

    public: bool
    targets: list[tuple[str, int]]

    def pick(self, rng: random.Random) -> str | None:
        live = [(rev, pct) for rev, pct in self.targets if pct > 0]
        if not live:
            return None
        return rng.choices([r for r, _ in live], weights=[p for _, p in live])[0]


class FrontEnd:
    """ASGI app for one service or tag URL; ``routing()`` and ``instance_url()`` come from the control plane."""

    def __init__(
        self,
        routing: Callable[[], Routing | None],
        instance_url: Callable[[str], Awaitable[str | None]],
        client: httpx.AsyncClient,
    ) -> None:
        self.routing = routing
        self.instance_url = instance_url
        self.client = client
        self.rng = random.Random()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        request = Request(scope, receive)
        response = await self._handle(request)
        await response(scope, receive, send)

    async def _handle(self, request: Request) -> Response:
        routing = self.routing()
        if routing is None:
            return Response("Not Found", status_code=404)
        if not routing.public and not request.headers.get("authorization", "").startswith("Bearer "):
            return HTMLResponse(FORBIDDEN.format(path=request.url.path), status_code=403)
        revision = routing.pick(self.rng)
        base = await self.instance_url(revision) if revision else None
        if base is None:
            return HTMLResponse(UNAVAILABLE, status_code=503)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        upstream = self.client.build_request(
            request.method,
            f"{base}{request.url.path}",
            params=request.url.query,
            headers=headers,
            content=request.stream(),
        )
        try:
            answer = await self.client.send(upstream, stream=True)
        except httpx.HTTPError:
            return HTMLResponse(UNAVAILABLE, status_code=503)
        passed = {k: v for k, v in answer.headers.items() if k.lower() not in HOP_BY_HOP}
        passed["x-sandbox-revision"] = revision or ""
        return StreamingResponse(
            answer.aiter_raw(), status_code=answer.status_code, headers=passed, background=BackgroundTask(answer.aclose)
        )
