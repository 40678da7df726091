"""doctor's checks of access: the project, its APIs, the caller's permissions, actAs on the runtime account, and
the serving account's right to write vLLM's metrics."""

from __future__ import annotations

from google.api_core import exceptions as gexc
from google.cloud import service_usage_v1

from blocks.profile import ServingProfile
from blocks.target import GcpTarget
from tasks.checks.doctor.rows import (
    BROWSER,
    ME,
    PROJECT_GET,
    Check,
    by_caller_permission,
    disabled_service,
    enable_command,
    google_text,
    granted,
    json_error,
    unreadable,
)
from tasks.common import clients
from tasks.common.permissions import (
    ACT_AS,
    METRIC_WRITER_ROLE,
    doctor_permissions,
    grant_command,
    required_permissions,
    role_for,
)

ACT_AS_ROLE = "roles/iam.serviceAccountUser"
PROJECT_IAM_ADMIN = "roles/resourcemanager.projectIamAdmin"
SET_PROJECT_POLICY = "resourcemanager.projects.setIamPolicy"  # what promote's grant of the metric writer role needs

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


def required_apis(profile: ServingProfile) -> list[str]:
    """The services the pipeline calls for this profile: build APIs only when it builds its image, Secret Manager
    when the Hub token is stored there."""
    apis = list(ALWAYS_APIS)
    if profile.build is not None:
        apis += BUILD_APIS
    if profile.build is not None or profile.hf_token_at_runtime:
        apis += SECRET_APIS
    return sorted(apis)


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
        held = PROJECT_GET in granted(target, [PROJECT_GET])
    except gexc.GoogleAPICallError as exc:
        if disabled_service(exc):
            return unreadable(name, target, exc, BROWSER)
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
        if disabled_service(exc) == "serviceusage.googleapis.com":
            return Check(
                name=name, status="fail",
                detail="serviceusage.googleapis.com is not enabled, so the other APIs could not be read.",
                fix=enable_command(wanted, target.project),
            )  # fmt: skip
        return unreadable(name, target, exc, "roles/serviceusage.serviceUsageViewer")
    enabled = service_usage_v1.State.ENABLED
    off = sorted(s.name.rsplit("/", 1)[-1] for s in found.services if s.state != enabled)
    if off:
        return Check(name=name, status="fail", detail=f"not enabled: {', '.join(off)}.",
                     fix=enable_command(off, target.project))  # fmt: skip
    return Check(name=name, status="ok", detail=f"all {len(wanted)} APIs the pipeline calls are enabled.")


def check_permissions(target: GcpTarget, profile: ServingProfile) -> Check:
    """The caller holds every permission of the deployer role table (``projects.testIamPermissions``)."""
    wanted = required_permissions(
        building=profile.build is not None,
        hub_token=profile.hf_token_at_runtime,
        metrics=False,  # the metrics role has its own row (check_metric_writer): an admin may grant metricWriter once
    )
    return _held("deployer permissions", "the deployer roles", target, wanted)


def check_doctor_permissions(target: GcpTarget) -> Check:
    """The caller holds what doctor's own read-only checks call (docs/first-run.md's "doctor (read-only checks)" rows):
    without them those checks cannot read, and this row names the roles to grant once for all of them."""
    return _held("doctor permissions", "the doctor roles", target, doctor_permissions())


def _held(name: str, what: str, target: GcpTarget, wanted: list[str]) -> Check:
    try:
        missing = sorted(set(wanted) - granted(target, wanted))
    except gexc.GoogleAPICallError as exc:
        return unreadable(name, target, exc, BROWSER)  # the project itself is out of sight
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


def check_act_as(target: GcpTarget) -> Check:
    """The caller may act as the runtime service account (``serviceAccounts.testIamPermissions``); before the account
    exists, the project-level grant that will cover it."""
    return act_as("actAs on the runtime service account", target, target.service_account_email)


def act_as(name: str, target: GcpTarget, email: str) -> Check:
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
    message, disabled = json_error(response)
    if disabled:
        return Check(name=name, status="fail", detail=f"{disabled} is not enabled, so this could not be checked.",
                     fix=enable_command([disabled], target.project))  # fmt: skip
    if response.status_code not in (403, 404):
        return Check(name=name, status="warn",
                     detail=f"could not be checked: {response.status_code} {google_text(message)}")  # fmt: skip
    # 404 (or 403 "or it may not exist"): no account yet. promote creates it; the project-level grant covers it then.
    row = by_caller_permission(
        name, target, ACT_AS,
        ok=f"{email} will be created by promote; project-level {ACT_AS} covers it.",
        fail=f"{email} does not exist yet and you lack {ACT_AS} on the project: the first deploy would be refused.",
        fix=grant_command(target.project, ACT_AS_ROLE, ME), roles=[ACT_AS_ROLE],
    )  # fmt: skip
    if row.roles == [ACT_AS_ROLE]:  # the row's name says which account: its line need not repeat the address
        row.summary = f"not created yet, and you lack {ACT_AS} on the project: the first deploy would be refused."
    return row


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
        # The role promote's grant needs (docs/first-run.md's table, metrics: vllm) also reads the policy: one role,
        # not two.
        return unreadable(name, target, exc, PROJECT_IAM_ADMIN)
    if any(b.role in WRITER_ROLES and member in b.members for b in policy.bindings):
        return Check(name=name, status="ok", detail=f"{target.service_account_email} may write metrics.")
    return by_caller_permission(
        name, target, SET_PROJECT_POLICY,
        ok=f"promote grants {target.service_account_email} {METRIC_WRITER_ROLE} (you may set the project's IAM "
        "policy).",
        fail=f"{target.service_account_email} lacks {METRIC_WRITER_ROLE} and you may not grant it: the sidecar's "
        "writes would be refused and the watch could not judge vLLM's metrics.",
        fix=grant_command(target.project, METRIC_WRITER_ROLE, member),
    )  # fmt: skip
