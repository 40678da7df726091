"""Cloud Run's front end for one URL: the service URL splits by traffic percent, a tag URL pins a revision.

A private service checks the caller as Cloud Run does ("Authenticating service-to-service", "Set custom
audiences" and "Authenticate developers" in the Cloud Run docs):
- no bearer token: 403 Forbidden;
- a token that is not a Google-signed ID token (here: not signed by the sandbox's key), has expired, or whose
  ``aud`` is not one of the service's own ``*.run.app`` URLs or custom audiences (or gcloud's OAuth client id, as
  a user's token from gcloud or Application Default Credentials carries): 401 Unauthorized. A tag URL is
  not accepted as an audience: the docs name the service URL ("the Google-generated URL ... always remains an
  accepted audience value") and custom audiences only; a token for the service URL works on its tag URLs;
- a valid token of a principal without ``run.routes.invoke`` on the service (roles/run.invoker, or a project role
  that has it): 403 Forbidden.
The token is taken from ``X-Serverless-Authorization`` first, then ``Authorization`` (Cloud Run docs), and never
passed on to the container. Requests are proxied to the instance of the chosen revision, streaming both ways.

Each request that reached an instance is reported to ``on_served(revision, status, seconds)`` once its response has
finished streaming (the Cloud Monitoring stand-in counts them, sandbox/control/monitoring): the front end's own
refusals (401/403, 503 with no instance, 429 over capacity) are not, as Cloud Run's request_count "excludes requests
that are not reaching your container instances"; ``seconds`` runs from the hand-off to the instance to the last byte,
as request_latencies "does not include container startup latency".

A revision whose instance already holds as many requests as it takes (``capacity``: max_instance_request_concurrency
x the one instance the sandbox runs) makes a new request pend, then answers 429 "Rate exceeded." (throttle.py, with
the sources); such a refusal goes to ``on_throttled(revision, http_request)``, for the revision's request log.
"""

from __future__ import annotations

import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import httpx
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, Response, StreamingResponse

from sandbox.control.run.throttle import THROTTLED_BODY, Capacity, Throttle
from sandbox.identity import TokenIssuer

FORBIDDEN = """<html><head><title>403 Forbidden</title></head><body><h1>Error: Forbidden</h1>
<h2>Your client does not have permission to get URL <code>{path}</code> from this server.</h2></body></html>"""
# Cloud Run's 401 page for a token it cannot verify or that names another audience (as quoted in
# google/adk-python issue 3814), with the WWW-Authenticate of Google's front ends (google-auth-library-nodejs
# issue 1208: "The access token could not be verified").
UNAUTHORIZED = """<html><head>
<meta http-equiv="content-type" content="text/html;charset=utf-8">
<title>401 Unauthorized</title>
</head>
<body text=#000000 bgcolor=#ffffff>
<h1>Error: Unauthorized</h1>
<h2>Your client does not have permission to the requested URL <code>{path}</code>.</h2>
<h2></h2>
</body></html>
"""
INVALID_TOKEN = 'Bearer error="invalid_token" error_description="The access token could not be verified"'
# A user's ID token from gcloud (`gcloud auth print-identity-token`) or from Application Default Credentials
# (`gcloud auth application-default login`, google-auth's user-credentials refresh) names gcloud's OAuth client as
# ``aud``, not the service: Cloud Run trusts those client ids as audiences on every service (Google's
# cloud-run-proxy PR 8: "When using the gcloud token, Cloud Run trusts the gcloud client IDs as valid aud values";
# client ids as listed in googleapis/google-auth-library-java PR 469).
GCLOUD_CLIENT_AUDIENCES = frozenset(
    {
        "32555940559.apps.googleusercontent.com",  # gcloud CLI (gcloud auth login)
        "764086051850-6qr4p6gpi6hn506pt8ejuq83di341hur.apps.googleusercontent.com",  # gcloud ADC login
    }
)
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
    "x-serverless-authorization",
    "proxy-authorization",
    "content-length",
}


@dataclass
class Routing:
    """Where one URL sends requests: weighted revisions (service URL) or a single one (tag URL)."""

    public: bool
    targets: list[tuple[str, int]]
    audiences: frozenset[str] = frozenset()
    """What a token's ``aud`` may be: the service's URLs and its custom audiences."""
    may_invoke: Callable[[str], bool] = lambda _principal: True
    """Whether a principal ("serviceAccount:..." / "user:...") holds run.routes.invoke on the service."""

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
        issuer: TokenIssuer | None = None,
        on_served: Callable[[str, int, float], None] | None = None,
        capacity: Callable[[str], Capacity | None] | None = None,
        throttle: Throttle | None = None,
        on_throttled: Callable[[str, dict], None] | None = None,
    ) -> None:
        self.routing = routing
        self.on_served = on_served
        self.issuer = issuer
        self.instance_url = instance_url
        self.client = client
        self.rng = random.Random()
        self.capacity = capacity
        self.throttle = throttle or Throttle()
        self.on_throttled = on_throttled

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        request = Request(scope, receive)
        response, admitted = await self._handle(request)
        try:
            await response(scope, receive, send)
        finally:  # the last byte went out, or the caller went away: the revision's slot frees up either way
            if admitted:
                self.throttle.release(admitted)

    def _refusal(self, request: Request, routing: Routing) -> Response | None:
        """Cloud Run's answer to a caller it does not let through, or None."""
        header = request.headers.get("x-serverless-authorization") or request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        path = request.url.path
        if scheme.lower() != "bearer" or not token.strip():
            return HTMLResponse(FORBIDDEN.format(path=path), status_code=403)
        claims = self.issuer.verify(token.strip()) if self.issuer is not None else None
        if claims is None or (
            claims.audience.rstrip("/") not in routing.audiences and claims.audience not in GCLOUD_CLIENT_AUDIENCES
        ):
            return HTMLResponse(
                UNAUTHORIZED.format(path=path), status_code=401, headers={"www-authenticate": INVALID_TOKEN}
            )
        if not routing.may_invoke(claims.principal):
            return HTMLResponse(FORBIDDEN.format(path=path), status_code=403)
        return None

    async def _handle(self, request: Request) -> tuple[Response, str]:
        """The answer, and the revision whose slot it holds until it has been sent ("" for none)."""
        routing = self.routing()
        if routing is None:
            return Response("Not Found", status_code=404), ""
        if not routing.public:
            refused = self._refusal(request, routing)
            if refused is not None:
                return refused, ""
        revision = routing.pick(self.rng)
        base = await self.instance_url(revision) if revision else None
        if base is None or revision is None:
            return HTMLResponse(UNAVAILABLE, status_code=503), ""
        capacity = self.capacity(revision) if self.capacity is not None else None
        if capacity is not None:
            pending_since = time.monotonic()
            if not await self.throttle.admit(revision, capacity):
                self._throttled(request, revision, time.monotonic() - pending_since, capacity)
                # x-sandbox-revision: which revision refused it (the sandbox's own header, as on proxied answers)
                refused = PlainTextResponse(THROTTLED_BODY, 429, headers={"x-sandbox-revision": revision})
                return refused, ""
        try:
            return await self._proxy(request, revision, base), revision if capacity is not None else ""
        except BaseException:  # e.g. the caller went away before the instance answered
            if capacity is not None:
                self.throttle.release(revision)
            raise

    async def _proxy(self, request: Request, revision: str, base: str) -> Response:
        """The instance's answer, streamed back as it comes."""
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        upstream = self.client.build_request(
            request.method,
            f"{base}{request.url.path}",
            params=request.url.query,
            headers=headers,
            content=request.stream(),
        )
        started = time.monotonic()
        try:
            answer = await self.client.send(upstream, stream=True)
        except httpx.HTTPError:
            self._served(revision, 503, started)  # it reached the instance, which dropped it
            return HTMLResponse(UNAVAILABLE, status_code=503)
        passed = {k: v for k, v in answer.headers.items() if k.lower() not in HOP_BY_HOP}
        passed["x-sandbox-revision"] = revision or ""
        return StreamingResponse(
            self._relay(answer, revision, started),
            status_code=answer.status_code,
            headers=passed,
            background=BackgroundTask(answer.aclose),
        )

    async def _relay(self, answer: httpx.Response, revision: str, started: float) -> AsyncIterator[bytes]:
        """The instance's body, reported to ``on_served`` after the last byte (or when the caller goes away)."""
        try:
            async for chunk in answer.aiter_raw():
                yield chunk
        finally:
            self._served(revision, answer.status_code, started)

    def _served(self, revision: str, status: int, started: float) -> None:
        if self.on_served is not None:
            self.on_served(revision, status, time.monotonic() - started)

    def _throttled(self, request: Request, revision: str, waited: float, capacity: Capacity) -> None:
        """A 429 for the revision's request log: the LogEntry's httpRequest, its latency on the instance's clock."""
        if self.on_throttled is None:
            return
        http_request = {
            "requestMethod": request.method,
            "requestUrl": str(request.url),
            "status": 429,
            "userAgent": request.headers.get("user-agent", ""),
            "remoteIp": request.client.host if request.client else "",
            "protocol": f"HTTP/{request.scope.get('http_version', '1.1')}",
            "latency": f"{waited / capacity.time_scale:.6f}s",
        }
        self.on_throttled(revision, http_request)
