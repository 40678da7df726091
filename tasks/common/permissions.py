"""The IAM roles the identity running the pipeline (the deployer) needs, as data: role -> the permissions of it we
rely on and the step that uses each.

docs/first-run.md's "Roles the deployer needs" table is generated from ``PROJECT_ROLES``, ``DEPLOYER_ROLES`` and
``DOCTOR_ROLES`` (``readme_table()``; a unit test keeps them equal). ``doctor`` checks with ``testIamPermissions``
that the caller holds ``required_permissions()`` (what promote, scale, rollback and teardown call; its "deployer
permissions" row) and ``doctor_permissions()`` (what doctor's own read-only checks call; its "doctor permissions"
row). A 403 anywhere in the product is explained with ``explain_denied()``: the missing permission parsed from
Google's message and the predefined role to grant.

Role contents are Google's predefined roles (IAM "roles and permissions" reference pages:
https://cloud.google.com/iam/docs/roles-permissions/run, .../storage, .../compute, .../iam, .../secretmanager,
.../artifactregistry, .../cloudbuild, .../logging, .../serviceusage, .../orgpolicy). Choices worth knowing:
- roles/run.admin, not roles/run.developer: only run.admin has run.services.setIamPolicy, which granting
  roles/run.invoker on the service needs (https://cloud.google.com/run/docs/reference/iam/roles).
- roles/iam.serviceAccountUser: deploying a service that runs as a service account needs
  iam.serviceAccounts.actAs on it; Cloud Run answers 403 "Permission 'iam.serviceaccounts.actAs' denied on
  service account X (or it may not exist)." otherwise (GoogleCloudPlatform/cloud-run-release-manager issue 81).
- roles/storage.admin: creating the bucket and setting its IAM policy are in no narrower predefined role.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

ACT_AS = "iam.serviceAccounts.actAs"
# What the Managed Service for Prometheus sidecar (tasks/deploy/metrics_sidecar.py) needs to write vLLM's metrics.
METRIC_WRITER_ROLE = "roles/monitoring.metricWriter"


@dataclass(frozen=True)
class RoleNeed:
    """One predefined role the deployer needs, and why."""

    role: str
    title: str
    when: str  # "always", or the condition under which the steps that use it run
    permissions: dict[str, str] = field(default_factory=dict)  # permission -> the step that uses it
    purpose: str = ""  # one line for the role table (docs/first-run.md)

    @property
    def steps(self) -> list[str]:
        return list(dict.fromkeys(self.permissions.values()))


DEPLOYER_ROLES: tuple[RoleNeed, ...] = (
    RoleNeed(
        "roles/run.admin",
        "Cloud Run Admin",
        "always",
        {
            "run.services.get": "deploy (read the service), scale-service, rollback-model",
            "run.services.create": "deploy: first revision of a new service",
            "run.services.update": "deploy a tagged candidate, move traffic, scale-service, rollback-model",
            "run.services.delete": "teardown; removing a first deploy that failed verification",
            "run.services.list": "teardown --network: which services still hold the subnet's IPs",
            "run.services.getIamPolicy": "grant roles/run.invoker to GcpTarget.invokers",
            "run.services.setIamPolicy": "grant roles/run.invoker to GcpTarget.invokers",
            "run.revisions.get": "deploy: reuse or rename a revision, read why it failed",
            "run.revisions.list": "rollback-model: find the previous ready revision",
            "run.operations.get": "wait for deploy, traffic and delete operations",
            "run.routes.invoke": "verify the candidate at its tag URL with your identity token",
        },
        purpose="deploy, verify and promote revisions; scale-service; rollback-model; teardown; grant "
        "roles/run.invoker "
        "on the service (run.developer lacks setIamPolicy)",
    ),
    RoleNeed(
        "roles/iam.serviceAccountUser",
        "Service Account User",
        "always",
        {ACT_AS: "deploy a revision as the serving account; run a build as the build identity"},
        purpose="act as the serving account (deploy) and the build identity (builds)",
    ),
    RoleNeed(
        "roles/iam.serviceAccountAdmin",
        "Service Account Admin",
        "always",
        {
            "iam.serviceAccounts.get": "ensure infrastructure: the serving (and build) service accounts",
            "iam.serviceAccounts.create": "ensure infrastructure: the serving (and build) service accounts",
            "iam.serviceAccounts.delete": "teardown --service-account",
        },
        purpose="create the serving (and build) service accounts; teardown --service-account",
    ),
    RoleNeed(
        "roles/storage.admin",
        "Storage Admin",
        "always",
        {
            "storage.buckets.get": "ensure infrastructure: check the model and build buckets",
            "storage.buckets.create": "ensure infrastructure: create the model and build buckets",
            "storage.buckets.update": "ensure infrastructure: uniform access, public access prevention, labels",
            "storage.buckets.getIamPolicy": "check the bucket is private; grant the serving account objectViewer",
            "storage.buckets.setIamPolicy": "objectViewer for the serving account; the build identity's bucket role",
            "storage.buckets.delete": "teardown --staged-weights, --build-bucket",
            "storage.objects.list": "stage weights: find what is already staged; teardown --reports",
            "storage.objects.get": "stage weights: read the manifest; read build logs",
            "storage.objects.create": "stage weights; upload build source; archive each run's report (reports/)",
            "storage.objects.delete": "stage weights: replace a bad object; teardown --staged-weights, --build-bucket, "
            "--reports",
        },
        purpose="create and check the model and build buckets, set their IAM policies, stage weights, build sources "
        "and logs, archive run reports; teardown --staged-weights, --build-bucket, --reports",
    ),
    RoleNeed(
        "roles/compute.networkAdmin",
        "Compute Network Admin",
        "always",
        {
            "compute.networks.get": "ensure infrastructure: the VPC for Direct VPC egress",
            "compute.networks.create": "ensure infrastructure: the VPC for Direct VPC egress",
            "compute.networks.delete": "teardown --network",
            "compute.subnetworks.get": "ensure infrastructure: the subnet",
            "compute.subnetworks.create": "ensure infrastructure: the subnet",
            "compute.subnetworks.setPrivateIpGoogleAccess": "ensure infrastructure: Private Google Access on",
            "compute.subnetworks.delete": "teardown --network",
            "compute.globalOperations.get": "wait for network operations",
            "compute.regionOperations.get": "wait for subnet operations",
        },
        purpose="VPC and subnet for Direct VPC egress with Private Google Access; teardown --network",
    ),
    RoleNeed(
        "roles/logging.viewer",
        "Logs Viewer",
        "always (read when a revision fails to start, and by the watch)",
        {"logging.logEntries.list": "a failed revision's container log; the watch: the candidate's 429s"},
        purpose="a revision that fails to start: its container log goes into the error; the watch counts the "
        "candidate's 429s (every instance busy) in its request log",
    ),
    RoleNeed(
        "roles/monitoring.viewer",
        "Monitoring Viewer",
        "always (the watch after each traffic move; not with watch_samples 0)",
        {"monitoring.timeSeries.list": "watch a promotion: the new revision's request count and latency"},
        purpose="watch a promotion on the new revision's Cloud Run request metrics (5xx ratio, p95), and roll back",
    ),
    RoleNeed(
        "roles/secretmanager.admin",
        "Secret Manager Admin",
        "the profile sets hf_token_at_runtime",
        {
            "secretmanager.secrets.get": "store the Hub token",
            "secretmanager.secrets.create": "store the Hub token",
            "secretmanager.versions.add": "store the Hub token (a new version only when it changed)",
            "secretmanager.versions.access": "compare the stored token with the current one",
            "secretmanager.secrets.getIamPolicy": "grant the serving account secretAccessor on the secret",
            "secretmanager.secrets.setIamPolicy": "grant the serving account secretAccessor on the secret",
            "secretmanager.secrets.delete": "teardown --secret",
        },
        purpose="store the Hub token in Secret Manager and let the serving account (only) read it; teardown --secret",
    ),
    RoleNeed(
        "roles/artifactregistry.admin",
        "Artifact Registry Administrator",
        "the profile builds its image (ServingProfile.build)",
        {
            "artifactregistry.repositories.get": "ensure infrastructure: the image repository",
            "artifactregistry.repositories.create": "ensure infrastructure: the image repository",
            "artifactregistry.repositories.update": "ensure infrastructure: vulnerability scanning, labels",
            "artifactregistry.tags.get": "skip a build whose image is already pushed",
            "artifactregistry.repositories.getIamPolicy": "grant the build identity roles/artifactregistry.writer",
            "artifactregistry.repositories.setIamPolicy": "grant the build identity roles/artifactregistry.writer",
            "artifactregistry.repositories.delete": "teardown --artifact-repository",
        },
        purpose="the image repository, and roles/artifactregistry.writer on it for the build identity; teardown "
        "--artifact-repository",
    ),
    RoleNeed(
        "roles/cloudbuild.builds.editor",
        "Cloud Build Editor",
        "the profile builds its image (ServingProfile.build)",
        {
            "cloudbuild.builds.create": "build the image",
            "cloudbuild.builds.get": "wait for the build",
            "cloudbuild.builds.list": "find a build an interrupted run already started",
        },
        purpose="run and follow the image build",
    ),
    RoleNeed(
        "roles/resourcemanager.projectIamAdmin",
        "Project IAM Admin",
        "the profile runs the metrics sidecar (metrics: vllm), until the serving account holds "
        "roles/monitoring.metricWriter (an admin may grant it once instead)",
        {
            "resourcemanager.projects.getIamPolicy": "metrics: vllm: find the serving account's metricWriter binding",
            "resourcemanager.projects.setIamPolicy": "metrics: vllm: grant the serving account "
            "roles/monitoring.metricWriter",
        },
        purpose="grant the serving account roles/monitoring.metricWriter on the project, for the Prometheus sidecar",
    ),
)

DOCTOR = "doctor (read-only checks)"

# Permissions doctor's read-only checks use beyond the deployer's (predefined roles that hold them). The methods
# and the permission each requires, from their REST reference pages: Service Usage services.batchGet
# (serviceusage.services.get) and v1beta1 services.consumerQuotaMetrics.get (serviceusage.quotas.get),
# https://cloud.google.com/service-usage/docs/reference/rest/v1/services/batchGet and .../v1beta1/
# services.consumerQuotaMetrics/get; Org Policy v2 projects.policies.getEffectivePolicy (orgpolicy.policy.get),
# https://cloud.google.com/resource-manager/docs/reference/orgpolicy/rest/v2/projects.policies/getEffectivePolicy.
# testIamPermissions (projects, service accounts) needs no permission.
DOCTOR_ROLES: tuple[RoleNeed, ...] = (
    RoleNeed(
        "roles/serviceusage.serviceUsageViewer",
        "Service Usage Viewer",
        DOCTOR,
        {
            "serviceusage.services.get": "doctor: the APIs the pipeline calls are enabled (services.batchGet)",
            "serviceusage.quotas.get": "doctor, preflight and scale-service: the Cloud Run GPU quota covers "
            "max_instances, and holds a candidate beside the serving revision",
        },
        purpose="doctor: the APIs the pipeline calls are enabled; the GPU quota (also read by preflight and scale)",
    ),
    RoleNeed(
        "roles/orgpolicy.policyViewer",
        "Organization Policy Viewer",
        DOCTOR,
        {"orgpolicy.policy.get": "doctor: organisation policies that would refuse the deploy (getEffectivePolicy)"},
        purpose="doctor: organisation policies that would refuse the deploy",
    ),
)

# What an identity that holds none of the roles above (a bare project) needs before anything else: to see the
# project. Every deployer and doctor role but orgpolicy.policyViewer holds resourcemanager.projects.get, so this row
# matters only until one of them is granted; doctor's "project access" row checks it and names the role first.
# Browser: "Read access to browse the hierarchy for a project, including the folder, organization, and allow
# policy" (https://cloud.google.com/iam/docs/roles-permissions/browser).
PROJECT_ROLES: tuple[RoleNeed, ...] = (
    RoleNeed(
        "roles/browser",
        "Browser",
        "doctor, on a project where you hold none of the roles below",
        {"resourcemanager.projects.get": "doctor: the project exists and you may see it"},
        purpose="doctor: see the project at all; the first grant on a project where you hold nothing",
    ),
)

# Permissions that more than one role holds: the role we name is the narrowest predefined one that has it.
_OTHER_ROLES = {
    "resourcemanager.projects.getIamPolicy": "roles/iam.securityReviewer",
    "resourcemanager.projects.setIamPolicy": "roles/resourcemanager.projectIamAdmin",
    "iam.serviceAccounts.getIamPolicy": "roles/iam.serviceAccountAdmin",
    "iam.serviceAccounts.setIamPolicy": "roles/iam.serviceAccountAdmin",
    "iam.serviceAccounts.list": "roles/iam.serviceAccountAdmin",
    "artifactregistry.repositories.getIamPolicy": "roles/artifactregistry.admin",
    "artifactregistry.repositories.setIamPolicy": "roles/artifactregistry.admin",
    "cloudquotas.quotas.get": "roles/cloudquotas.viewer",
    "serviceusage.services.use": "roles/serviceusage.serviceUsageConsumer",
    "storage.buckets.list": "roles/storage.admin",
    "compute.subnetworks.use": "roles/compute.networkUser",
    "compute.networks.list": "roles/compute.networkViewer",
    "compute.subnetworks.list": "roles/compute.networkViewer",
}


def required_permissions(building: bool = True, hub_token: bool = True, metrics: bool = True) -> list[str]:
    """Every project-level permission the deployer's flows (promote, scale, rollback, teardown) need: the
    ``DEPLOYER_ROLES`` rows, all of them by default, narrower when the targets never build an image or never store
    the Hub token. Doctor's own read permissions are not included (``doctor_permissions()``). Sorted, no repeats."""
    wanted = set()
    for need in DEPLOYER_ROLES:
        if (not building and "builds its image" in need.when) or (not hub_token and "hf_token_at_runtime" in need.when):
            continue
        if not metrics and "metrics: vllm" in need.when:
            continue
        wanted |= set(need.permissions)
    return sorted(wanted)


def doctor_permissions() -> list[str]:
    """The permissions doctor's read-only checks need beyond ``required_permissions()`` (the ``DOCTOR_ROLES`` rows).
    Sorted, without repeats."""
    return sorted({p for need in DOCTOR_ROLES for p in need.permissions})


def _index() -> dict[str, str]:
    index: dict[str, str] = {}
    for need in (*DEPLOYER_ROLES, *DOCTOR_ROLES, *PROJECT_ROLES):
        for permission in need.permissions:
            index.setdefault(permission.lower(), need.role)
    for permission, role in _OTHER_ROLES.items():
        index.setdefault(permission.lower(), role)
    return index


_ROLE_BY_PERMISSION = _index()
_CANONICAL = {p.lower(): p for need in (*DEPLOYER_ROLES, *DOCTOR_ROLES, *PROJECT_ROLES) for p in need.permissions} | {
    p.lower(): p for p in _OTHER_ROLES
}


def role_for(permission: str) -> str:
    """The predefined role to grant for ``permission`` (case-insensitive: Cloud Run spells actAs
    'iam.serviceaccounts.actAs'). KeyError for a permission the pipeline never needs."""
    return _ROLE_BY_PERMISSION[permission.lower()]


def canonical(permission: str) -> str:
    """``permission`` as IAM spells it (iam.serviceAccounts.actAs), when we know it."""
    return _CANONICAL.get(permission.lower(), permission)


# Google's 403 texts, one per API family:
# - Cloud Run, Secret Manager, Artifact Registry, Cloud Build, IAM, Logging (AIP-193 ErrorInfo):
#   "Permission 'run.services.create' denied on resource 'projects/...' (or resource may not exist)."
#   and Cloud Run's "Permission 'iam.serviceaccounts.actAs' denied on service account X (or it may not exist)."
# - Cloud Storage: "x@y does not have storage.buckets.create access to the Google Cloud project. ..."
# - Compute Engine: "Required 'compute.networks.create' permission for 'projects/p/global/networks/n'"
# - IAM (older form): "The caller does not have permission" carries no permission name (None below).
_DENIED_PATTERNS = (
    re.compile(r"Permission '([A-Za-z0-9_.]+)' denied"),
    re.compile(r"Permission \"([A-Za-z0-9_.]+)\" denied"),
    re.compile(r"does not have ([a-z0-9]+\.[A-Za-z0-9_.]+) access"),
    re.compile(r"Required '([A-Za-z0-9_.]+)' permission"),
    re.compile(r"IAM permission '([A-Za-z0-9_.]+)'"),
)
# Cloud Build's words for a build run as an account the caller may not use (no permission name in them).
_ACT_AS_WORDS = "permission to act as service account"
# Cloud Storage names the caller: "x@y does not have storage.buckets.create access ...".
_STORAGE_CALLER = re.compile(r"(?:^|: )([^\s:@]+@[^\s@]+) does not have [a-z0-9]+\.")
PRINCIPAL = "PRINCIPAL"


def denied_permission(message: str) -> str | None:
    """The permission a Google 403 message names, spelled as IAM spells it; None when it names none."""
    for pattern in _DENIED_PATTERNS:
        found = pattern.search(message)
        if found:
            return canonical(found.group(1))
    if _ACT_AS_WORDS in message:
        return ACT_AS
    return None


def denied_member(message: str) -> str | None:
    """The principal a 403 message names (Cloud Storage's do), as an IAM member; None when it names none."""
    found = _STORAGE_CALLER.search(message)
    if found is None:
        return None
    email = found.group(1)
    return f"serviceAccount:{email}" if email.endswith(".gserviceaccount.com") else f"user:{email}"


def grant_command(project: str, role: str, member: str = PRINCIPAL) -> str:
    """The gcloud command that grants ``role`` on the project."""
    return f"gcloud projects add-iam-policy-binding {project} --member={member} --role={role}"


def explain_denied(message: str, project: str, member: str | None = None) -> str | None:
    """ "missing permission X; grant ROLE: `gcloud ...`" for a Google 403 message, or None when the message
    names no permission we know a role for."""
    permission = denied_permission(message)
    if permission is None:
        return None
    return explain_permission(permission, project, member or denied_member(message))


def explain_permission(permission: str, project: str, member: str | None = None) -> str:
    """ "missing permission X; grant ROLE: `gcloud ...`" for a permission the caller lacks."""
    permission = canonical(permission)
    try:
        role = role_for(permission)
    except KeyError:
        return f"missing permission {permission}; grant the identity running this flow a role that includes it"
    command = grant_command(project, role, member or PRINCIPAL)
    who = "" if member else f" ({PRINCIPAL}: the identity running this flow, e.g. user:you@example.com)"
    return f"missing permission {permission}; grant {role}: `{command}`{who}"


def readme_table() -> str:
    """docs/first-run.md's "Roles the deployer needs" table (markdown): ``PROJECT_ROLES`` first (the first grant on a
    bare project), then ``DEPLOYER_ROLES`` and, last, the ``DOCTOR_ROLES`` (Needed: "doctor (read-only checks)")."""
    rows = ["| Role | Needed | For | Permissions we use |", "|---|---|---|---|"]
    for need in (*PROJECT_ROLES, *DEPLOYER_ROLES, *DOCTOR_ROLES):
        permissions = ", ".join(f"`{p}`" for p in need.permissions)
        rows.append(f"| `{need.role}` ({need.title}) | {need.when} | {need.purpose} | {permissions} |")
    return "\n".join(rows) + "\n"
