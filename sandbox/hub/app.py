"""The Hub stand-in's three faces: the Hub origin, the LFS CDN origin, and the admin routes.

The runtime serves the Hub and the CDN on two ports (huggingface_hub drops credentials across origins, and
tests must see that), wraps both in the fault middleware, and mounts the admin routes under ``/_sandbox/hub``.
"""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.routing import BaseRoute, Route

from sandbox.hub.admin import hub_admin_routes as _admin_routes
from sandbox.hub.api import HubApi
from sandbox.hub.cdn import cdn_routes
from sandbox.hub.state import HubState


def build_hub_app(state: HubState) -> Starlette:
    """The Hub origin: ``/api/models/...``, ``/api/whoami-v2`` and ``/{repo_id}/resolve/{revision}/{path}``."""
    api = HubApi(state)
    return Starlette(routes=[Route("/{path:path}", api.handle, methods=["GET", "HEAD", "POST"])])


def build_cdn_app(state: HubState) -> Starlette:
    """The CDN origin serving LFS objects behind the signed URLs the Hub redirects to."""
    return Starlette(routes=cdn_routes(state))


def hub_admin_routes(state: HubState) -> list[BaseRoute]:
    """Admin routes (see ``sandbox.hub.admin``) for the control plane to mount at ``/_sandbox/hub``."""
    return _admin_routes(state)
