"""A disabled API refuses every call, as Google's front end does before the API itself sees the request.

On a fresh project nothing but a few default services is enabled; the first call to Cloud Run answers 403
PERMISSION_DENIED with reason SERVICE_DISABLED. The JSON below is the real shape, as reported in public issues:
google-gemini/gemini-cli issue 1343 (ErrorInfo with metadata serviceTitle, consumer, containerInfo, service,
activationUrl, then LocalizedMessage and Help), GoogleCloudPlatform/emblem issue 757 and firebase/firebase-tools
issue 10366 (the Cloud Run Admin API message text), GoogleCloudPlatform/community PR 884 (older APIs add the
``accessNotConfigured`` reason); the ErrorInfo contract is google.api.ErrorReason.SERVICE_DISABLED ("consumer":
"projects/123", "service": "pubsub.googleapis.com").

The gate routes each request to its discovery method (``sandbox.discovery.match``) and so to its service; requests
that match no Google method (the ``/_sandbox`` admin API, stand-in extras) pass untouched.
"""

from __future__ import annotations

import json

from sandbox import discovery
from sandbox.config import SandboxConfig
from sandbox.control.serviceusage.catalog import service_of, title_of

# APIs whose errors still carry the v1 "errors" list (Compute Engine, Cloud Storage JSON API).
LEGACY_ERROR_LISTS = {"compute.googleapis.com", "storage.googleapis.com"}


def service_disabled_body(service: str, project_number: str) -> dict:
    """Google's 403 for a call to ``service`` while it is not enabled in the project."""
    url = f"https://console.developers.google.com/apis/api/{service}/overview?project={project_number}"
    title = title_of(service)
    message = (
        f"{title} has not been used in project {project_number} before or it is disabled. Enable it by visiting "
        f"{url} then retry. If you enabled this API recently, wait a few minutes for the action to propagate to our "
        "systems and retry."
    )
    error: dict = {
        "code": 403,
        "message": message,
        "status": "PERMISSION_DENIED",
        "details": [
            {
                "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                "reason": "SERVICE_DISABLED",
                "domain": "googleapis.com",
                "metadata": {
                    "service": service,
                    "consumer": f"projects/{project_number}",
                    "serviceTitle": title,
                    "containerInfo": project_number,
                    "activationUrl": url,
                },
            },
            {"@type": "type.googleapis.com/google.rpc.LocalizedMessage", "locale": "en-US", "message": message},
            {
                "@type": "type.googleapis.com/google.rpc.Help",
                "links": [{"description": "Google developers console API activation", "url": url}],
            },
        ],
    }
    if service in LEGACY_ERROR_LISTS:
        error["errors"] = [
            {"message": message, "domain": "usageLimits", "reason": "accessNotConfigured", "extendedHelp": url}
        ]
    return {"error": error}


class ServiceGate:
    """ASGI middleware: 403 SERVICE_DISABLED for any call to a service in ``config.disabled_apis``."""

    def __init__(self, app, config: SandboxConfig) -> None:
        self.app = app
        self.config = config

    async def __call__(self, scope, receive, send) -> None:
        service = self._disabled_service(scope) if scope["type"] == "http" and self.config.disabled_apis else None
        if service is None:
            await self.app(scope, receive, send)
            return
        body = json.dumps(service_disabled_body(service, self.config.project_number)).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 403,
                "headers": [
                    (b"content-type", b"application/json; charset=UTF-8"),
                    (b"content-length", b"%d" % len(body)),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    def _disabled_service(self, scope) -> str | None:
        raw = scope.get("raw_path") or scope["path"].encode()
        path = raw.decode("latin-1").split("?", 1)[0]
        if path.startswith("/_sandbox"):
            return None
        found = discovery.match(scope["method"], path)
        if found is None:
            return None
        service = service_of(found.method.api)
        return service if service in self.config.disabled_apis else None
