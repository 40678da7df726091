"""Teardown counterparts of the ensure steps (lesson 14: idle GPUs and forgotten resources cost money).

Each deletes one resource and tolerates its absence, so a teardown can run twice or after a partial one.
The flow calls them in dependency order: service, subnet, network, service account, and the bucket (with the
staged weights in it), the build bucket and the Artifact Registry repository (with its images) only when asked; a
service's run reports (reports/<service>/) only when asked, and never another service's.
"""

from __future__ import annotations

import contextlib

from google.api_core import exceptions as gexc
from prefect import task

from blocks.target import GcpTarget
from tasks.common import clients
from tasks.common.gcp import GCP_RETRY, EnsureResult, InfraError, gcp_errors, wait_for
from tasks.common.naming import COMPILE_CACHE_PREFIX as CACHE_PREFIX
from tasks.common.naming import REPORTS_PREFIX, SERVICE_ID, reports_prefix
from tasks.infra.ensure import (
    iam_call,
    repository_path,
    secret_path,
    service_account_path,
    wait_global_operation,
    wait_region_operation,
)
from tasks.infra.shared_use import TargetUsage
from tasks.infra.subnet_hold import holder_of, subnet_hold

# Cloud Run's rule for a service id (FACTS.md "Names"): preflight's SERVICE_ID pattern, and "It must begin with
# letter, and cannot end with hyphen; must contain fewer than 50 characters" (serviceId,
# https://cloud.google.com/run/docs/reference/rest/v2/projects.locations.services/create). Not preflight's 46-
# character limit: that one leaves room for the candidate tag of a service we create; a teardown must reach any.
SERVICE_ID_MAX = 49


def check_service_name(service_id: str) -> None:
    """Refuse a name no Cloud Run service can have: the teardown would find nothing under it and report the
    service "absent", while the service the user meant (a typo, or its URL pasted) keeps running and costing."""
    if SERVICE_ID.fullmatch(service_id) and len(service_id) <= SERVICE_ID_MAX:  # fullmatch: no trailing newline
        return
    raise ValueError(
        f"service: {service_id!r} cannot be a Cloud Run service name (lowercase letters, digits and hyphens, starting "
        f"with a letter, not ending with a hyphen, at most {SERVICE_ID_MAX} characters), so there is nothing to tear "
        "down under it; pass the service's name as `gcloud run services list` shows it (not its URL or the model id)"
    )


def delete_service(target: GcpTarget, service_id: str) -> EnsureResult:
    """The Cloud Run service with all its revisions (its URLs stop answering)."""
    name = f"{target.location_path}/services/{service_id}"
    services = clients.run_services(target)
    with gcp_errors("run", "roles/run.admin", f"deleting service {service_id}", target):
        try:
            wait_for(services.delete_service(name=name, retry=GCP_RETRY), clients.operation_polling(target))
        except gexc.NotFound:
            return EnsureResult(kind="service", name=name, action="absent")
    return EnsureResult(kind="service", name=name, action="deleted")


def delete_subnet(target: GcpTarget) -> EnsureResult:
    """The Direct VPC egress subnet; while Cloud Run still holds IPs in it, a ``held`` result that says what holds
    it and when to retry (tasks/infra/subnet_hold.py) instead of an error."""
    name = f"projects/{target.project}/regions/{target.region}/subnetworks/{target.subnet}"
    subnetworks = clients.compute_subnetworks(target)
    with gcp_errors("compute", "roles/compute.networkAdmin", f"deleting subnet {target.subnet}", target):
        try:
            operation = subnetworks.delete_unary(
                project=target.project, region=target.region, subnetwork=target.subnet, retry=GCP_RETRY
            )
        except gexc.NotFound:
            return EnsureResult(kind="subnet", name=name, action="absent")
        except gexc.BadRequest as exc:
            if (holder := holder_of(exc)) is None:
                raise
            return subnet_hold(target, holder)
        wait_region_operation(target, operation, f"deleting subnet {target.subnet}")
    return EnsureResult(kind="subnet", name=name, action="deleted")


def delete_network(target: GcpTarget) -> EnsureResult:
    name = f"projects/{target.project}/global/networks/{target.network}"
    networks = clients.compute_networks(target)
    with gcp_errors("compute", "roles/compute.networkAdmin", f"deleting network {target.network}", target):
        try:
            operation = networks.delete_unary(project=target.project, network=target.network, retry=GCP_RETRY)
        except gexc.NotFound:
            return EnsureResult(kind="network", name=name, action="absent")
        except gexc.BadRequest as exc:
            raise InfraError(
                f"network {target.network} is still in use ({exc.message}); delete what uses it first"
            ) from None
        wait_global_operation(target, operation, f"deleting network {target.network}")
    return EnsureResult(kind="network", name=name, action="deleted")


def delete_service_account(target: GcpTarget, email: str | None = None) -> EnsureResult:
    """The service account ``email`` (the serving account by default); its bindings go with it."""
    email = email or target.service_account_email
    with gcp_errors("iam", "roles/iam.serviceAccountAdmin", f"deleting {email}", target):
        try:
            iam_call(target, "DELETE", service_account_path(target.project, email))
        except gexc.NotFound:
            return EnsureResult(kind="service-account", name=email, action="absent")
    return EnsureResult(kind="service-account", name=email, action="deleted")


def delete_secret(target: GcpTarget, secret_id: str | None = None) -> EnsureResult:
    name = secret_path(target, secret_id)
    manager = clients.secret_manager(target)
    with gcp_errors("secretmanager", "roles/secretmanager.admin", f"deleting {name}", target):
        try:
            manager.delete_secret(name=name, retry=GCP_RETRY)
        except gexc.NotFound:
            return EnsureResult(kind="secret", name=name, action="absent")
    return EnsureResult(kind="secret", name=name, action="deleted")


def delete_bucket(target: GcpTarget, bucket_name: str | None = None) -> EnsureResult:
    """A bucket and every object in it: the model bucket with its staged weights (the default; only when the
    teardown is asked to drop weights), or the build bucket with its build sources and logs."""
    bucket_name = bucket_name or target.bucket_name
    name = f"gs://{bucket_name}"
    storage = clients.storage(target)
    with gcp_errors("storage", "roles/storage.admin", f"deleting {name}", target):
        try:
            bucket = storage.get_bucket(bucket_name)
        except gexc.NotFound:
            return EnsureResult(kind="bucket", name=name, action="absent")
        blobs = list(storage.list_blobs(bucket))
        for blob in blobs:
            with contextlib.suppress(gexc.NotFound):  # deleted meanwhile
                blob.delete()
        try:
            bucket.delete()
        except gexc.NotFound:
            return EnsureResult(kind="bucket", name=name, action="absent")
    return EnsureResult(kind="bucket", name=name, action="deleted", changes=[f"{len(blobs)} objects deleted"])


def delete_artifact_repository(target: GcpTarget) -> EnsureResult:
    """The Artifact Registry repository with every image in it (built serving images: the next promotion that
    builds rebuilds them). Deleting it is an operation; a repository already gone is ``absent``.

    repositories.delete "Deletes a repository and all of its contents. The returned Operation will finish once the
    repository has been deleted" and needs artifactregistry.repositories.delete, which of the predefined roles only
    roles/artifactregistry.admin holds (not repoAdmin)
    (https://cloud.google.com/artifact-registry/docs/reference/rest/v1/projects.locations.repositories/delete,
    https://cloud.google.com/artifact-registry/docs/repositories/delete-repos).
    """
    name = repository_path(target)
    registry = clients.artifact_registry(target)
    with gcp_errors("artifactregistry", "roles/artifactregistry.admin", f"deleting repository {name}", target):
        try:
            wait_for(registry.delete_repository(name=name, retry=GCP_RETRY), clients.operation_polling(target))
        except gexc.NotFound:
            return EnsureResult(kind="artifact-registry", name=name, action="absent")
    return EnsureResult(kind="artifact-registry", name=name, action="deleted")


def kept(kind: str, name: str, users: list[str], how: str) -> EnsureResult:
    """A shared resource the teardown leaves alone: other services use it (``how``, e.g. "their identity")."""
    them = "that service" if len(users) == 1 else "those services"
    why = f"in use by {', '.join(users)} ({how}); tear {them} down first to delete it"
    return EnsureResult(kind=kind, name=name, action="kept", changes=[why])


def delete_staged_weights(target: GcpTarget, usage: TargetUsage) -> EnsureResult:
    """The staged commits this service's revisions read, except those another service reads too; then the bucket,
    if nothing is left in it and no other service uses it. Commits staged for no service (a promotion staging now,
    one that failed) are not this service's: they stay, and so does the bucket that holds them."""
    bucket_name = target.bucket_name
    name = f"gs://{bucket_name}"
    storage = clients.storage(target)
    with gcp_errors("storage", "roles/storage.admin", f"deleting staged weights in {name}", target):
        bucket = storage.lookup_bucket(bucket_name)
        if bucket is None:
            return EnsureResult(kind="bucket", name=name, action="absent")
        changes, deleted = [], 0
        for _, prefix in sorted(p for p in usage.own.staged | usage.own.caches if p[0] == bucket_name):
            if users := usage.staged_users(bucket_name, prefix):
                changes.append(f"kept {name}/{prefix}: {', '.join(users)} serve it too")
                continue
            blobs = list(storage.list_blobs(bucket, prefix=f"{prefix}/"))
            for blob in blobs:
                with contextlib.suppress(gexc.NotFound):  # deleted meanwhile
                    blob.delete()
            deleted += len(blobs)
            changes.append(f"deleted {name}/{prefix} ({len(blobs)} objects)")
        if users := usage.users("buckets", bucket_name):
            return EnsureResult(kind="bucket", name=name, action="kept",
                                changes=[*changes, f"the bucket: {', '.join(users)} mount it"])  # fmt: skip
        if left := _left_in_bucket(storage, bucket):
            return EnsureResult(kind="bucket", name=name, action="kept", changes=[*changes, *left])
        with contextlib.suppress(gexc.NotFound):
            bucket.delete()
    return EnsureResult(kind="bucket", name=name, action="deleted", changes=[*changes, f"{deleted} objects deleted"])


def _left_in_bucket(storage, bucket) -> list[str]:
    """Why the bucket stays once this service's weights are gone: what is left in it, each with what to do."""
    listing = storage.list_blobs(bucket, delimiter="/")
    loose = [blob.name for blob in listing]  # objects at the top (consumes the pages, which fills .prefixes)
    top = set(listing.prefixes)
    reasons = []
    if top - {f"{REPORTS_PREFIX}/", f"{CACHE_PREFIX}/"} or loose:
        reasons.append("the bucket: it holds weights staged for no service (a promotion staging now, or one that "
                       "failed); delete them by hand if they are not needed")  # fmt: skip
    if f"{CACHE_PREFIX}/" in top:
        reasons.append(f"the bucket: it holds compile caches under {CACHE_PREFIX}/ that no torn-down revision wrote "
                       "(another service's, or an older configuration's); delete them by hand if they are not needed: "
                       f"`gcloud storage rm -r gs://{bucket.name}/{CACHE_PREFIX}/`")  # fmt: skip
    if f"{REPORTS_PREFIX}/" in top:
        services = storage.list_blobs(bucket, prefix=f"{REPORTS_PREFIX}/", delimiter="/")
        list(services)
        names = sorted(p.removeprefix(f"{REPORTS_PREFIX}/").rstrip("/") for p in services.prefixes)
        reasons.append(
            f"the bucket: it holds the run reports of {', '.join(names)} under {REPORTS_PREFIX}/ (their history, "
            "kept by default); tear each down with `reports` to delete its own, or delete them by hand: "
            f"`gcloud storage rm -r gs://{bucket.name}/{REPORTS_PREFIX}/`"
        )
    return reasons


def delete_reports(target: GcpTarget, service_id: str) -> EnsureResult:
    """This service's run reports (gs://BUCKET/reports/<service>/, tasks/report/archive.py) and nothing else: another
    service's reports are its own history. The bucket itself stays (the staged weights' teardown decides on it)."""
    prefix = reports_prefix(service_id)
    name = f"gs://{target.bucket_name}/{prefix}"
    storage = clients.storage(target)
    with gcp_errors("storage", "roles/storage.admin", f"deleting the reports in {name}", target):
        bucket = storage.lookup_bucket(target.bucket_name)
        blobs = list(storage.list_blobs(bucket, prefix=prefix)) if bucket is not None else []
        for blob in blobs:
            with contextlib.suppress(gexc.NotFound):  # deleted meanwhile
                blob.delete()
    if not blobs:
        return EnsureResult(kind="reports", name=name, action="absent")
    return EnsureResult(kind="reports", name=name, action="deleted", changes=[f"{len(blobs)} objects deleted"])


run_delete_service = task(name="run_delete_service")(delete_service)
compute_delete_subnet = task(name="compute_delete_subnet")(delete_subnet)
compute_delete_network = task(name="compute_delete_network")(delete_network)
iam_delete_service_account = task(name="iam_delete_service_account")(delete_service_account)
secretmanager_delete_secret = task(name="secretmanager_delete_secret")(delete_secret)
gcs_delete_staged_weights = task(name="gcs_delete_staged_weights")(delete_staged_weights)
artifactregistry_delete_repository = task(name="artifactregistry_delete_repository")(delete_artifact_repository)
gcs_delete_reports = task(name="gcs_delete_reports")(delete_reports)


@task(name="gcs_delete_build_bucket")
def gcs_delete_build_bucket(target: GcpTarget) -> EnsureResult:
    """The build bucket with its build sources and logs (teardown ``build_bucket``); images stay in the registry."""
    return delete_bucket(target, target.build_bucket_name)
