"""403 answers as each Google API words them when the caller lacks a permission.

- AIP-193 APIs (Cloud Run, Secret Manager, Artifact Registry, IAM, Logging, Resource Manager, Service Usage,
  Org Policy): ``{"error": {"code": 403, "message": "Permission 'P' denied on resource 'R' (or it may not
  exist).", "status": "PERMISSION_DENIED", "details": [ErrorInfo reason IAM_PERMISSION_DENIED, domain
  iam.googleapis.com, metadata {permission}]}}`` (python-logging / kubeflow pipelines PR 12591 show the ErrorInfo).
  Wording differs per API, as seen in public reports:
  Cloud Run "... denied on resource 'namespaces/p/services/s' (or resource may not exist)." (google-github-actions/
  deploy-cloudrun issue 182; the v2 API names projects/p/locations/l/services/s); Cloud Run's actAs check
  "Permission 'iam.serviceaccounts.actAs' denied on service account X (or it may not exist)."
  (cloud-run-release-manager issue 81, google/keyword_factory issue 22); Secret Manager "... denied for resource
  'projects/p/secrets/s/versions/1' (or it may not exist)." (googleapis/python-secret-manager issue 389);
  Artifact Registry "... denied on resource '//artifactregistry.googleapis.com/projects/...' (or it may not
  exist)." (deploy-cloudrun issue 370); Resource Manager "... '//cloudresourcemanager.googleapis.com/projects/N'"
  (CrowdStrike/falcon-integration-gateway PR 98); IAM and Logging name no resource ("Permission
  'iam.serviceAccounts.getAccessToken' denied on resource (or it may not exist).", google-github-actions/auth
  issue 426).
- Cloud Build: "The caller does not have permission" (cortex-data-foundation issue 10); a build run as a
  user-specified account the caller may not use: PERMISSION_DENIED "generic::permission_denied: caller does not
  have permission to act as service account projects/P/serviceAccounts/112288884898868582499." (the account's
  numeric unique id, under the project; BusyaPrime/Operator-OS-Dev's CI log of `gcloud builds submit`, and
  kohei321dev/spot-diggz issue 164, which quotes the id alone).
- Compute Engine: "Required 'compute.networks.get' permission for 'projects/p/global/networks/n'" with
  ``errors: [{reason: "forbidden"}]`` (alexandarp/terraform-gke issue 2).
- Cloud Storage: "EMAIL does not have storage.buckets.get access to the Google Cloud Storage bucket. Permission
  'storage.buckets.get' denied on resource (or it may not exist)." with ``errors: [{reason: "forbidden"}]``
  (ansible-collections/google.cloud issue 575, zetaalphavector/InPars issue 13); "... to the Google Cloud
  project." for bucket create and list.
"""

from __future__ import annotations

from sandbox.authz.methods import ACT_AS, Check

ERROR_INFO = "type.googleapis.com/google.rpc.ErrorInfo"


def _error_info(permission: str, resource: str) -> dict:
    metadata = {"permission": permission}
    if resource:
        metadata["resource"] = resource
    return {"@type": ERROR_INFO, "reason": "IAM_PERMISSION_DENIED", "domain": "iam.googleapis.com",
            "metadata": metadata}  # fmt: skip


def _aip(message: str, permission: str, resource: str = "") -> dict:
    return {
        "error": {
            "code": 403,
            "message": message,
            "status": "PERMISSION_DENIED",
            "details": [_error_info(permission, resource)],
        }
    }


def _forbidden(message: str) -> dict:
    """The JSON API v1 shape (Compute, Storage): an ``errors`` list with reason "forbidden"."""
    return {
        "error": {
            "code": 403,
            "message": message,
            "errors": [{"message": message, "domain": "global", "reason": "forbidden"}],
            "status": "PERMISSION_DENIED",
        }
    }


def _storage_scope(permission: str) -> str:
    if permission in ("storage.buckets.create", "storage.buckets.list"):
        return "Google Cloud project"
    if permission.startswith("storage.objects.") and permission != "storage.objects.list":
        return "Google Cloud Storage object"
    return "Google Cloud Storage bucket"


def denial(api: str, check: Check, principal: str) -> dict:
    """The 403 body ``api`` ("run", "storage", ...) sends when ``principal`` lacks ``check.permission``."""
    permission, resource = check.permission, check.resource
    if permission == ACT_AS and api == "run":
        return _aip(
            f"Permission 'iam.serviceaccounts.actAs' denied on service account {check.subject} (or it may not exist).",
            permission,
            resource,
        )
    if permission == ACT_AS and api == "cloudbuild":
        return _aip(cloud_build_act_as(check.resource.split("/")[1], check.subject), permission, resource)
    if api == "run":
        return _aip(f"Permission '{permission}' denied on resource '{resource}' (or resource may not exist).",
                    permission, resource)  # fmt: skip
    if api == "secretmanager":
        return _aip(f"Permission '{permission}' denied for resource '{resource}' (or it may not exist).",
                    permission, resource)  # fmt: skip
    if api in ("artifactregistry", "cloudresourcemanager", "serviceusage", "orgpolicy"):
        host = f"//{api}.googleapis.com/{resource}"
        return _aip(f"Permission '{permission}' denied on resource '{host}' (or it may not exist).", permission,
                    resource)  # fmt: skip
    if api == "cloudbuild":
        return _aip("The caller does not have permission", permission, resource)
    if api == "monitoring":
        # "7 PERMISSION_DENIED: Permission monitoring.timeSeries.list denied (or the resource may not exist)."
        # (GoogleCloudPlatform/autoscaler docs, poller troubleshooting; Checkmk's GCP special agent tests); over
        # REST the same message with status PERMISSION_DENIED and no details (dynatrace-oss/dynatrace-gcp-monitor
        # issues 25 and 42: "{'code': 403, 'message': 'Permission monitoring.timeSeries.create denied (or the
        # resource may not exist).', 'status': 'PERMISSION_DENIED'}"). A review's "Permission denied (or the
        # resource may not exist)." with a DebugInfo detail has no public source found: not used.
        return _aip(f"Permission {permission} denied (or the resource may not exist).", permission, resource)
    if api == "compute":
        return _forbidden(f"Required '{permission}' permission for '{resource}'")
    if api == "storage":
        email = principal.partition(":")[2] or principal
        return _forbidden(
            f"{email} does not have {permission} access to the {_storage_scope(permission)}. Permission "
            f"'{permission}' denied on resource (or it may not exist)."
        )
    # IAM, Logging and anything else: the resource is not named.
    return _aip(f"Permission '{permission}' denied on resource (or it may not exist).", permission)


def cloud_build_act_as(project: str, account_unique_id: str) -> str:
    """Cloud Build's refusal of a build as an account the caller may not act as (sources above)."""
    return (
        "generic::permission_denied: caller does not have permission to act as service account "
        f"projects/{project}/serviceAccounts/{account_unique_id}."
    )


# Google's answer to a bearer token it did not issue or that expired: the APIs' standard 401 (as google-api-core
# raises it, google.api_core.exceptions.Unauthorized; the text as Google's front ends give it, quoted in many public
# reports, e.g. googleapis/google-cloud-python issues on expired tokens), and Cloud Storage's JSON API form of it
# ("Invalid Credentials", reason authError: Cloud Storage docs, "HTTP status and error codes", 401).
UNAUTHENTICATED_MESSAGE = (
    "Request had invalid authentication credentials. Expected OAuth 2 access token, login cookie or other valid "
    "authentication credential. See https://developers.google.com/identity/sign-in/web/devconsole-project."
)


def unauthenticated(storage: bool) -> dict:
    """The 401 body for an unknown bearer token: Cloud Storage's form, or the other APIs' ``UNAUTHENTICATED``."""
    if storage:
        error = {"message": "Invalid Credentials", "domain": "global", "reason": "authError",
                 "locationType": "header", "location": "Authorization"}  # fmt: skip
        return {"error": {"code": 401, "message": "Invalid Credentials", "errors": [error]}}
    return {"error": {"code": 401, "message": UNAUTHENTICATED_MESSAGE, "status": "UNAUTHENTICATED"}}
