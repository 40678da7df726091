"""What a Cloud Run revision depends on in other APIs: its image, service account, VPC, secrets and volumes.

Admission checks (image, service account, VPC) fail the request with 400 as Cloud Run does; secrets are
resolved when an instance starts, and a service account without access fails the revision
(SECRETS_ACCESS_CHECK_FAILED), with the message Cloud Run gives; a Cloud Storage volume whose bucket the account
cannot list never mounts (``unmountable_volume``: gcsfuse v3's GetStorageLayout failure); a read-write one is
written back only if the account may create objects under it (``may_write``).
"""

from __future__ import annotations

import uuid

from google.cloud import run_v2

from sandbox.authz import has_permission
from sandbox.control import ControlContext
from sandbox.control.errors import GoogleApiError, invalid_argument
from sandbox.control.run.images import GMP_COLLECTOR, GMP_SIDECAR_REPO, PUBLIC_REPOS, ImageBehaviour, image_behaviour


class RevisionStartError(Exception):
    """The revision cannot start for a reason Cloud Run reports before the container runs."""

    def __init__(self, message: str, reason: run_v2.Condition.CommonReason) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason


def _short(name: str) -> str:
    return name.rstrip("/").rsplit("/", 1)[-1]


def resolve_image(ctx: ControlContext, image: str) -> ImageBehaviour | None:
    """How the image starts, if it exists: public images the sandbox knows, or this project's registry."""
    behaviour = image_behaviour(image)
    if behaviour is None:
        return None
    registry = ctx.module("artifactregistry")
    is_public = image.startswith(PUBLIC_REPOS) or "docker.pkg.dev" not in image.split("/", 1)[0]
    if is_public or registry is None:
        return behaviour
    return behaviour if registry.find_image(image) is not None else None


def service_account_of(ctx: ControlContext, template: run_v2.RevisionTemplate) -> str:
    """The revision's identity: the template's, else the Compute Engine default account (as Cloud Run does)."""
    if template.service_account:
        return template.service_account
    iam = ctx.module("iam")
    return iam.compute_default_email if iam is not None else ""


def check_account_visible(ctx: ControlContext, account: str) -> None:
    """Cloud Run checks the deployer's iam.serviceaccounts.actAs on the account a revision or a job runs as; for an
    account IAM cannot see (missing, or created moments ago and not yet propagated) that check fails the same way,
    with "(or it may not exist)" (google/keyword_factory issue 22, GoogleCloudPlatform/cloud-run-release-manager
    issue 81, dora-team/fourkeys issue 459; terraform-provider-google issue 16350: a v2 service naming a new account
    fails the first apply and succeeds the second)."""
    iam = ctx.module("iam")
    if account and iam is not None and not iam.visible(account):
        raise GoogleApiError(
            403,
            f"Permission 'iam.serviceaccounts.actAs' denied on service account {account} (or it may not exist).",
            reason="forbidden",
        )


def check_dependencies(ctx: ControlContext, spec: run_v2.Service, region: str) -> None:
    template = spec.template
    several = len(template.containers) > 1
    for index, container in enumerate(template.containers):
        behaviour = resolve_image(ctx, container.image)
        if behaviour is None:
            raise invalid_argument(
                f"spec.template.spec.containers[{index}].image: Image '{container.image}' not found. Make sure the "
                "image exists and that the service agent can pull it."
            )
        if several and not container.ports and behaviour.kind != GMP_COLLECTOR:
            # Not Cloud Run's rule: the sandbox runs a vLLM stand-in per instance (the ingress container) and
            # emulates one sidecar, the Prometheus collector; anything else beside it would silently not run.
            raise invalid_argument(
                f"spec.template.spec.containers[{index}].image: the sandbox runs only the Managed Service for "
                f"Prometheus collector ({GMP_SIDECAR_REPO}) as a sidecar; '{container.image}' cannot run beside "
                "the ingress container here."
            )
    check_account_visible(ctx, template.service_account)
    compute = ctx.module("compute")
    if compute is None:
        return
    for interface in template.vpc_access.network_interfaces:
        if interface.network and compute.network(_short(interface.network)) is None:
            raise invalid_argument(
                f"spec.template.metadata.annotations[run.googleapis.com/network-interfaces]: VPC network "
                f"'{_short(interface.network)}' not found in project {ctx.config.project}."
            )
        if interface.subnetwork and compute.subnetwork(region, _short(interface.subnetwork)) is None:
            raise invalid_argument(
                f"spec.template.metadata.annotations[run.googleapis.com/network-interfaces]: subnetwork "
                f"'{_short(interface.subnetwork)}' not found in region {region}."
            )


def container_env(ctx: ControlContext, container: run_v2.Container, service_account: str) -> dict[str, str]:
    """Plain env values, plus secret env values resolved from Secret Manager with the revision's identity."""
    env = {e.name: e.value for e in container.env if not e.value_source}
    manager = ctx.module("secretmanager")
    for var in container.env:
        ref = var.value_source.secret_key_ref
        if not ref.secret:
            continue
        version = ref.version or "latest"
        secret = (
            ref.secret if ref.secret.startswith("projects/") else f"projects/{ctx.config.project}/secrets/{ref.secret}"
        )
        path = f"{secret}/versions/{version}"
        if manager is None or not manager.exists(secret):
            raise RevisionStartError(
                f"Secret {path} was not found", run_v2.Condition.CommonReason.SECRETS_ACCESS_CHECK_FAILED
            )
        # The revision's account reads the secret as any principal would: through the project's and the secret's
        # policies, a grant counting once it has propagated (sandbox.authz.propagation).
        if not has_permission(ctx, f"serviceAccount:{service_account}", "secretmanager.versions.access", secret):
            raise RevisionStartError(
                f"Permission denied on secret: {path} for Revision service account {service_account}. The service "
                "account used must be granted the 'Secret Manager Secret Accessor' role "
                "(roles/secretmanager.secretAccessor) at the secret, project or higher level.",
                run_v2.Condition.CommonReason.SECRETS_ACCESS_CHECK_FAILED,
            )
        value = manager.value(secret, version)
        if value is None:
            raise RevisionStartError(
                f"Secret {path} has no enabled version", run_v2.Condition.CommonReason.SECRETS_ACCESS_CHECK_FAILED
            )
        env[var.name] = value.decode()
    return env


def unmountable_volume(ctx: ControlContext, mounts: list[dict], service_account: str) -> str | None:
    """gcsfuse's error for the first Cloud Storage volume the revision's account cannot mount, else None.

    Cloud Run mounts Cloud Storage volumes with gcsfuse v3 (3.11.2 in 2026: a Cloud Run mount failure quoted in
    sunholo-data/ailang's design notes, CSI driver gcsfuse.run.googleapis.com). Its mount no longer lists the bucket
    (pre-v3's "SetUpBucket: Error in iterating through objects: ... does not have storage.objects.list access"): it
    first asks the Storage Control API for the bucket's layout, and that call fails the mount. At v3.11.2:
    ``internal/storage/storage_handle.go`` (``BucketHandle``: "storageLayout call failed: %s"; ``getStorageLayout``
    names ``projects/_/buckets/B/storageLayout``), ``internal/storage/storageutil/retry.go`` (the retry wrapper's
    "%s for %q failed: InvocationID: %s, Attempt: %d, with error: %w"; a PermissionDenied is not retried,
    ``custom_retry.go``), wrapped by ``internal/gcsx/bucket_manager.go`` ("BucketHandle: "), ``internal/fs/fs.go``
    ("SetUpBucket: "), ``internal/fs/server.go`` ("create file system: "), ``cmd/mount.go`` ("fs.NewServer: ") and
    ``cmd/legacy_main.go`` ("mountWithStorageHandle: "), printed by cobra as "Error: <err>" (``cmd/root.go`` leaves
    SilenceErrors unset; the Cloud Run log line quoted begins "Error: mountWithStorageHandle: fs.NewServer: ...").
    GetStorageLayout needs storage.objects.list on the bucket (Cloud Storage docs, "Get the storage layout"), so
    the check is that permission. Unconfirmed: the gRPC status text (``desc``) Cloud Storage gives, here the
    generic PERMISSION_DENIED "The caller does not have permission": it names neither the account nor the
    permission. Nothing retries it (v3.11.2's hidden ``enable-mount-retries``, "IAM propagation delays ... Intended
    specifically for the GKE GCSFuse CSI Driver", defaults to false and is not wired yet). The account's grant counts
    once it has propagated (sandbox.authz.propagation), so a revision deployed right after its account was granted
    the bucket fails too.
    """
    for mount in mounts:
        bucket = mount["bucket"]
        if not has_permission(ctx, f"serviceAccount:{service_account}", "storage.objects.list",
                              f"projects/_/buckets/{bucket}"):  # fmt: skip
            return (
                "Error: mountWithStorageHandle: fs.NewServer: create file system: SetUpBucket: BucketHandle: "
                "storageLayout call failed: GetStorageLayout for "
                f'"projects/_/buckets/{bucket}/storageLayout" failed: InvocationID: {uuid.uuid4()}, Attempt: 1, with '
                "error: rpc error: code = PermissionDenied desc = The caller does not have permission"
            )
    return None


def may_write(ctx: ControlContext, service_account: str, bucket: str, only_dir: str | None) -> bool:
    """Whether the revision's account may create objects where its read-write volume shows them: under ``only_dir``
    (an object in that folder), else anywhere in the bucket (the bucket itself).

    gcsfuse writes a file to the bucket as the account (storage.objects.create on the object: Cloud Storage docs,
    "IAM permissions for JSON methods", objects.insert), so a grant limited by an object-name condition to the
    folder (sandbox.authz.conditions) is enough, and the grant counts once it has propagated
    (sandbox.authz.propagation), as every other check of the account's access does.
    """
    base = (only_dir or "").strip("/")
    resource = f"projects/_/buckets/{bucket}" + (f"/objects/{base}/" if base else "")
    return has_permission(ctx, f"serviceAccount:{service_account}", "storage.objects.create", resource)
