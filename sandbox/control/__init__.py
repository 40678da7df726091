"""The control plane: Google REST APIs as modules on one HTTP app.

Each API module implements ``ApiModule``: its Google routes, its admin routes (mounted at
``/_sandbox/{name}``) and a shutdown hook. Modules are built from one ``ControlContext`` (settings, fault
registry, state folder, the GCS emulator, the shared long-running operation store, and the other modules,
for checks that cross APIs, such as Cloud Run asking IAM whether a service account exists). The runtime
builds the app from ``build_modules``; adding an API means adding it there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from starlette.routing import BaseRoute

from sandbox.authz.propagation import GrantLedger
from sandbox.config import SandboxConfig
from sandbox.faults import FaultRegistry


class ApiModule(Protocol):
    name: str

    def routes(self) -> list[BaseRoute]: ...

    def admin_routes(self) -> list[BaseRoute]: ...

    async def shutdown(self) -> None: ...


@dataclass
class ControlContext:
    """What every API module may use. ``control_url`` is known once the control plane listens."""

    config: SandboxConfig
    faults: FaultRegistry
    state_dir: Path
    gcs_url: str
    gcs_emulator_url: str
    control_url: str = ""
    hub_url: str = ""  # the Hub stand-in: "the internet" for containers whose egress reaches it
    gcs_front: object | None = None  # sandbox.gcs_front.GcsFront: bucket IAM policies for sandbox.authz
    identity: object | None = None  # sandbox.identity.TokenIssuer: the key ID tokens are signed and checked with
    token_uri: str = ""  # where service-account keys send their assertions ("" = the control plane's /token)
    tls_ca_file: str = ""  # the TLS face's CA (sandbox/tls.py), which containers trust; "" when it is off
    modules: dict[str, ApiModule] = field(default_factory=dict)
    grants: GrantLedger = field(default_factory=GrantLedger)  # when each role grant takes effect (sandbox.authz)

    def module(self, name: str):
        """Another API module by name (e.g. "iam"), or None when the sandbox runs without it."""
        return self.modules.get(name)


def build_modules(ctx: ControlContext) -> list[ApiModule]:
    from sandbox.control.artifactregistry import ArtifactRegistry
    from sandbox.control.cloudbuild import CloudBuild
    from sandbox.control.compute import Compute
    from sandbox.control.iam import Iam
    from sandbox.control.logging import Logging
    from sandbox.control.monitoring import Monitoring
    from sandbox.control.operations import Operations
    from sandbox.control.orgpolicy import OrgPolicy
    from sandbox.control.resourcemanager import ResourceManager
    from sandbox.control.run import CloudRun
    from sandbox.control.secretmanager import SecretManager
    from sandbox.control.serviceusage import ServiceUsage

    modules: list[ApiModule] = [
        Operations(ctx),
        CloudRun(ctx),
        Compute(ctx),
        Iam(ctx),
        SecretManager(ctx),
        ArtifactRegistry(ctx),
        CloudBuild(ctx),
        Logging(ctx),
        Monitoring(ctx),
        ServiceUsage(ctx),
        OrgPolicy(ctx),
        ResourceManager(ctx),
    ]
    ctx.modules.update({m.name: m for m in modules})
    return modules
