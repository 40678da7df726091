"""doctor: read-only checks of a real project before anything is spent, each with the command that fixes it.

Every call here is a read method: Service Usage ``services.batchGet`` and ``consumerQuotaMetrics.get``, Resource
Manager and IAM ``testIamPermissions``, Org Policy ``getEffectivePolicy``, Cloud Storage ``buckets.get``. A check
that cannot read what it needs (an API that is itself disabled, a permission doctor lacks) reports that as its
result instead of raising, so one run shows everything that stands in the way.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Literal

from google.api_core import exceptions as gexc
from google.cloud import service_usage_v1
from pydantic import BaseModel, Field

from blocks.hardware import GPUS
from blocks.profile import ServingProfile
from blocks.target import GcpTarget
from tasks.checks import quotas
from tasks.common import clients
from tasks.common.permissions import (
    ACT_AS,
    DEPLOYER_ROLES,
    DOCTOR_ROLES,
    METRIC_WRITER_ROLE,
    PROJECT_ROLES,
    denied_permission,
    doctor_permissions,
    grant_command,
    required_permissions,
    role_for,
)
from tasks.infra.build_identity import BUILD_BUCKET_ROLE, REPOSITORY_ROLE
from tasks.infra.ensure import repository_path

Status = Literal["ok", "warn", "fail"]
ME = 'user:"$(gcloud config get-value account)"'  # the member a fix command grants to: whoever runs it
PROJECT_GET = "resourcemanager.projects.get"
BUCKET_GET = "storage.buckets.get"
BROWSER = "roles/browser"
ACT_AS_ROLE = "roles/iam.serviceAccountUser"
PROJECT_IAM_ADMIN = "roles/resourcemanager.projectIamAdmin"


class Check(BaseModel):
    """One doctor finding: what was checked, how it stands, and the command that fixes it."""

    name: str
    status: Status
    detail: str
    fix: str = Field("", description="The exact command (or setting) that fixes it; empty when nothing to fix.")
    roles: list[str] = Field(
        default_factory=list,
        description="Predefined roles the caller lacks on the project for this row: doctor prints one grant command "
        "per role, for all rows at once, instead of the row's own fix.",
    )
    summary: str = Field("", description="The row's one terminal line when the detail is too long for one.")

    @property
    def line(self) -> str:
        """What the terminal shows for the row (the artifact and DoctorFailed keep the whole detail)."""
        return self.summary or self.detail


# The order grants are printed in: seeing the project first (every other call is refused without it), then what
# doctor reads with (its next run then sees more), then the deployer's roles in the README table's order.
_GRANT_ORDER = [need.role for need in (*PROJECT_ROLES, *DOCTOR_ROLES, *DEPLOYER_ROLES)]


def roles_to_grant(checks: list[Check]) -> list[str]:
    """The roles the failed rows ask for, each once, in ``_GRANT_ORDER`` (roles it does not know last, by name)."""
    wanted = {role for c in checks if c.status == "fail" for role in c.roles}
    return sorted(wanted, key=lambda r: (_GRANT_ORDER.index(r) if r in _GRANT_ORDER else len(_GRANT_ORDER), r))


def other_fixes(checks: list[Check]) -> list[str]:
    """The fixes of failed and warned rows that are not project grants, each once, in row order."""
    return list(dict.fromkeys(c.fix for c in checks if c.status != "ok" and c.fix and not c.roles))


def grant_block(project: str, roles: list[str], member: str | None = None) -> list[str]:
    """Copyable shell lines that grant ``roles`` on the project: the member set once (the caller's principal when
    the credentials name it, else the gcloud account), then one ``add-iam-policy-binding`` per role."""
    head = f"MEMBER={member}" if member else f"MEMBER={ME}  # or serviceAccount:EMAIL, the account the flows run as"
    return [head, *(grant_command(project, role, '"$MEMBER"') for role in roles)]


class DoctorFailed(RuntimeError):
    """The project is not ready: the message lists each failed check, then the fixes (grants last)."""

    def __init__(self, checks: list[Check], fixes: list[str] | None = None) -> None:
        self.checks = [c for c in checks if c.status == "fail"]
        self.fixes = list(dict.fromkeys(fixes if fixes is not None else [c.fix for c in self.checks if c.fix]))
        # The first line is what a promotion report shows as its reason; the fixes follow, one a line.
        summary = "doctor: project not ready: " + " | ".join(f"{c.name}: {c.detail}" for c in self.checks)
        super().__init__("\n".join([summary, *self.fixes]))

    def __reduce__(self) -> tuple[type[DoctorFailed], tuple[list[Check], list[str]]]:
        # A Prefect result store pickles it with the run's Failed state: rebuilt from its rows, not its message.
        return (type(self), (self.checks, self.fixes))


# APIs by what uses them. serviceusage and cloudresourcemanager are what doctor itself reads through.
ALWAYS_APIS = (
    "run.googleapis.com",
    "compute.googleapis.com",
    "iam.googleapis.com",
    "storage.googleapis.com",
    "logging.googleapis.com",
    "monitoring.googleapis.com",
    "serviceusage.googleapis.com",
    "cloudresourcemanager.googleapis.com",
)
BUILD_APIS = ("cloudbuild.googleapis.com", "artifactregistry.googleapis.com")
SECRET_APIS = ("secretmanager.googleapis.com",)
TEST_PERMISSIONS_BATCH = 100  # testIamPermissions takes at most 100 permissions per call

# What the rendered service uses (tasks/deploy/render.py): ingress "all" (private through IAM) and all-traffic egress.
SET_PROJECT_POLICY = "resourcemanager.projects.setIamPolicy"
INGRESS = "all"
VPC_EGRESS = "all-traffic"


def required_apis(profile: ServingProfile) -> list[str]:
    """The services the pipeline calls for this profile: build APIs only when it builds its image, Secret Manager
    when the Hub token is stored there."""
    apis = list(ALWAYS_APIS)
    if profile.build is not None:
        apis += BUILD_APIS
    if profile.build is not None or profile.hf_token_at_runtime:
        apis += SECRET_APIS
    return sorted(apis)


def enable_command(services: list[str], project: str) -> str:
    return f"gcloud services enable {' '.join(services)} --project {project}"


def _disabled_service(exc: Exception) -> str | None:
    """The service a 403 SERVICE_DISABLED names (ErrorInfo metadata), else None."""
    if isinstance(exc, gexc.GoogleAPICallError) and exc.reason == "SERVICE_DISABLED":
        return (exc.metadata or {}).get("service")
    return None


def _json_error(response) -> tuple[str, str | None]:
    """(message, disabled service) of an error answered to an AuthorizedSession call."""
    try:
        error = response.json().get("error", {})
    except ValueError:
        return response.text[:300], None
    for detail in error.get("details", []):
        if detail.get("reason") == "SERVICE_DISABLED":
            return error.get("message", ""), detail.get("metadata", {}).get("service")
    return error.get("message", response.text[:300]), None


# The REST transport prefixes Google's message with the request ("GET https://...?names=projects%2F...: "), and
# Storage and Service Usage add a second sentence that repeats the first: neither helps the reader.
_REQUEST_LINE = re.compile(r"^(?:\d{3} )?(?:GET|POST|PUT|PATCH|DELETE) \S+: ")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s")
MAX_GOOGLE_TEXT = 160


def google_text(error: Exception | str) -> str:
    """Google's error message as a reader needs it: without the request line, its first sentence, at most
    ``MAX_GOOGLE_TEXT`` characters."""
    text = error.message if isinstance(error, gexc.GoogleAPICallError) else str(error)
    text = _REQUEST_LINE.sub("", " ".join(str(text).split()))
    first = _SENTENCE_END.split(text, maxsplit=1)[0]
    return first if len(first) <= MAX_GOOGLE_TEXT else first[: MAX_GOOGLE_TEXT - 1] + "…"


def _unreadable(name: str, target: GcpTarget, exc: Exception, role: str) -> Check:
    """A check whose read failed: a disabled API names the enable command, a 403 the role that allows the read."""
    service = _disabled_service(exc)
    if service:
        return Check(name=name, status="fail", detail=f"{service} is not enabled, so this could not be checked.",
                     fix=enable_command([service], target.project))  # fmt: skip
    if isinstance(exc, gexc.Forbidden | gexc.PermissionDenied):
        return _read_denied(name, target, exc.message, role)
    return Check(name=name, status="warn", detail=f"could not be checked: {google_text(exc)}")


def _read_denied(name: str, target: GcpTarget, message: str, role: str) -> Check:
    """A read doctor was refused (403): the permission Google's message names and the role that holds it; Google's
    own words only when they name no permission."""
    permission = denied_permission(message)
    said = f"missing permission {permission}" if permission else f"Google: {google_text(message)}"
    detail = f"cannot read: {said}; grant {role}"
    return Check(name=name, status="fail", detail=detail, fix=grant_command(target.project, role, ME), roles=[role])


# Checks ---------------------------------------------------------------------------------------------------------
def check_project_access(target: GcpTarget) -> Check:
    """The project exists and the caller may see it (``resourcemanager.projects.get``, asked with
    ``projects.testIamPermissions``, which itself needs no permission: Resource Manager REST reference,
    https://cloud.google.com/resource-manager/reference/rest/v1/projects/testIamPermissions). Every deployer role
    holds projects.get; an identity that holds none of them (a bare project) needs roles/browser to see the project
    at all ("Read access to browse the hierarchy for a project, including the folder, organization, and allow
    policy", https://cloud.google.com/iam/docs/roles-permissions/browser), so it is the first grant doctor prints."""
    name = "project access"
    fix = grant_command(target.project, BROWSER, ME)
    try:
        held = PROJECT_GET in _granted(target, [PROJECT_GET])
    except gexc.GoogleAPICallError as exc:
        if _disabled_service(exc):
            return _unreadable(name, target, exc, BROWSER)
        # Resource Manager answers 403 for a project that does not exist as for one the caller may not see.
        return Check(name=name, status="fail", roles=[BROWSER], fix=fix,
                     detail=f"{target.project} does not exist or you may not see it ({google_text(exc)}): check "
                     f"the project id, or grant {BROWSER}")  # fmt: skip
    if held:
        return Check(name=name, status="ok", detail=f"you may see {target.project}.")
    detail = f"you may not see {target.project}: missing permission {PROJECT_GET}; grant {BROWSER}"
    return Check(name=name, status="fail", detail=detail, fix=fix, roles=[BROWSER])


def check_apis(target: GcpTarget, profile: ServingProfile) -> Check:
    """The APIs the pipeline calls are enabled (Service Usage ``services.batchGet``)."""
    name = "APIs enabled"
    wanted = required_apis(profile)
    parent = f"projects/{target.project}"
    try:
        found = clients.service_usage(target).batch_get_services(
            request={"parent": parent, "names": [f"{parent}/services/{s}" for s in wanted]}
        )
    except gexc.GoogleAPICallError as exc:
        if _disabled_service(exc) == "serviceusage.googleapis.com":
            return Check(
                name=name, status="fail",
                detail="serviceusage.googleapis.com is not enabled, so the other APIs could not be read.",
                fix=enable_command(wanted, target.project),
            )  # fmt: skip
        return _unreadable(name, target, exc, "roles/serviceusage.serviceUsageViewer")
    enabled = service_usage_v1.State.ENABLED
    off = sorted(s.name.rsplit("/", 1)[-1] for s in found.services if s.state != enabled)
    if off:
        return Check(name=name, status="fail", detail=f"not enabled: {', '.join(off)}.",
                     fix=enable_command(off, target.project))  # fmt: skip
    return Check(name=name, status="ok", detail=f"all {len(wanted)} APIs the pipeline calls are enabled.")


def _granted(target: GcpTarget, permissions: list[str]) -> set[str]:
    projects = clients.projects(target)
    granted: set[str] = set()
    for start in range(0, len(permissions), TEST_PERMISSIONS_BATCH):
        batch = permissions[start : start + TEST_PERMISSIONS_BATCH]
        answer = projects.test_iam_permissions(request={"resource": f"projects/{target.project}", "permissions": batch})
        granted |= set(answer.permissions)
    return granted


def check_permissions(target: GcpTarget, profile: ServingProfile) -> Check:
    """The caller holds every permission of the deployer role table (``projects.testIamPermissions``)."""
    wanted = required_permissions(
        building=profile.build is not None,
        hub_token=profile.hf_token_at_runtime,
        metrics=False,  # the metrics role has its own row (check_metric_writer): an admin may grant metricWriter once
    )
    return _held("deployer permissions", "the deployer roles", target, wanted)


def check_doctor_permissions(target: GcpTarget) -> Check:
    """The caller holds what doctor's own read-only checks call (the README's "doctor (read-only checks)" rows):
    without them those checks cannot read, and this row names the roles to grant once for all of them."""
    return _held("doctor permissions", "the doctor roles", target, doctor_permissions())


def _held(name: str, what: str, target: GcpTarget, wanted: list[str]) -> Check:
    try:
        missing = sorted(set(wanted) - _granted(target, wanted))
    except gexc.GoogleAPICallError as exc:
        return _unreadable(name, target, exc, BROWSER)  # the project itself is out of sight
    if not missing:
        return Check(name=name, status="ok", detail=f"all {len(wanted)} permissions of {what} held.")
    roles: dict[str, list[str]] = {}
    for permission in missing:
        roles.setdefault(role_for(permission), []).append(permission)
    detail = "; ".join(f"{role} for {', '.join(perms)}" for role, perms in roles.items())
    fix = " && ".join(grant_command(target.project, role, ME) for role in roles)
    # The detail names every permission (the artifact, DoctorFailed); the terminal line only counts them.
    lacked = f"{len(roles)} roles" if len(roles) > 1 else next(iter(roles))
    summary = f"missing {len(missing)} permission{'s' if len(missing) > 1 else ''} of {lacked}"
    return Check(name=name, status="fail", detail=f"missing permissions: {detail}.", fix=fix, roles=list(roles),
                 summary=summary)  # fmt: skip


def _holds(target: GcpTarget, permission: str) -> bool:
    """Whether the caller holds ``permission`` on the project; False when even that cannot be asked."""
    try:
        return permission in _granted(target, [permission])
    except gexc.GoogleAPICallError:
        return False


def check_act_as(target: GcpTarget) -> Check:
    """The caller may act as the runtime service account (``serviceAccounts.testIamPermissions``); before the account
    exists, the project-level grant that will cover it."""
    return _act_as("actAs on the runtime service account", target, target.service_account_email)


def _act_as(name: str, target: GcpTarget, email: str) -> Check:
    iam = clients.iam(target)
    response = iam.session.post(
        iam.url(f"projects/{target.project}/serviceAccounts/{email}:testIamPermissions"), json={"permissions": [ACT_AS]}
    )
    account_fix = (
        f"gcloud iam service-accounts add-iam-policy-binding {email} --project {target.project} "
        f"--member={ME} --role=roles/iam.serviceAccountUser"
    )
    if response.status_code == 200:
        if ACT_AS in response.json().get("permissions", []):
            return Check(name=name, status="ok", detail=f"may act as {email}.")
        return Check(name=name, status="fail", detail=f"may not act as {email}: a deploy or build that runs as it "
                     "fails with 403 iam.serviceaccounts.actAs.", fix=account_fix)  # fmt: skip
    message, disabled = _json_error(response)
    if disabled:
        return Check(name=name, status="fail", detail=f"{disabled} is not enabled, so this could not be checked.",
                     fix=enable_command([disabled], target.project))  # fmt: skip
    if response.status_code not in (403, 404):
        return Check(name=name, status="warn",
                     detail=f"could not be checked: {response.status_code} {google_text(message)}")  # fmt: skip
    # 404 (or 403 "or it may not exist"): no account yet. promote creates it; the project-level grant covers it then.
    row = _by_caller_permission(
        name, target, ACT_AS,
        ok=f"{email} will be created by promote; project-level {ACT_AS} covers it.",
        fail=f"{email} does not exist yet and you lack {ACT_AS} on the project: the first deploy would be refused.",
        fix=grant_command(target.project, ACT_AS_ROLE, ME), roles=[ACT_AS_ROLE],
    )  # fmt: skip
    if row.roles == [ACT_AS_ROLE]:  # the row's name says which account: its line need not repeat the address
        row.summary = f"not created yet, and you lack {ACT_AS} on the project: the first deploy would be refused."
    return row


def _by_caller_permission(
    name: str, target: GcpTarget, permission: str, ok: str, fail: str, fix: str, roles: list[str] | None = None
) -> Check:
    """The row that depends on whether the caller holds ``permission`` on the project (or says it could not be
    read). ``roles``: what the failed row asks the caller to be granted (none when the fix grants someone else)."""
    try:
        held = permission in _granted(target, [permission])
    except gexc.GoogleAPICallError as exc:
        return _unreadable(name, target, exc, BROWSER)  # the project itself is out of sight
    if held:
        return Check(name=name, status="ok", detail=ok)
    return Check(name=name, status="fail", detail=fail, fix=fix, roles=roles or [])


WRITER_ROLES = {METRIC_WRITER_ROLE, "roles/monitoring.editor", "roles/monitoring.admin", "roles/editor", "roles/owner"}


def check_metric_writer(target: GcpTarget, profile: ServingProfile) -> Check:
    """With metrics: vllm, the serving account may write vLLM's metrics (the sidecar writes as it), or promote can
    grant it (the caller may set the project's IAM policy)."""
    name = "serving account writes metrics"
    if profile.metrics != "vllm":
        return Check(name=name, status="ok", detail="no metrics sidecar (metrics: none): nothing to write.")
    member = f"serviceAccount:{target.service_account_email}"
    try:
        policy = clients.projects(target).get_iam_policy(request={"resource": f"projects/{target.project}"})
    except gexc.GoogleAPICallError as exc:
        # The role promote's grant needs (README table, metrics: vllm) also reads the policy: one role, not two.
        return _unreadable(name, target, exc, PROJECT_IAM_ADMIN)
    if any(b.role in WRITER_ROLES and member in b.members for b in policy.bindings):
        return Check(name=name, status="ok", detail=f"{target.service_account_email} may write metrics.")
    return _by_caller_permission(
        name, target, SET_PROJECT_POLICY,
        ok=f"promote grants {target.service_account_email} {METRIC_WRITER_ROLE} (you may set the project's IAM "
        "policy).",
        fail=f"{target.service_account_email} lacks {METRIC_WRITER_ROLE} and you may not grant it: the sidecar's "
        "writes would be refused and the watch could not judge vLLM's metrics.",
        fix=grant_command(target.project, METRIC_WRITER_ROLE, member),
    )  # fmt: skip


def check_gpu_region(target: GcpTarget, profile: ServingProfile) -> Check:
    """The region offers the profile's GPU on Cloud Run (the catalogue in blocks/hardware.py)."""
    name = "GPU offered in region"
    if profile.gpu_type is None:
        return Check(name=name, status="ok", detail="CPU-only profile: no GPU needed.")
    regions = sorted(GPUS[profile.gpu_type].regions)
    if target.region in regions:
        return Check(name=name, status="ok", detail=f"{profile.gpu_type} is offered in {target.region}.")
    return Check(name=name, status="fail", detail=f"Cloud Run offers {profile.gpu_type} only in {', '.join(regions)}.",
                 fix=f"set the target's region to one of {', '.join(regions)} (or pick a profile whose GPU "
                 f"{target.region} offers)")  # fmt: skip


def check_subnet(target: GcpTarget) -> Check:
    """The subnet's Private Google Access: with the all-traffic egress promote-model renders, Cloud Storage (the
    weights volume) is reached through the VPC and needs it (Cloud Run's networking best practices)."""
    name = "subnet"
    try:
        subnet = clients.compute_subnetworks(target).get(
            project=target.project, region=target.region, subnetwork=target.subnet
        )
    except gexc.NotFound:
        return Check(name=name, status="ok", detail=f"{target.subnet} does not exist yet: promote-model creates it "
                     "with Private Google Access on.")  # fmt: skip
    except gexc.GoogleAPICallError as exc:
        return _unreadable(name, target, exc, "roles/compute.networkAdmin")
    if subnet.private_ip_google_access:
        return Check(name=name, status="ok", detail=f"{target.subnet} has Private Google Access on.")
    return Check(
        name=name, status="warn",
        detail=f"Private Google Access is off on {target.subnet}: a revision with all-traffic egress cannot reach "
        "Cloud Storage, so its weights volume never loads; promote-model turns it on (ensure infrastructure)",
        fix=f"gcloud compute networks subnets update {target.subnet} --region {target.region} "
        f"--project {target.project} --enable-private-ip-google-access",
    )  # fmt: skip


def _check_quota(target: GcpTarget, name: str, quota: quotas.Quota, per_instance: float, instances: int) -> Check:
    """One regional quota against ``instances`` instances of ``per_instance`` each (Service Usage v1beta1)."""
    response = quotas.read_metric(target, quota.metric)
    if response.status_code != 200:
        message, disabled = _json_error(response)
        if disabled:
            return Check(name=name, status="fail", detail=f"{disabled} is not enabled, so this could not be checked.",
                         fix=enable_command([disabled], target.project))  # fmt: skip
        if response.status_code == 403:
            return _read_denied(name, target, message, "roles/serviceusage.serviceUsageViewer")
        detail = f"could not read {quota.metric}: {response.status_code} {google_text(message)}"
        return Check(name=name, status="warn", detail=detail)
    limit = quotas.in_units(quotas.effective_limit(response.json(), target.region), quota)
    need = quotas.Need(quota, per_instance, instances, limit)
    if limit is None:
        return Check(name=name, status="warn", detail=f"{quota.metric} has no limit for {target.region}.",
                     fix=quota.console(target.project))  # fmt: skip
    if need.fits:
        return Check(name=name, status="ok", detail=f"{need.describe(target.region)}.")
    fits = need.instances_allowed
    setting = f"set the profile's max_instances to {fits}" if fits >= 1 else "pick a profile with a smaller instance"
    return Check(
        name=name, status="fail",
        detail=f"{need.describe(target.region)}: the deploy would fail with \"Max instances must be set to {fits} or "
        f"fewer\" ({quota.quota_id})",
        fix=f"request {quota.quota_id} of {quotas.raw(need.requested, quota)} ('{quota.title}') at "
        f"{quota.console(target.project)} (region {target.region}; a trial project cannot raise it), or {setting}",
    )  # fmt: skip


def check_quotas(target: GcpTarget, profile: ServingProfile) -> list[Check]:
    """Cloud Run's regional quotas (vCPU, memory and, on a GPU profile, the GPU type's) cover ``max_instances``
    instances of the profile: what Cloud Run checks at deploy (tasks/checks/quotas.py)."""
    rows = []
    for quota, per_instance in quotas.quotas_for(profile):
        name = {"vCPU": "CPU quota", "GiB": "Memory quota"}.get(quota.unit, "GPU quota")
        rows.append(_check_quota(target, name, quota, per_instance, profile.max_instances))
    return rows


def check_gpu_quota(target: GcpTarget, profile: ServingProfile) -> Check:
    """The Cloud Run GPU quota in the region covers ``max_instances`` (Service Usage v1beta1 consumer quota metric)."""
    if profile.gpu_type is None:
        return Check(name="GPU quota", status="ok", detail="CPU-only profile: no GPU quota needed.")
    quota = quotas.gpu_quota(profile.gpu_type, profile.gpu_zonal_redundancy)
    return _check_quota(target, "GPU quota", quota, 1.0, profile.max_instances)


# Organisation policies -----------------------------------------------------------------------------------------
# Location value groups a region belongs to (Org Policy "Resource locations" docs: in:us-locations,
# in:eu-locations, in:asia-locations, in:REGION-locations ...); approximate for the groups that cross continents.
_GEO_GROUPS = {
    "us": ("us", "northamerica", "americas"),
    "northamerica": ("northamerica", "americas"),
    "southamerica": ("southamerica", "americas"),
    "europe": ("eu", "europe"),
    "asia": ("asia", "asia-pacific"),
    "australia": ("australia", "asia-pacific"),
    "me": ("me",),
    "africa": ("africa",),
}


def location_values(region: str) -> set[str]:
    """The policy values that name ``region``: itself, its value group and its geography's groups."""
    geo = region.split("-", 1)[0]
    values = {region, f"in:{region}-locations", f"{region}-locations"}
    values |= {f"in:{group}-locations" for group in _GEO_GROUPS.get(geo, ())}
    return values


def _normal(value: str) -> str:
    return value.removeprefix("is:").lower()


def list_policy_allows(policy, values: set[str]) -> bool:
    """Whether an effective list policy lets any of ``values`` through: denyAll refuses, denied values win over
    allowed ones, a rule with allowed values admits only those, and no rule at all (unset) admits everything."""
    wanted = {_normal(v) for v in values}
    allowed_lists: list[set[str]] = []
    for rule in policy.spec.rules if policy.spec else []:
        if rule.deny_all:
            return False
        if rule.allow_all:
            return True
        if rule.values:
            if wanted & {_normal(v) for v in rule.values.denied_values}:
                return False
            if rule.values.allowed_values:
                allowed_lists.append({_normal(v) for v in rule.values.allowed_values})
    return not allowed_lists or any(wanted & allowed for allowed in allowed_lists)


def _restricted_values(policy) -> list[str]:
    return [v for rule in (policy.spec.rules if policy.spec else []) if rule.values for v in rule.values.allowed_values]


def _allow_fix(constraint: str, value: str, project: str) -> str:
    # An organisation policy administrator (roles/orgpolicy.policyAdmin) can add the value for this project.
    return f"gcloud resource-manager org-policies allow {constraint} {value} --project {project}"


def check_org_policies(target: GcpTarget) -> list[Check]:
    """Effective organisation policies that would refuse what the pipeline creates (Org Policy v2)."""
    client = clients.org_policy(target)

    def effective(constraint: str):
        return client.get_effective_policy(name=f"projects/{target.project}/policies/{constraint}")

    checks: list[Check] = []
    for constraint, wanted, why in (
        ("gcp.resourceLocations", location_values(target.region), f"bucket, registry and service in {target.region}"),
        ("run.allowedIngress", {INGRESS}, f"ingress '{INGRESS}' (private through IAM)"),
        ("run.allowedVPCEgress", {VPC_EGRESS}, f"Direct VPC egress '{VPC_EGRESS}'"),
    ):  # fmt: skip
        name = f"org policy {constraint}"
        try:
            policy = effective(constraint)
        except gexc.GoogleAPICallError as exc:
            checks.append(_unreadable(name, target, exc, "roles/orgpolicy.policyViewer"))
            continue
        if list_policy_allows(policy, wanted):
            checks.append(Check(name=name, status="ok", detail=f"allows {why}."))
            continue
        value = f"in:{target.region}-locations" if constraint == "gcp.resourceLocations" else next(iter(wanted))
        shown = ", ".join(_restricted_values(policy)) or "nothing"
        checks.append(Check(name=name, status="fail", detail=f"refuses {why}; it allows {shown}.",
                            fix=_allow_fix(constraint, value, target.project)))  # fmt: skip
    checks.append(_check_member_domains(target, effective))
    return checks


def _check_member_domains(target: GcpTarget, effective: Callable) -> Check:
    """Domain-restricted sharing: granting run.invoker to a principal outside the allowed organisations fails."""
    constraint = "iam.allowedPolicyMemberDomains"
    name = f"org policy {constraint}"
    try:
        policy = effective(constraint)
    except gexc.GoogleAPICallError as exc:
        return _unreadable(name, target, exc, "roles/orgpolicy.policyViewer")
    rules = policy.spec.rules if policy.spec else []
    if not rules or any(r.allow_all for r in rules):
        return Check(name=name, status="ok", detail="no domain restriction on IAM members.")
    if not target.invokers:
        return Check(name=name, status="ok", detail="domains are restricted; the target grants no invokers.")
    allowed = ", ".join(_restricted_values(policy)) or "no customer"
    return Check(
        name=name, status="warn",
        detail=f"IAM members are restricted to {allowed}; granting run.invoker to {', '.join(target.invokers)} "
        "fails unless each belongs to one of them (the customer IDs cannot be matched to e-mail domains here).",
        fix=f"gcloud org-policies describe {constraint} --effective --project {target.project}",
    )  # fmt: skip


def check_bucket(target: GcpTarget) -> Check:
    """An existing bucket is in the target's region (lesson 18): a bucket's location cannot change."""
    name = "bucket location"
    bucket_name = target.bucket_name
    try:
        bucket = clients.storage(target).lookup_bucket(bucket_name)
    except gexc.Forbidden as exc:
        service = _disabled_service(exc)
        if service:
            return Check(name=name, status="fail", detail=f"{service} is not enabled, so this could not be checked.",
                         fix=enable_command([service], target.project))  # fmt: skip
        if not _holds(target, BUCKET_GET):  # refused for want of a role in this project, not a foreign bucket
            return _read_denied(name, target, exc.message, "roles/storage.admin")
        return Check(
            name=name, status="fail",
            detail=f"gs://{bucket_name} exists but this identity may not read it (bucket names are global: it may "
            "belong to another project).",
            fix=f"set the target's bucket to a name of your own, e.g. {target.project}-{target.region}-models",
        )  # fmt: skip
    if bucket is None:
        return Check(name=name, status="ok", detail=f"gs://{bucket_name} does not exist yet; promote creates it in "
                     f"{target.region}.")  # fmt: skip
    location = (bucket.location or "").lower()
    if location == target.region and (bucket.location_type or "region") == "region":
        return Check(name=name, status="ok", detail=f"gs://{bucket_name} is in {target.region}.")
    return Check(
        name=name, status="fail",
        detail=f"gs://{bucket_name} is in {bucket.location} ({bucket.location_type}), not {target.region}: weights "
        "would cross regions on every cold start.",
        fix=f"set the target's bucket to a new name (created in {target.region}), e.g. "
        f"{bucket_name[:50]}-{target.region}",
    )  # fmt: skip


def check_build_identity(target: GcpTarget, profile: ServingProfile) -> Check:
    """The dedicated build identity (tasks/infra/build_identity.py) when the profile builds its image: the caller may
    act as it, and it holds Storage Admin on the build bucket, artifactregistry.writer on the repository and nothing on
    the model bucket (promote grants what is missing and removes the rest; this row says what it will change)."""
    name = "build identity"
    if profile.build is None:
        return Check(name=name, status="ok", detail="prebuilt image: no Cloud Build.")
    email = target.build_service_account_email
    acting = _act_as(name, target, email)
    if acting.status != "ok" or "will be created" in acting.detail:
        return acting
    member = f"serviceAccount:{email}"
    missing: list[tuple[str, str]] = []  # (resource, role)
    extra: list[tuple[str, str]] = []  # (resource, role): roles on the model bucket, which builds never touch
    try:
        for bucket, wanted in ((target.build_bucket_name, BUILD_BUCKET_ROLE), (target.bucket_name, None)):
            try:
                policy = clients.storage(target).bucket(bucket).get_iam_policy(requested_policy_version=3)
            except gexc.NotFound:
                continue  # no bucket yet: promote creates it (and grants on the build bucket)
            held = {b["role"] for b in policy.bindings if member in b.get("members", ())}
            if wanted is not None and wanted not in held:
                missing.append((f"gs://{bucket}", wanted))
            if wanted is None:
                extra += [(f"gs://{bucket}", role) for role in sorted(held)]
    except gexc.GoogleAPICallError as exc:
        return _unreadable(name, target, exc, "roles/storage.admin")
    try:
        policy = clients.artifact_registry(target).get_iam_policy(request={"resource": repository_path(target)})
        if not any(b.role == REPOSITORY_ROLE and member in b.members for b in policy.bindings):
            missing.append((repository_path(target), REPOSITORY_ROLE))
    except gexc.NotFound:
        pass  # no repository yet: promote creates it and grants the role
    except gexc.GoogleAPICallError as exc:
        return _unreadable(name, target, exc, "roles/artifactregistry.admin")
    if not missing and not extra:
        return Check(name=name, status="ok", detail=f"{email} exists and holds its roles on the build bucket and "
                     "repository, none on the model bucket.")  # fmt: skip
    fixes = [
        f"gcloud storage buckets add-iam-policy-binding {resource} --member={member} --role={role}"
        if resource.startswith("gs://")
        else f"gcloud artifacts repositories add-iam-policy-binding {target.artifact_repository} "
        f"--location {target.region} --project {target.project} --member={member} --role={role}"
        for resource, role in missing
    ]
    fixes += [
        f"gcloud storage buckets remove-iam-policy-binding {resource} --member={member} --role={role}"
        for resource, role in extra
    ]
    said = [f"lacks {', '.join(f'{role} on {resource}' for resource, role in missing)}"] if missing else []
    said += [f"holds {', '.join(f'{role} on {resource}' for resource, role in extra)}"] if extra else []
    return Check(name=name, status="warn", detail=f"{email} {' and '.join(said)}; promote grants and removes these "
                 "before the build.", fix=" && ".join(fixes))  # fmt: skip
