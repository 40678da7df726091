"""Org Policy API v2 ``projects.policies.getEffectivePolicy``: ``GET /v2/projects/{p}/policies/{c}:getEffectivePolicy``.

The effective policy is the merge of the hierarchy's policies; the sandbox has no hierarchy, so it answers the
spec configured in ``SandboxConfig.org_policies`` for the constraint. The response carries no ``etag`` and no
conditions ("The returned policy will not have an etag or condition set because it is an evaluated policy across
multiple resources", orgpolicy.v2 discovery document, getEffectivePolicy). A constraint no policy sets answers its
default: for the list constraints below that is "allow all" (``rules: [{allowAll: true}]``; the shape of an unset
list constraint's effective policy is what gcloud org-policies describe --effective prints, unconfirmed by a public
page). The name carries the project number, as the real API's answers do.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Route

from sandbox.control import ControlContext
from sandbox.control.errors import GoogleApiError, invalid_argument

# The list constraints the sandbox knows (Org Policy "constraints" reference:
# https://cloud.google.com/resource-manager/docs/organization-policy/org-policy-constraints).
LIST_CONSTRAINTS = frozenset(
    {
        "gcp.resourceLocations",
        "run.allowedIngress",
        "run.allowedVPCEgress",
        "run.allowedBinaryAuthorizationPolicies",
        "iam.allowedPolicyMemberDomains",
        "gcp.restrictServiceUsage",
        "compute.vmExternalIpAccess",
    }
)
BOOLEAN_CONSTRAINTS = frozenset(
    {
        "iam.disableServiceAccountKeyCreation",
        "storage.uniformBucketLevelAccess",
        "storage.publicAccessPrevention",
        "compute.requireOsLogin",
        "iam.automaticIamGrantsForDefaultServiceAccounts",
    }
)


class OrgPolicy:
    name = "orgpolicy"

    def __init__(self, ctx: ControlContext) -> None:
        self.config = ctx.config

    def routes(self) -> list[BaseRoute]:
        return [
            Route("/v2/projects/{project}/policies/{constraint}:getEffectivePolicy", self.effective, methods=["GET"])
        ]

    def admin_routes(self) -> list[BaseRoute]:
        return []

    async def shutdown(self) -> None:
        pass

    async def effective(self, request: Request) -> JSONResponse:
        project, constraint = request.path_params["project"], request.path_params["constraint"]
        if project not in (self.config.project, self.config.project_number):
            raise GoogleApiError(403, "Permission 'orgpolicy.policy.get' denied on resource (or it may not exist).")
        constraint = constraint.removeprefix("constraints/")
        configured = self.config.org_policies.get(constraint)
        if configured is None and constraint not in LIST_CONSTRAINTS | BOOLEAN_CONSTRAINTS:
            raise invalid_argument(f"Constraint 'constraints/{constraint}' does not exist.")
        if configured is not None:
            spec = configured
        elif constraint in LIST_CONSTRAINTS:
            spec = {"rules": [{"allowAll": True}]}
        else:
            spec = {"rules": [{"enforce": False}]}
        return JSONResponse({"name": f"projects/{self.config.project_number}/policies/{constraint}", "spec": spec})
