"""The metadata server of a Cloud Run instance or GCE VM, on its own loopback port: identity for the pipeline.

Where the flows run on Google Cloud (a Cloud Run worker, a VM), google-auth asks the metadata server for ID
tokens (``google.oauth2.id_token.fetch_id_token``: ``GOOGLE_APPLICATION_CREDENTIALS`` first, then a ping of the
metadata server, then ``instance/service-accounts/default/identity?audience=...&format=full``). This stand-in
answers the same paths, so the product's one code path mints real, signed tokens in the sandbox too:

- ``GET /`` (the ping) and every answer carry ``Metadata-Flavor: Google``; a request without that header is
  refused 403 ("Missing Metadata-Flavor:Google header.", Compute Engine docs "Troubleshooting metadata server
  access": 403 when "the request fails security checks").
- ``.../service-accounts/default/identity``: an RS256 JWT for the audience (sandbox/identity.py); no audience is
  a 400 "non-empty audience parameter required".
- ``.../service-accounts/default/email``, ``.../default/?recursive=true``, ``.../default/token``,
  ``project/project-id``, ``project/numeric-project-id`` and ``instance/region`` (Cloud Run's
  "projects/NUMBER/regions/REGION"), which google-auth's Compute Engine credentials read.

The identity is the sandbox's caller principal (``SandboxConfig.caller``): the account the pipeline runs as.

How google-auth finds it: ``GCE_METADATA_IP`` (host:port) is read at every ping, but ``GCE_METADATA_HOST`` is
read ONCE, when ``google.auth.compute_engine._metadata`` is first imported. ``point_google_auth_at`` sets both
and must run before that import; tests (tests/conftest.py) and the demo call it at start-up. It is not a Google
API path, so it lives on its own port, outside the control plane and its discovery-document checks.
"""

from __future__ import annotations

import os
import sys

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from sandbox.config import SandboxConfig
from sandbox.identity import TokenIssuer, unique_id
from sandbox.serving import free_port, sandbox_host

FLAVOR = {"Metadata-Flavor": "Google"}
ACCOUNT = "/computeMetadata/v1/instance/service-accounts/{account}"
CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"


def point_google_auth_at(port: int | None = None) -> int:
    """Make google-auth in this process (and its children) use a metadata server on the sandbox's address (127.0.0.1
    unless ``sandbox.serving.sandbox_host`` says otherwise), port ``port``.

    Pass the port the sandbox will serve it on (``python -m sandbox up --metadata-port``); without one, a free
    port is picked. Raises if google-auth already read another host: the setting would be ignored silently.
    """
    host = sandbox_host()
    port = port or free_port(host)
    address = f"{host}:{port}"
    loaded = sys.modules.get("google.auth.compute_engine._metadata")
    if loaded is not None and address != loaded._GCE_METADATA_HOST:
        raise RuntimeError(
            "google.auth.compute_engine._metadata was imported before the metadata address was set; call "
            "sandbox.metadata.point_google_auth_at() first"
        )
    os.environ["GCE_METADATA_HOST"] = address
    os.environ["GCE_METADATA_IP"] = address
    os.environ.pop("GOOGLE_APPLICATION_CREDENTIALS", None)  # fetch_id_token would try a key file first
    return port


def _text(body: str, status: int = 200) -> Response:
    return PlainTextResponse(body, status_code=status, headers=FLAVOR, media_type="application/text")


def build_metadata_app(config: SandboxConfig, issuer: TokenIssuer, account: str | None = None) -> Starlette:
    """The metadata server for the sandbox's caller (``config`` is read per request: tests change the caller), or,
    with ``account``, for that service account: a Cloud Run job's tasks get one that answers as the job's identity,
    and its access tokens act as that account (sandbox.identity.AccessTokens)."""

    def email() -> str:
        return account or config.caller.split(":", 1)[1]

    def known(request: Request) -> bool:
        return request.path_params["account"] in ("default", email())

    def missing(request: Request) -> Response:
        return _text(f"{request.url.path} not found", 404)

    async def ping(_: Request) -> Response:
        return _text("computeMetadata/\n")

    async def account_email(request: Request) -> Response:
        return _text(email()) if known(request) else missing(request)

    async def account_info(request: Request) -> Response:
        if not known(request):
            return missing(request)
        if request.query_params.get("recursive") != "true":
            return _text("aliases\nemail\nidentity\nscopes\ntoken\n")
        info = {"aliases": ["default"], "email": email(), "scopes": [CLOUD_PLATFORM_SCOPE]}
        return JSONResponse(info, headers=FLAVOR)

    async def identity(request: Request) -> Response:
        if not known(request):
            return missing(request)
        audience = request.query_params.get("audience", "")
        if not audience:
            return _text("non-empty audience parameter required", 400)
        full = request.query_params.get("format") == "full"
        return _text(issuer.mint(email(), audience, full=full))

    async def access_token(request: Request) -> Response:
        if not known(request):
            return missing(request)
        # Opaque: the host's token acts as the configured caller, a job's as its account (sandbox.authz.caller).
        token = {
            "access_token": issuer.access_tokens.mint(f"serviceAccount:{account}" if account else None),
            "expires_in": 3599,
            "token_type": "Bearer",
        }
        return JSONResponse(token, headers=FLAVOR)

    async def project_id(_: Request) -> Response:
        return _text(config.project)

    async def project_number(_: Request) -> Response:
        return _text(config.project_number)

    async def region(_: Request) -> Response:
        return _text(f"projects/{config.project_number}/regions/{config.region}")

    async def unique(request: Request) -> Response:
        return _text(unique_id(email()))

    routes = [
        Route("/", ping),
        Route("/computeMetadata/v1/", ping),
        Route(ACCOUNT + "/email", account_email),
        Route(ACCOUNT + "/", account_info),
        Route(ACCOUNT + "/identity", identity),
        Route(ACCOUNT + "/token", access_token),
        Route("/computeMetadata/v1/project/project-id", project_id),
        Route("/computeMetadata/v1/project/numeric-project-id", project_number),
        Route("/computeMetadata/v1/instance/region", region),
        Route("/computeMetadata/v1/instance/id", unique),
    ]
    return Starlette(routes=routes, middleware=[])


class RequireFlavor:
    """Refuse requests without ``Metadata-Flavor: Google``, as the metadata server does (SSRF protection)."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
            if headers.get("metadata-flavor") != "Google" or "x-forwarded-for" in headers:
                response = _text(
                    f"Your client does not have permission to get URL {scope['path']} from this server. Missing "
                    "Metadata-Flavor:Google header.",
                    403,
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
