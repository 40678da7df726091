"""STUB: the ArtifactRegistry API stand-in (to be implemented)."""

from __future__ import annotations

from starlette.routing import BaseRoute

from sandbox.control import ControlContext


class ArtifactRegistry:
    name = "artifactregistry"

    def __init__(self, ctx: ControlContext) -> None:
        self.ctx = ctx

    def routes(self) -> list[BaseRoute]:
        return []

    def admin_routes(self) -> list[BaseRoute]:
        return []

    async def shutdown(self) -> None:
        pass
