"""The control plane: Google REST APIs as modules on one HTTP app.

Each API module (Cloud Run now; Cloud Build, Compute, IAM, Secret Manager and Artifact Registry later)
implements ``ApiModule``: its Google routes, its admin routes (mounted at ``/_sandbox/{name}``) and a
shutdown hook. The runtime builds the app from the list; nothing else needs to change to add one.
"""

from __future__ import annotations

from typing import Protocol

from starlette.routing import BaseRoute


class ApiModule(Protocol):
    name: str
    control_url: str

    def routes(self) -> list[BaseRoute]: ...

    def admin_routes(self) -> list[BaseRoute]: ...

    async def shutdown(self) -> None: ...
