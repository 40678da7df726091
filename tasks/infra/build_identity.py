"""The dedicated, least-privilege identity Cloud Build runs our image builds as.

Since 2024 new projects run builds as the Compute Engine default service account, and where the organization
policy ``iam.automaticIamGrantsForDefaultServiceAccounts`` is enforced (new organizations) that account gets no
Editor role: it cannot read the build source, write the build log or push the image (Cloud Build docs, "Cloud
Build service account changes"; GoogleCloudPlatform/bigquery-dlp-remote-function issue 70). We therefore name
our own account in every build and grant it exactly what a build needs, on the resources it touches only:

- the build bucket (``GcpTarget.build_bucket``: sources under ``cloudbuild-sources/``, logs under
  ``cloudbuild-logs/``): ``roles/storage.admin``. Google's "Store and manage build logs" page
  (https://cloud.google.com/build/docs/securing-builds/store-view-build-logs, "Store build logs in a user-created
  bucket", IAM permissions) asks for Storage Admin for any build account other than the legacy Cloud Build one;
  objectViewer + objectCreator are refused at create ('invalid bucket "X"; builder service account does not have
  access to the bucket'). Storage Admin on the model bucket would let a build replace weights, so builds get a
  bucket of their own and nothing on the model bucket (a role left there by an earlier version is removed);
- the Artifact Registry repository: ``roles/artifactregistry.writer`` to push the image.

A build with a user-chosen account must say where its logs go (400 otherwise); ours go to the build bucket
(``logsBucket`` with ``GCS_ONLY``, tasks/image/images.py), so no Cloud Logging role is needed.
"""

from __future__ import annotations

from prefect import task

from blocks.target import GcpTarget
from tasks.common import clients
from tasks.common.gcp import POLICY_CONFLICT_RETRY, EnsureResult, gcp_errors
from tasks.infra.access import grant_to_new_account
from tasks.infra.ensure import get_or_create_service_account, repository_path, service_account_path
from tasks.infra.propagation import note_grant, note_resource_grant, when_visible
from tasks.infra.teardown import delete_service_account

BUILD_BUCKET_ROLE = "roles/storage.admin"
REPOSITORY_ROLE = "roles/artifactregistry.writer"


def build_account_resource(target: GcpTarget) -> str:
    """The build's ``serviceAccount`` field: ``projects/PROJECT/serviceAccounts/EMAIL``."""
    return service_account_path(target.project, target.build_service_account_email)


def _member(target: GcpTarget) -> str:
    return f"serviceAccount:{target.build_service_account_email}"


def ensure_build_service_account(target: GcpTarget) -> EnsureResult:
    """The build identity's service account (get, else create)."""
    return get_or_create_service_account(
        target,
        target.build_service_account_name,
        target.build_service_account_email,
        display_name="Image builds (hf-cloudrun-pipeline)",
        description="Cloud Build identity: reads build sources, writes build logs, pushes images",
    )


def grant_build_bucket_access(target: GcpTarget) -> EnsureResult:
    """Storage Admin for the build identity on the build bucket alone (what Cloud Build asks of a user-chosen build
    account's logs bucket); other members' bindings are left alone."""
    bucket = clients.storage(target).bucket(target.build_bucket_name)
    member = _member(target)

    def edit() -> list[str]:
        policy = bucket.get_iam_policy(requested_policy_version=3)
        role = BUILD_BUCKET_ROLE
        binding = next((b for b in policy.bindings if b["role"] == role and not b.get("condition")), None)
        if binding is not None and member in binding["members"]:
            return []
        if binding is None:
            policy.bindings.append({"role": role, "members": {member}})
        else:
            binding["members"].add(member)
        bucket.set_iam_policy(policy)  # carries the etag it was read with: a concurrent change retries
        return [f"granted {role}"]

    what = f"IAM policy of gs://{target.build_bucket_name}"
    with gcp_errors("storage", "roles/storage.admin", what, target):
        # A service account created moments ago is unknown to Cloud Storage until IAM has propagated it.
        changes = when_visible(POLICY_CONFLICT_RETRY(edit), target.build_service_account_email, "Cloud Storage")
    if changes:
        note_grant(target.build_service_account_email)  # the build right after waits for it to take effect
    return _result(f"gs://{target.build_bucket_name} {BUILD_BUCKET_ROLE} {member}", changes)


def remove_model_bucket_roles(target: GcpTarget) -> EnsureResult:
    """No role for the build identity on the model bucket: builds never touch weights. An earlier version granted
    objectViewer + objectCreator there; a run removes them (a read only, when there is nothing to remove)."""
    bucket = clients.storage(target).bucket(target.bucket_name)
    member = _member(target)

    def edit() -> list[str]:
        policy = bucket.get_iam_policy(requested_policy_version=3)
        held = [b for b in policy.bindings if member in b["members"]]
        if not held:
            return []
        for binding in held:
            binding["members"].discard(member)
        policy.bindings = [b for b in policy.bindings if b["members"]]
        bucket.set_iam_policy(policy)
        return [f"removed {b['role']}" for b in held]

    with gcp_errors("storage", "roles/storage.admin", f"IAM policy of gs://{target.bucket_name}", target):
        changes = POLICY_CONFLICT_RETRY(edit)()
    return _result(f"gs://{target.bucket_name} no role for {member}", changes)


def grant_build_repository_writer(target: GcpTarget) -> EnsureResult:
    """artifactregistry.writer for the build identity on the image repository (not the project)."""
    registry = clients.artifact_registry(target)
    name = repository_path(target)
    with gcp_errors("artifactregistry", "roles/artifactregistry.admin", f"IAM policy of {name}", target):
        changes = grant_to_new_account(
            registry, name, REPOSITORY_ROLE, target.build_service_account_email, "Artifact Registry"
        )
    if changes:
        # A build right after may push before the grant takes effect: it is run again meanwhile (builds.py).
        note_resource_grant(target.build_service_account_email, name)
    return _result(f"{name} {REPOSITORY_ROLE} {_member(target)}", changes)


def ensure_build_identity(target: GcpTarget) -> list[EnsureResult]:
    """The build account, Storage Admin on the build bucket, artifactregistry.writer on the repository, and no role
    on the model bucket; both buckets and the repository must exist."""
    return [
        ensure_build_service_account(target),
        grant_build_bucket_access(target),
        grant_build_repository_writer(target),
        remove_model_bucket_roles(target),
    ]


def delete_build_service_account(target: GcpTarget) -> EnsureResult:
    """The build identity (teardown with ``service_account``); its bindings go with it."""
    return delete_service_account(target, target.build_service_account_email)


def _result(name: str, changes: list[str]) -> EnsureResult:
    return EnsureResult(kind="iam", name=name, action="updated" if changes else "found", changes=changes)


# One task run per resource in the promotion's run graph (flows/promote.py), in ensure_build_identity's order.
iam_ensure_build_service_account = task(name="iam_ensure_build_service_account")(ensure_build_service_account)
gcs_grant_build_bucket_admin = task(name="gcs_grant_build_bucket_admin")(grant_build_bucket_access)
artifactregistry_grant_build_writer = task(name="artifactregistry_grant_build_writer")(grant_build_repository_writer)
gcs_revoke_build_model_bucket_roles = task(name="gcs_revoke_build_model_bucket_roles")(remove_model_bucket_roles)
BUILD_IDENTITY_TASKS = (
    iam_ensure_build_service_account,
    gcs_grant_build_bucket_admin,
    artifactregistry_grant_build_writer,
    gcs_revoke_build_model_bucket_roles,
)
iam_delete_build_service_account = task(name="iam_delete_build_service_account")(delete_build_service_account)
