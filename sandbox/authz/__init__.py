"""Who may do what in the sandbox project: principals, predefined roles, IAM policies, permission checks.

Interface shared by the control plane (owned by the authz work; other modules only call these):

- ``has_permission(ctx, principal, permission, resource) -> bool``: whether ``principal``
  ("user:a@b.com", "serviceAccount:x@p.iam.gserviceaccount.com") holds ``permission``
  ("storage.objects.get") on ``resource``, a relative resource name ("projects/p",
  "projects/_/buckets/b", "projects/p/locations/l/repositories/r", "projects/p/secrets/s",
  "projects/p/serviceAccounts/email", "projects/p/locations/l/services/s"). The effective policy is the
  project's policy plus the resource's own policy, as in Google's resource hierarchy
  (https://cloud.google.com/iam/docs/resource-hierarchy-access-control: "the effective policy for a resource is
  the union of the policy set on that resource and the policy inherited from its ancestors").
- ``held_permissions(ctx, principal, permissions, resource)``: the subset held, for ``testIamPermissions``.
- ``caller(ctx, scope)``: the principal a request acts as: the account its bearer token was issued to (a key's
  token, a Cloud Run job's metadata server), else the configured caller (``SandboxConfig.caller``).

The project policy lives in the Resource Manager stand-in (``sandbox/control/resourcemanager``); resource
policies stay where each API keeps them (Cloud Run services, secrets, repositories, service accounts, buckets in
the GCS front). A conditional binding counts only when its condition is Cloud Storage's object-name prefix and the
checked resource is an object under it (``sandbox.authz.conditions``); any other condition grants nothing here (the
sandbox evaluates no other CEL).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sandbox.authz.conditions import condition_holds
from sandbox.authz.propagation import GrantLedger, grant_role, policy_key
from sandbox.authz.roles import grants

if TYPE_CHECKING:
    from sandbox.control import ControlContext

PUBLIC = {"allUsers", "allAuthenticatedUsers"}
# Convenience members of bucket policies: whoever holds the basic role on the project.
CONVENIENCE = {"projectOwner": "roles/owner", "projectEditor": "roles/editor", "projectViewer": "roles/viewer"}


def caller(ctx: ControlContext, scope: dict | None = None) -> str:
    """The principal the request in ``scope`` is made as: its bearer token's account when the sandbox issued that
    token for one (sandbox.identity.AccessTokens), else the configured caller."""
    tokens = getattr(ctx.identity, "access_tokens", None)
    if scope is not None and tokens is not None:
        for key, value in scope.get("headers", []):
            if key.lower() == b"authorization":
                kind, _, token = value.decode("latin-1").partition(" ")
                if kind.lower() == "bearer":
                    principal = tokens.principal(token.strip()) or _self_signed(ctx, token.strip())
                    if principal:
                        return principal
    return ctx.config.caller


def unknown_token(ctx: ControlContext, scope: dict) -> bool:
    """Whether the request in ``scope`` carries a bearer token the sandbox never issued (nor a self-signed JWT of a
    key it made): Google answers those 401 UNAUTHENTICATED, whoever the token claims to be. No token at all is the
    sandbox's anonymous target, acting as the configured caller."""
    tokens = getattr(ctx.identity, "access_tokens", None)
    if tokens is None:
        return False
    for key, value in scope.get("headers", []):
        if key.lower() == b"authorization":
            kind, _, token = value.decode("latin-1").partition(" ")
            token = token.strip()
            if kind.lower() == "bearer":
                return not (tokens.issued(token) or _self_signed(ctx, token))
    return False


def _self_signed(ctx: ControlContext, token: str) -> str | None:
    """The account of a self-signed JWT bearer token (google-auth's service-account credentials send one instead of
    calling the token endpoint when a client asks for JWT access, as the google-cloud-* GAPIC clients do)."""
    keys = getattr(ctx.identity, "service_account_keys", None)
    if keys is None or token.count(".") != 2:
        return None
    try:
        return f"serviceAccount:{keys.verify_assertion(token)}"
    except ValueError:
        return None


def is_own_project(ctx: ControlContext, project: str) -> bool:
    return project in (ctx.config.project, str(ctx.config.project_number), "_", "-")


def project_policy(ctx: ControlContext) -> dict:
    """The project's IAM policy JSON (the caller is owner when no Resource Manager stand-in keeps one)."""
    manager = ctx.module("resourcemanager")
    if manager is not None:
        return manager.policy.to_json()
    return {"bindings": [{"role": "roles/owner", "members": [caller(ctx)]}]}


def resource_policy(ctx: ControlContext, resource: str) -> dict | None:
    """The IAM policy set on ``resource`` itself, or None when it has none (or does not exist)."""
    parts = resource.split("/")
    if len(parts) < 4 or parts[0] != "projects":
        return None
    if parts[2] == "buckets":
        front = getattr(ctx, "gcs_front", None)
        return front.bucket_policy(parts[3]) if front is not None else None
    if parts[2] == "secrets":
        manager = ctx.module("secretmanager")
        return manager.policy("/".join(parts[:4])) if manager is not None else None
    if parts[2] == "serviceAccounts":
        iam = ctx.module("iam")
        account = iam.accounts.get(parts[3]) if iam is not None else None
        return account.policy.to_json() if account is not None else None
    if len(parts) >= 6 and parts[2] == "locations" and parts[4] == "services":
        run = ctx.module("run")
        name = f"projects/{ctx.config.project}/locations/{parts[3]}/services/{parts[5]}"
        record = run.services.get(name) if run is not None else None
        return record.policy if record is not None else None
    if len(parts) >= 6 and parts[2] == "locations" and parts[4] == "jobs":  # a job and its executions and tasks
        run = ctx.module("run")
        name = f"projects/{ctx.config.project}/locations/{parts[3]}/jobs/{parts[5].split(':')[0]}"
        job = run.jobs.jobs.get(name) if run is not None else None
        return job.policy if job is not None else None
    if len(parts) >= 6 and parts[2] == "locations" and parts[4] == "repositories":
        registry = ctx.module("artifactregistry")
        if registry is None:
            return None
        name = f"projects/{ctx.config.project}/locations/{parts[3]}/repositories/{parts[5]}"
        record = registry.repositories.get(name)
        return record.policy if record is not None else None
    return None


def _bindings(policy: dict | None, resource: str) -> list[dict[str, Any]]:
    """The policy's bindings that apply to a check on ``resource``: unconditional ones, and conditional ones whose
    condition holds for it (sandbox.authz.conditions)."""
    if not policy:
        return []
    return [
        b
        for b in policy.get("bindings", []) or []
        if not b.get("condition") or condition_holds(b["condition"], resource)
    ]


def _member_matches(ctx: ControlContext, member: str, principal: str, project_bindings: list[dict]) -> bool:
    if member == principal or member in PUBLIC:
        return True
    kind, _, value = member.partition(":")
    if kind == "domain":
        return principal.rsplit("@", 1)[-1] == value
    if kind in CONVENIENCE and is_own_project(ctx, value):
        role = CONVENIENCE[kind]
        return any(b.get("role") == role and principal in b.get("members", []) for b in project_bindings)
    return False


def _roles_of(ctx: ControlContext, principal: str, resource: str) -> set[str]:
    """The roles ``principal`` holds on ``resource``, counting only grants that have taken effect
    (sandbox.authz.propagation)."""
    window = ctx.config.grant_propagation_seconds * ctx.config.time_scale
    ledger: GrantLedger | None = getattr(ctx, "grants", None)

    def effective(key: str, role: str, member: str) -> bool:
        return ledger is None or not ledger.pending(key, role, member, window)

    project = _bindings(project_policy(ctx), resource)
    roles = {
        b["role"]
        for b in project
        for m in b.get("members", [])
        if (m == principal or m in PUBLIC) and effective("project", grant_role(b), m)
    }
    key = policy_key(resource)
    for binding in _bindings(resource_policy(ctx, resource), resource):
        if any(
            _member_matches(ctx, m, principal, project) and effective(key, grant_role(binding), m)
            for m in binding.get("members", [])
        ):
            roles.add(binding["role"])
    return roles


def has_permission(ctx: ControlContext, principal: str, permission: str, resource: str) -> bool:
    """Whether ``principal`` holds ``permission`` on ``resource`` through the project's or the resource's policy."""
    return any(grants(role, permission) for role in _roles_of(ctx, principal, resource))


def held_permissions(ctx: ControlContext, principal: str, permissions: list[str], resource: str) -> list[str]:
    """The subset of ``permissions`` that ``principal`` holds on ``resource``, in the order asked."""
    roles = _roles_of(ctx, principal, resource)
    return [p for p in permissions if any(grants(role, p) for role in roles)]
