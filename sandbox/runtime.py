"""One running sandbox: every stand-in on loopback, driven by one asyncio loop in one process.

Pieces: the Hub and its CDN (two origins, as huggingface_hub expects), fake-gcs-server (a child process)
behind a thin front that keeps what it ignores (bucket location, access settings, IAM) and serves resumable
uploads, and the control plane (Google REST APIs as modules, plus the ``/_sandbox`` admin API). Cloud Run services
add their own front-end ports and launch vLLM stand-ins as child processes.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

from starlette.applications import Starlette
from starlette.routing import BaseRoute, Mount

from sandbox import tls
from sandbox.admin import admin_routes
from sandbox.authz.middleware import AuthzMiddleware
from sandbox.config import SANDBOX_HF_TOKEN, SandboxConfig
from sandbox.conformance import ConformanceLog, ConformanceMiddleware
from sandbox.control import ApiModule, ControlContext, build_modules
from sandbox.control.errors import GoogleApiError, google_error_handler
from sandbox.control.serviceusage import ServiceGate
from sandbox.faults import FaultMiddleware, FaultRegistry
from sandbox.gcs import FakeGcs, start_fake_gcs
from sandbox.gcs_front import GcsFront
from sandbox.hub.app import build_cdn_app, build_hub_app, hub_admin_routes
from sandbox.hub.state import HubState, seed_default_repos
from sandbox.identity import TokenIssuer
from sandbox.metadata import RequireFlavor, build_metadata_app
from sandbox.oauth2 import token_routes
from sandbox.serving import ServedApp, sandbox_host, serve_app

INFO_FILE = "sandbox.json"


class SandboxRuntime:
    """Starts, describes and stops all stand-ins of one sandbox."""

    def __init__(self, state_dir: Path, config: SandboxConfig | None = None, *, tls_port: int | None = None) -> None:
        self.state_dir = state_dir
        self.config = config or SandboxConfig()
        self.faults = FaultRegistry()
        self.conformance = ConformanceLog()
        self.hub = HubState()
        self.identity = TokenIssuer()  # signs the metadata server's ID tokens; Cloud Run front ends verify them
        self.gcs: FakeGcs | None = None
        self.gcs_front: GcsFront | None = None
        self.apis: list[ApiModule] = []
        self.servers: dict[str, ServedApp] = {}
        # The TLS face (sandbox/tls.py): Google's host names over HTTPS on tls_port; None leaves it off.
        self.tls_port = tls_port
        self.tls_material: tls.TlsMaterial | None = None

    async def start(self) -> dict:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        # On this (the main) thread, not a worker thread: the emulator's parent-death signal follows the thread
        # that started it (prctl PR_SET_PDEATHSIG), and nothing is served yet that a short block could delay.
        self.gcs = start_fake_gcs(self.state_dir / "gcs")
        self.gcs_front = GcsFront(self.gcs.url, self.config.project, self.state_dir / "gcs" / "uploads")
        # Responses of the GCS front (and fake-gcs-server behind it) are held to storage.v1 (sandbox.conformance).
        gcs_app = ConformanceMiddleware(self.gcs_front.app(), self.conformance, ("storage.v1",), check_requests=False)
        # Permission checks for storage.* methods, as the caller (sandbox.authz); the context is built below.
        gcs_app = AuthzMiddleware(gcs_app, lambda: self.ctx, ("storage.v1",))
        gcs_app = ServiceGate(gcs_app, self.config)  # a disabled Cloud Storage API refuses too
        self.servers["gcs"] = await serve_app(FaultMiddleware(gcs_app, "gcs", self.faults), "gcs")
        if self.config.seed_models:
            seed_default_repos(self.hub)
        if self.config.engine == "vllm" and not (Path(self.config.engine_venv) / "bin" / "vllm").exists():
            raise RuntimeError(f"engine vllm: no engine at {self.config.engine_venv}; run `make engine` first")
        cdn = await serve_app(FaultMiddleware(build_cdn_app(self.hub), "cdn", self.faults), "cdn")
        self.servers["cdn"] = cdn
        self.hub.cdn_url = cdn.url
        self.servers["hub"] = await serve_app(FaultMiddleware(build_hub_app(self.hub), "hub", self.faults), "hub")
        self.ctx = ControlContext(
            config=self.config,
            faults=self.faults,
            state_dir=self.state_dir,
            gcs_url=self.servers["gcs"].url,
            gcs_emulator_url=self.gcs.url,
            hub_url=self.servers["hub"].url,
            identity=self.identity,
            gcs_front=self.gcs_front,
        )
        metadata = RequireFlavor(build_metadata_app(self.config, self.identity))
        self.servers["metadata"] = await serve_app(
            FaultMiddleware(metadata, "metadata", self.faults), "metadata", self.config.metadata_port
        )
        self.apis = build_modules(self.ctx)
        iam = self.ctx.module("iam")
        self.gcs_front.missing_account = iam.missing_account if iam is not None else None
        control = Starlette(
            routes=self._control_routes(),
            exception_handlers={GoogleApiError: google_error_handler},
        )
        # Faults outermost (a rule answers before anything is checked); inside the service gate, conformance to
        # Google's published schemas (sandbox.conformance: a malformed call fails before permissions are checked).
        checked = ConformanceMiddleware(AuthzMiddleware(control, self.ctx), self.conformance)  # authz: caller's IAM
        checked = ServiceGate(checked, self.config)  # a disabled API refuses before anything else looks
        self.servers["control"] = await serve_app(
            FaultMiddleware(checked, "control", self.faults, record_bodies=True), "control"
        )
        self.ctx.control_url = self.servers["control"].url
        # The TLS face (sandbox/tls.py), for clients that hard-code https://run.googleapis.com and friends
        # (prefect-gcp's Cloud Run worker): the very app objects served above, again on one HTTPS port, chosen by
        # Host; a new throwaway CA per start.
        if self.tls_port is not None:
            self.tls_material = tls.make_tls_material(self.state_dir / "tls", tls.TLS_NAMES, sandbox_host())
            router = tls.HostRouter(self.servers["control"].app, {tls.STORAGE_NAME: self.servers["gcs"].app})
            self.servers["tls"] = await serve_app(
                router,
                "tls",
                self.tls_port,
                ssl_certfile=str(self.tls_material.cert_file),
                ssl_keyfile=str(self.tls_material.key_file),
            )
            # Keys now name Google's token endpoint, and jobs' containers trust the CA (their image's trust store).
            self.ctx.token_uri = f"https://{tls.OAUTH2_NAME}/token"
            self.ctx.tls_ca_file = str(self.tls_material.ca_file)
        info = self.info()
        path = self.state_dir / INFO_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(info, indent=2))
        tmp.replace(path)  # readers never see half a file
        return info

    def _control_routes(self) -> list[BaseRoute]:
        admin = [
            Mount("/hub", routes=hub_admin_routes(self.hub)),
            *(Mount(f"/{api.name}", routes=api.admin_routes()) for api in self.apis),
            *admin_routes(self),
        ]
        return [
            Mount("/_sandbox", routes=admin),
            *token_routes(self.identity),  # Google's OAuth token endpoint, for service-account keys (sandbox/oauth2.py)
            *(route for api in self.apis for route in api.routes()),
        ]

    def info(self) -> dict:
        """What a client needs: URLs, a ready-to-use GcpTarget and ModelSource settings."""
        control = self.servers["control"].url
        assert self.gcs is not None
        info = {
            "pid": os.getpid(),
            "state_dir": str(self.state_dir),
            "control_url": control,
            "hub_url": self.servers["hub"].url,
            "cdn_url": self.servers["cdn"].url,
            "gcs_url": self.servers["gcs"].url,
            "gcs_emulator_url": self.gcs.url,
            "metadata_url": self.servers["metadata"].url,
            "time_scale": self.config.time_scale,
            "target": {
                "project": self.config.project,
                "region": self.config.region,
                "anonymous_credentials": True,
                "endpoints": {
                    "run": control,
                    "cloudbuild": control,
                    "compute": control,
                    "iam": control,
                    "secretmanager": control,
                    "artifactregistry": control,
                    "logging": control,
                    "monitoring": control,
                    "serviceusage": control,
                    "cloudresourcemanager": control,
                    "orgpolicy": control,
                    "storage": self.servers["gcs"].url,
                },
                "operation_poll_seconds": 0.05,
                # Cloud Monitoring sampling period and visibility delay, sandbox clock (sandbox/control/monitoring)
                "metrics_sample_seconds": 60 * self.config.time_scale,
                "metrics_delay_seconds": self.config.monitoring_delay_seconds * self.config.time_scale,
            },
            "hub": {
                "endpoint": self.servers["hub"].url,
                "token": SANDBOX_HF_TOKEN,
                "repos": sorted(self.hub.repos),
            },
        }
        # --- TLS face (sandbox/tls.py): where it listens and what a client must trust -----------------------------
        if self.tls_material is not None:
            info["tls"] = {
                "port": int(self.servers["tls"].url.rsplit(":", 1)[1]),
                "url": self.servers["tls"].url,
                "ca_file": str(self.tls_material.ca_file),
                "names": list(tls.TLS_NAMES),
                "hosts": tls.hosts_file_text(tls.TLS_NAMES, sandbox_host()),
            }
        return info

    async def stop(self) -> None:
        for api in self.apis:
            await api.shutdown()
        for server in reversed(list(self.servers.values())):
            await server.stop()
        if self.gcs_front is not None:
            await self.gcs_front.close()
        if self.gcs is not None:
            await asyncio.to_thread(self.gcs.stop)
