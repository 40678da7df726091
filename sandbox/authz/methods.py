"""Discovery method id -> the IAM permission Google checks for it, and the resource whose policy applies.

Sources: each API's "permissions reference" / "access control" page, which lists one permission per REST method:
- Cloud Run: https://cloud.google.com/run/docs/reference/iam/permissions (run.services.create/get/list/update/delete/
  getIamPolicy/setIamPolicy, run.revisions.*, run.operations.*); deploying a revision that runs as a service
  account also needs iam.serviceAccounts.actAs on it (https://cloud.google.com/run/docs/configuring/services/
  service-identity, "Deployer permissions"; GoogleCloudPlatform/cloud-run-release-manager issue 81).
- Compute Engine: https://cloud.google.com/compute/docs/reference/rest/v1/networks/insert ("Requires the
  compute.networks.create IAM permission"), subnetworks.*, globalOperations.get, regionOperations.get.
- IAM: https://cloud.google.com/iam/docs/service-accounts-permissions (iam.serviceAccounts.create/get/delete/...).
- Secret Manager: https://cloud.google.com/secret-manager/docs/access-control (secrets.create, versions.add,
  versions.access, ...).
- Artifact Registry: https://cloud.google.com/artifact-registry/docs/access-control#permissions.
- Cloud Build: https://cloud.google.com/build/docs/iam-roles-permissions (builds.create/get/list/update); a build
  with a user-specified service account needs iam.serviceAccounts.actAs on it
  (https://cloud.google.com/build/docs/securing-builds/configure-user-specified-service-accounts).
- Cloud Logging: https://cloud.google.com/logging/docs/access-control (entries.list: logging.logEntries.list).
- Cloud Storage: https://cloud.google.com/storage/docs/json_api/v1/... and the IAM permissions page
  https://cloud.google.com/storage/docs/access-control/iam-json (buckets.insert: storage.buckets.create, ...).
- Resource Manager, Service Usage, Org Policy: their REST reference pages (projects.get:
  resourcemanager.projects.get; services.list: serviceusage.services.list; getEffectivePolicy:
  orgpolicy.policy.get). ``testIamPermissions`` needs no permission on any API.

Most ids follow Google's naming: ``{service}.{collection}.{verb}`` with patch -> update, insert -> create; the
exceptions are listed in ``OVERRIDES``. Long-running operation polls of APIs whose permission references list no
operation permission are not checked (``None``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from sandbox.discovery import MethodMatch
from sandbox.identity import unique_id

ACT_AS = "iam.serviceAccounts.actAs"

OVERRIDES: dict[str, str | None] = {
    "secretmanager.projects.secrets.addVersion": "secretmanager.versions.add",
    "secretmanager.projects.locations.secrets.addVersion": "secretmanager.versions.add",
    "cloudbuild.projects.builds.cancel": "cloudbuild.builds.update",
    "cloudbuild.projects.locations.builds.cancel": "cloudbuild.builds.update",
    "cloudbuild.projects.builds.retry": "cloudbuild.builds.create",
    "cloudbuild.projects.locations.builds.retry": "cloudbuild.builds.create",
    "logging.entries.list": "logging.logEntries.list",
    "logging.entries.write": "logging.logEntries.create",
    "compute.subnetworks.aggregatedList": "compute.subnetworks.list",
    "compute.subnetworks.listUsable": "compute.subnetworks.list",
    "compute.networks.getEffectiveFirewalls": "compute.networks.getEffectiveFirewalls",
    "storage.objects.compose": "storage.objects.create",
    "storage.objects.copy": "storage.objects.create",
    "storage.objects.rewrite": "storage.objects.create",
    # The v2 REST page names "orgpolicy.policies.get", a permission the Org Policy roles reference does not list
    # (https://cloud.google.com/iam/docs/roles-permissions/orgpolicy: orgpolicy.policy.get, held by policyViewer).
    "orgpolicy.projects.policies.get": "orgpolicy.policy.get",
    "orgpolicy.projects.policies.getEffectivePolicy": "orgpolicy.policy.get",
    "serviceusage.services.batchGet": "serviceusage.services.get",
    # v1beta1 quota reads: "Authorization requires ... serviceusage.quotas.get" (REST reference,
    # https://cloud.google.com/service-usage/docs/reference/rest/v1beta1/services.consumerQuotaMetrics/get).
    "serviceusage.services.consumerQuotaMetrics.get": "serviceusage.quotas.get",
    "serviceusage.services.consumerQuotaMetrics.list": "serviceusage.quotas.get",
    "serviceusage.services.batchEnable": "serviceusage.services.enable",
    "iam.projects.serviceAccounts.patch": "iam.serviceAccounts.update",
    # https://cloud.google.com/iam/docs/keys-create-delete: "iam.serviceAccountKeys.create".
    "iam.projects.serviceAccounts.keys.create": "iam.serviceAccountKeys.create",
}
VERBS = {"patch": "update", "insert": "create", "wait": "get", "aggregatedList": "list"}
SERVICES = {"cloudresourcemanager": "resourcemanager"}
# Discovery collection names that differ from the permission's resource type.
COLLECTIONS = {"dockerImages": "dockerimages"}
# The child-id query parameter of create methods, so the message names the resource being created.
CREATE_IDS = {"services": "serviceId", "jobs": "jobId", "secrets": "secretId", "repositories": "repositoryId"}
# Methods whose permission check reads the request body (service account to act as, resource name, log scope).
READS_BODY = {
    "run.projects.locations.services.create",
    "run.projects.locations.services.patch",
    "run.projects.locations.jobs.create",
    "run.projects.locations.jobs.patch",
    "cloudbuild.projects.builds.create",
    "cloudbuild.projects.locations.builds.create",
    "compute.networks.insert",
    "compute.subnetworks.insert",
    "logging.entries.list",
}


@dataclass(frozen=True)
class Check:
    """One permission to hold on one resource; ``subject`` is what the denial names (a service account for actAs)."""

    permission: str
    resource: str
    subject: str = ""


def permission_for(method_id: str) -> str | None:
    """The permission Google checks for ``method_id``, or None when the method needs none."""
    if method_id in OVERRIDES:
        return OVERRIDES[method_id]
    parts = method_id.split(".")
    api, collection, verb = parts[0], parts[-2], parts[-1]
    if verb == "testIamPermissions" or (collection == "operations" and api != "run"):
        return None
    collection = COLLECTIONS.get(collection, collection)
    return f"{SERVICES.get(api, api)}.{collection}.{VERBS.get(verb, verb)}"


def resource_for(match: MethodMatch, query: dict[str, str], body: dict, project: str) -> str:
    """The resource name the permission is checked on (and that a denial names)."""
    params = match.path_params
    api, collection = match.method.api.split(".")[0], match.id.split(".")[-2]
    if api == "compute":
        return _compute_resource(collection, params, body)
    if api == "storage":
        if "bucket" not in params:
            return f"projects/{query.get('project', project)}"
        name = f"projects/_/buckets/{params['bucket']}"
        obj = params.get("object") or (query.get("name") if collection == "objects" else None)
        return f"{name}/objects/{obj}" if obj else name
    if api == "logging":
        names = body.get("resourceNames") or [f"projects/{project}"]
        return str(names[0])
    if api == "cloudbuild" and "projectId" in params:
        build = f"/builds/{params['id']}" if "id" in params else ""
        return f"projects/{params['projectId']}{build}"
    if match.id.endswith(".create") and collection in CREATE_IDS and "parent" in params:
        child = query.get(CREATE_IDS[collection], "")
        return f"{params['parent']}/{collection}/{child}" if child else params["parent"]
    for key in ("name", "resource", "parent"):
        if key in params:
            return params[key]
    return f"projects/{project}"


def upload_object_name(raw: bytes) -> str | None:
    """The object name an upload without a ``name`` query parameter carries in its body: the JSON metadata of a
    resumable upload's first request, or the first (metadata) part of a multipart one (Cloud Storage docs,
    "Perform multipart uploads": "The first part contains the metadata"; google-cloud-storage sends the name
    only there). Google checks storage.objects.create on that object, so an object-name condition applies."""
    text = raw.lstrip()
    if not text.startswith(b"{"):
        _, _, rest = raw[: 1 << 20].partition(b"\r\n\r\n")  # past the first part's headers
        text = rest.split(b"\r\n--", 1)[0]
    try:
        metadata = json.loads(text)
    except ValueError:
        return None
    name = metadata.get("name") if isinstance(metadata, dict) else None
    return name if isinstance(name, str) and name else None


def _compute_resource(collection: str, params: dict[str, str], body: dict) -> str:
    project = f"projects/{params.get('project', '')}"
    if collection == "networks":
        name = params.get("network") or body.get("name")
        return f"{project}/global/networks/{name}" if name else project
    if collection == "subnetworks":
        name = params.get("subnetwork") or body.get("name")
        region = params.get("region")
        return f"{project}/regions/{region}/subnetworks/{name}" if name and region else project
    if collection == "globalOperations" and "operation" in params:
        return f"{project}/global/operations/{params['operation']}"
    if collection == "regionOperations" and "operation" in params:
        return f"{project}/regions/{params['region']}/operations/{params['operation']}"
    return project


def extra_checks(match: MethodMatch, body: dict, project: str, project_number: str) -> list[Check]:
    """actAs on the service account a Cloud Run revision or a build will run as."""
    if match.id in ("run.projects.locations.services.create", "run.projects.locations.services.patch"):
        template = body.get("template")
        if not isinstance(template, dict):
            return []  # traffic or scaling only: no new revision, nothing runs as anyone new
        # No account named: the revision runs as the Compute Engine default account, and actAs is checked on it.
        email = template.get("serviceAccount") or f"{project_number}-compute@developer.gserviceaccount.com"
        return [Check(ACT_AS, f"projects/{project}/serviceAccounts/{email}", subject=email)]
    if match.id in ("run.projects.locations.jobs.create", "run.projects.locations.jobs.patch"):
        # Cloud Run docs, "Service identity" for jobs: deploying a job that runs as an account needs actAs on it; no
        # account named means the Compute Engine default account.
        task = (body.get("template") or {}).get("template") or {}
        email = task.get("serviceAccount") or f"{project_number}-compute@developer.gserviceaccount.com"
        return [Check(ACT_AS, f"projects/{project}/serviceAccounts/{email}", subject=email)]
    if match.id in ("cloudbuild.projects.builds.create", "cloudbuild.projects.locations.builds.create"):
        account = body.get("serviceAccount")
        if not account:
            return []  # the default build identity: the caller needs no actAs on it
        email = str(account).rsplit("/", 1)[-1]
        # Cloud Build names the account by its numeric unique id: "caller does not have permission to act as service
        # account 109095503163182759798" (kohei321dev/spot-diggz issue 164, `gcloud builds submit`).
        return [Check(ACT_AS, f"projects/{project}/serviceAccounts/{email}", subject=unique_id(email))]
    return []
