"""The dedicated, least-privilege identity Cloud Build runs our image builds as.

Since 2024 new projects run builds as the Compute Engine default service account, and where the organization
policy ``iam.automaticIamGrantsForDefaultServiceAccounts`` is enforced (new organizations) that account gets no
Editor role: it cannot read the build source, write the build log or push the image (Cloud Build docs, "Cloud
Build service account changes"; GoogleCloudPlatform/bigquery-dlp-remote-function issue 70). We therefore name
our own account in every build and grant it exactly what a build needs, on the resources it touches only:

- the model bucket (sources under ``cloudbuild-sources/``, logs under ``cloudbuild-logs/``):
  ``roles/storage.objectViewer`` to fetch the source and ``roles/storage.objectCreator`` to write the log;
- the Artifact Registry repository: ``roles/artifactregistry.writer`` to push the image.

A build with a user-chosen account must say where its logs go (400 otherwise); ours go to the bucket
(``logsBucket`` with ``GCS_ONLY``, tasks/images.py), so no Cloud Logging role is needed.
"""

from __future__ import annotations

from google.api_core import exceptions as gexc
from prefect import task

from blocks.target import GcpTarget
from tasks import clients
from tasks.access import _edit_pb_policy
from tasks.gcp import POLICY_CONFLICT_RETRY, EnsureResult, gcp_errors
from tasks.infra import iam_call, repository_path
from tasks.propagation import when_visible

BUCKET_ROLES = ("roles/storage.objectViewer", "roles/storage.objectCreator")
REPOSITORY_ROLE = "roles/artifactregistry.writer"


def build_account_resource(target: GcpTarget) -> str:
    """The build's ``serviceAccount`` field: ``projects/PROJECT/serviceAccounts/EMAIL``."""
    return f"projects/{target.project}/serviceAccounts/{target.build_service_account_email}"


def _member(target: GcpTarget) -> str:
    return f"serviceAccount:{target.build_service_account_email}"


def ensure_build_service_account(target: GcpTarget) -> EnsureResult:
    """The build identity's service account (get, else create)."""
    email = target.build_service_account_email
    with gcp_errors("iam", "roles/iam.serviceAccountAdmin", f"service account {email}", target.project):
        try:
            iam_call(target, "GET", build_account_resource(target))
            return EnsureResult(kind="service-account", name=email, action="found")
        except gexc.NotFound:
            pass
        try:
            iam_call(
                target,
                "POST",
                f"projects/{target.project}/serviceAccounts",
                {
                    "accountId": target.build_service_account_name,
                    "serviceAccount": {
                        "displayName": "Image builds (hf-cloudrun-pipeline)",
                        "description": "Cloud Build identity: reads build sources, writes build logs, pushes images",
                    },
                },
            )
        except gexc.Conflict:
            return EnsureResult(kind="service-account", name=email, action="found")
    return EnsureResult(kind="service-account", name=email, action="created")


def grant_build_bucket_access(target: GcpTarget) -> EnsureResult:
    """objectViewer (sources) and objectCreator (logs) for the build identity on the model bucket; other members'
    bindings are left alone."""
    bucket = clients.storage(target).bucket(target.bucket_name)
    member = _member(target)

    def edit() -> list[str]:
        policy = bucket.get_iam_policy(requested_policy_version=3)
        changes = []
        for role in BUCKET_ROLES:
            binding = next((b for b in policy.bindings if b["role"] == role and not b.get("condition")), None)
            if binding is None:
                policy.bindings.append({"role": role, "members": {member}})
            elif member not in binding["members"]:
                binding["members"].add(member)
            else:
                continue
            changes.append(f"granted {role}")
        if changes:
            bucket.set_iam_policy(policy)
        return changes

    what = f"IAM policy of gs://{target.bucket_name}"
    with gcp_errors("storage", "roles/storage.admin", what, target.project):
        # A service account created moments ago is unknown to Cloud Storage until IAM has propagated it.
        changes = when_visible(POLICY_CONFLICT_RETRY(edit), target.build_service_account_email, "Cloud Storage")
    return _result(f"gs://{target.bucket_name} {' + '.join(BUCKET_ROLES)} {member}", changes)


def grant_build_repository_writer(target: GcpTarget) -> EnsureResult:
    """artifactregistry.writer for the build identity on the image repository (not the project)."""
    registry = clients.artifact_registry(target)
    name = repository_path(target)
    with gcp_errors("artifactregistry", "roles/artifactregistry.admin", f"IAM policy of {name}", target.project):
        changes = when_visible(
            lambda: POLICY_CONFLICT_RETRY(_edit_pb_policy)(
                lambda: registry.get_iam_policy(request={"resource": name}),
                lambda policy: registry.set_iam_policy(request={"resource": name, "policy": policy}),
                REPOSITORY_ROLE,
                {_member(target)},
                False,
            ),
            target.build_service_account_email,
            "Artifact Registry",
        )
    return _result(f"{name} {REPOSITORY_ROLE} {_member(target)}", changes)


def ensure_build_identity(target: GcpTarget) -> list[EnsureResult]:
    """The build account and its three grants; the bucket and the repository must exist."""
    return [
        ensure_build_service_account(target),
        grant_build_bucket_access(target),
        grant_build_repository_writer(target),
    ]


def delete_build_service_account(target: GcpTarget) -> EnsureResult:
    """The build identity (teardown with ``service_account``); its bindings go with it."""
    email = target.build_service_account_email
    with gcp_errors("iam", "roles/iam.serviceAccountAdmin", f"deleting {email}", target.project):
        try:
            iam_call(target, "DELETE", build_account_resource(target))
        except gexc.NotFound:
            return EnsureResult(kind="service-account", name=email, action="absent")
    return EnsureResult(kind="service-account", name=email, action="deleted")


def _result(name: str, changes: list[str]) -> EnsureResult:
    return EnsureResult(kind="iam", name=name, action="updated" if changes else "found", changes=changes)


iam_ensure_build_identity = task(name="iam_ensure_build_identity")(ensure_build_identity)
iam_delete_build_service_account = task(name="iam_delete_build_service_account")(delete_build_service_account)
