"""Cloud Resource Manager v3 for the one sandbox project: ``projects.get``, ``getIamPolicy``, ``setIamPolicy``,
``testIamPermissions`` (https://cloud.google.com/resource-manager/reference/rest/v3/projects).

Paths as in the discovery document: ``GET /v3/projects/{project}``, ``POST /v3/projects/{project}:getIamPolicy``
(a POST on this API), ``:setIamPolicy``, ``:testIamPermissions``; the project may be named by id or number. The
project's IAM policy is where the caller's roles come from (``sandbox.authz``): it starts with the caller as
roles/owner, so a sandbox nobody configured lets everything through, as a project you created does.

``testIamPermissions`` needs no permission (its reference page: "There are no permissions required for making
this API call") and answers the subset the caller holds; ``permissions`` is left out when none is held.
Admin: ``POST /_sandbox/resourcemanager/caller-roles {"roles": [...], "member": optional}`` replaces the
member's (default: the caller's) project roles; ``GET /_sandbox/resourcemanager/policy``.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Route

from sandbox import authz
from sandbox.control import ControlContext
from sandbox.control.body import json_object
from sandbox.control.errors import GoogleApiError, invalid_argument, not_found
from sandbox.control.iam import ResourcePolicy, project_number
from sandbox.control.iam.policy import new_etag

# The project's creation time: any fixed instant works, the product never reads it.
CREATE_TIME = "2026-01-05T09:00:00.000Z"
MAX_TEST_PERMISSIONS = 100  # AIP: testIamPermissions takes at most 100 permissions


class ResourceManager:
    """The sandbox project and its IAM policy."""

    name = "resourcemanager"
    discovery_apis = ("cloudresourcemanager.v3",)

    def __init__(self, ctx: ControlContext) -> None:
        self.ctx = ctx
        self.config = ctx.config
        self.number = project_number(ctx.config)
        self.policy = ResourcePolicy(
            bindings=[{"role": "roles/owner", "members": [ctx.config.caller]}], etag=new_etag()
        )

    # Python API ---------------------------------------------------------------------------------------------
    def set_roles(self, member: str, roles: list[str]) -> dict:
        """Replace ``member``'s project roles with ``roles`` (unconditional bindings); the new policy JSON."""
        bindings = [{**b, "members": [m for m in b.get("members", []) if m != member]} for b in self.policy.bindings]
        for role in roles:
            binding = next((b for b in bindings if b["role"] == role and not b.get("condition")), None)
            if binding is None:
                bindings.append({"role": role, "members": [member]})
            else:
                binding["members"].append(member)
        self.policy.bindings = [b for b in bindings if b["members"]]
        self.policy.etag = new_etag()
        return self.policy.to_json()

    def roles_of(self, member: str) -> list[str]:
        return sorted({b["role"] for b in self.policy.bindings if member in b.get("members", [])})

    # Routing ------------------------------------------------------------------------------------------------
    def routes(self) -> list[BaseRoute]:
        return [
            Route("/v3/projects/{project}", self.get_project, methods=["GET"]),
            Route("/v3/projects/{project}", self.project_method, methods=["POST"]),
        ]

    def admin_routes(self) -> list[BaseRoute]:
        return [
            Route("/caller-roles", self.admin_caller_roles, methods=["POST"]),
            Route("/policy", self.admin_policy, methods=["GET"]),
        ]

    async def shutdown(self) -> None:
        pass

    def _check_project(self, project: str, permission: str) -> None:
        if project not in (self.config.project, self.number):
            # What Resource Manager answers for a project that does not exist or is not visible to the caller.
            raise GoogleApiError(
                403,
                f"Permission '{permission}' denied on resource '//cloudresourcemanager.googleapis.com/projects/"
                f"{project}' (or it may not exist).",
            )

    def project_json(self) -> dict:
        return {
            "name": f"projects/{self.number}",
            "projectId": self.config.project,
            "state": "ACTIVE",
            "displayName": self.config.project,
            "createTime": CREATE_TIME,
            "updateTime": CREATE_TIME,
            "etag": f'W/"{self.number}"',
        }

    # Handlers -----------------------------------------------------------------------------------------------
    async def get_project(self, request: Request) -> JSONResponse:
        project = request.path_params["project"]
        if ":" in project:
            raise not_found(f"Method '{project.partition(':')[2]}' not found (use POST).")
        self._check_project(project, "resourcemanager.projects.get")
        return JSONResponse(self.project_json())

    async def project_method(self, request: Request) -> JSONResponse:
        project, _, verb = request.path_params["project"].partition(":")
        body = json_object(await request.body())
        if verb == "getIamPolicy":
            self._check_project(project, "resourcemanager.projects.getIamPolicy")
            return JSONResponse(self.policy.to_json())
        if verb == "setIamPolicy":
            self._check_project(project, "resourcemanager.projects.setIamPolicy")
            iam = self.ctx.module("iam")
            check = iam.require_service_account if iam is not None else None
            return JSONResponse(self.policy.set_from_request(body, check))
        if verb == "testIamPermissions":
            self._check_project(project, "resourcemanager.projects.get")
            asked = body.get("permissions") or []
            if not isinstance(asked, list) or len(asked) > MAX_TEST_PERMISSIONS:
                raise invalid_argument(f"permissions: at most {MAX_TEST_PERMISSIONS} permissions may be tested.")
            held = authz.held_permissions(self.ctx, authz.caller(self.ctx, request.scope), [str(p) for p in asked],
                                          f"projects/{self.config.project}")  # fmt: skip
            return JSONResponse({"permissions": held} if held else {})
        raise not_found(f"Method '{verb or 'POST'}' not found.")

    # Admin --------------------------------------------------------------------------------------------------
    async def admin_caller_roles(self, request: Request) -> JSONResponse:
        body = json_object(await request.body())
        roles = body.get("roles")
        if not isinstance(roles, list) or not all(isinstance(r, str) and r.startswith("roles/") for r in roles):
            return JSONResponse({"error": "roles: a list of predefined role names (roles/...)"}, status_code=400)
        member = str(body.get("member") or self.config.caller)
        policy = self.set_roles(member, roles)
        return JSONResponse({"member": member, "roles": self.roles_of(member), "policy": policy})

    async def admin_policy(self, _: Request) -> JSONResponse:
        return JSONResponse({"caller": self.config.caller, "policy": self.policy.to_json()})
