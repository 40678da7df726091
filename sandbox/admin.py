"""The sandbox's own admin API under ``/_sandbox`` on the control plane: faults, request log, settings.

Tests and the demo drive it over HTTP (see ``sandbox.handle.SandboxHandle``); no Google path starts with
``/_sandbox``, so it never shadows an API the product calls.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Route

from sandbox.config import ConfigUpdate
from sandbox.faults import FaultRule, unknown_server_message

if TYPE_CHECKING:
    from sandbox.runtime import SandboxRuntime


def _bad_request(exc: ValidationError) -> JSONResponse:
    return JSONResponse({"error": exc.errors(include_url=False, include_context=False)}, status_code=400)


def admin_routes(runtime: SandboxRuntime) -> list[BaseRoute]:
    async def info(_: Request) -> JSONResponse:
        return JSONResponse(runtime.info())

    async def add_fault(request: Request) -> JSONResponse:
        # A misspelt key or server is refused (400, naming it): accepted, the rule would never do what the test meant.
        try:
            rule = FaultRule.model_validate(await request.json(), context={"servers": runtime.faults.servers})
        except ValidationError as exc:
            return _bad_request(exc)
        return JSONResponse(runtime.faults.add(rule).model_dump())

    async def list_faults(_: Request) -> JSONResponse:
        return JSONResponse([r.model_dump() for r in runtime.faults.rules()])

    async def clear_faults(request: Request) -> JSONResponse:
        server = request.query_params.get("server")
        if server is not None and (problem := unknown_server_message(server, runtime.faults.servers)):
            # A misspelt server would clear nothing and leave the rule to fire in the next test.
            return JSONResponse({"error": [{"loc": ["server"], "msg": problem}]}, status_code=400)
        return JSONResponse([r.model_dump() for r in runtime.faults.clear(server)])  # the rules removed

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

    async def settle_grants(_: Request) -> JSONResponse:
        # Time passing for IAM: the grants made so far have propagated, those made next still wait (a test of a grant
        # made on top of older ones, e.g. the compile cache's beside a bucket's read access).
        return JSONResponse({"settled": runtime.ctx.grants.settle()})

    return [
        Route("/info", info, methods=["GET"]),
        Route("/grants/settle", settle_grants, methods=["POST"]),
        Route("/faults", add_fault, methods=["POST"]),
        Route("/faults", list_faults, methods=["GET"]),
        Route("/faults", clear_faults, methods=["DELETE"]),
        Route("/requests", requests, methods=["GET"]),
        Route("/conformance", conformance, methods=["GET"]),
        Route("/config", update_config, methods=["POST"]),
    ]
