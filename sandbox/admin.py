"""The sandbox's own admin API under ``/_sandbox`` on the control plane: faults, request log, settings.

Tests and the demo drive it over HTTP (see ``sandbox.handle.SandboxHandle``); no Google path starts with
``/_sandbox``, so it never shadows an API the product calls.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Route

from sandbox.faults import FaultRule

if TYPE_CHECKING:
    from sandbox.runtime import SandboxRuntime


class ConfigUpdate(BaseModel):
    """The settings a running sandbox takes: a key it does not know is refused (400), never silently dropped."""

    model_config = ConfigDict(extra="forbid")

    time_scale: float | None = Field(None, gt=0, le=1)
    gpu_quota: dict[str, int] | None = None
    zonal_redundancy_gpu_quota: int | None = Field(None, ge=0)
    cpu_quota: float | None = None
    memory_quota_gib: float | None = None
    runtime_gpu_quota: bool | None = None
    gpu_release_seconds: float | None = Field(None, ge=0)
    iam_propagation_seconds: float | None = Field(None, ge=0)
    grant_propagation_seconds: float | None = Field(None, ge=0)
    monitoring_delay_seconds: float | None = Field(None, ge=0)
    caller: str | None = Field(None, pattern=r"^(user|serviceAccount|group):[^@\s]+@[^@\s]+$")
    disabled_apis: list[str] | None = None
    org_policies: dict[str, dict] | None = None
    serverless_ip_hold_seconds: float | None = Field(None, ge=0)
    prometheus_ingest_delay_seconds: float | None = Field(None, ge=0)
    job_start_seconds: float | None = Field(None, ge=0)


def _bad_request(exc: ValidationError) -> JSONResponse:
    return JSONResponse({"error": exc.errors(include_url=False, include_context=False)}, status_code=400)


def admin_routes(runtime: SandboxRuntime) -> list[BaseRoute]:
    async def info(_: Request) -> JSONResponse:
        return JSONResponse(runtime.info())

    async def add_fault(request: Request) -> JSONResponse:
        try:
            rule = FaultRule.model_validate(await request.json())
        except ValidationError as exc:
            return _bad_request(exc)
        return JSONResponse(runtime.faults.add(rule).model_dump())

    async def list_faults(_: Request) -> JSONResponse:
        return JSONResponse([r.model_dump() for r in runtime.faults.rules()])

    async def clear_faults(request: Request) -> JSONResponse:
        runtime.faults.clear(request.query_params.get("server"))
        return JSONResponse({})

    async def requests(request: Request) -> JSONResponse:
        server = request.query_params.get("server")
        since = int(request.query_params.get("since", "0"))
        return JSONResponse([r.model_dump() for r in runtime.faults.requests(server, since)])

    async def conformance(_: Request) -> JSONResponse:
        # Responses of the sandbox that broke Google's published schemas (sandbox.conformance); must stay empty.
        return JSONResponse(runtime.conformance.violations())

    async def update_config(request: Request) -> JSONResponse:
        try:
            update = ConfigUpdate.model_validate(await request.json())
        except ValidationError as exc:
            return _bad_request(exc)
        for key, value in update.model_dump(exclude_none=True).items():
            setattr(runtime.config, key, value)
        return JSONResponse(runtime.config.model_dump())

    return [
        Route("/info", info, methods=["GET"]),
        Route("/faults", add_fault, methods=["POST"]),
        Route("/faults", list_faults, methods=["GET"]),
        Route("/faults", clear_faults, methods=["DELETE"]),
        Route("/requests", requests, methods=["GET"]),
        Route("/conformance", conformance, methods=["GET"]),
        Route("/config", update_config, methods=["POST"]),
    ]
