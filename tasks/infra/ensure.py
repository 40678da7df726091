"""Get-or-create for what a served model needs: bucket, Artifact Registry, VPC and subnet, service account, secret.

Each step reads first and writes only what is missing or wrong, so a second run makes no write call (the
codelab in seed 004 does the same by hand with gcloud). Each returns an EnsureResult saying whether it
created, found or repaired the resource. A create that loses a race (409) reads the winner's resource and checks
it as it would a found one (the service account has nothing to check: it reports "found").
"""

from __future__ import annotations

import google_crc32c
from google.api_core import exceptions as gexc
from google.cloud import artifactregistry_v1, compute_v1, secretmanager_v1
from google.cloud import storage as gcs
from google.protobuf import field_mask_pb2
from prefect import task
from pydantic import SecretStr

from blocks.source import ModelSource
from blocks.target import GcpTarget
from tasks.common import clients
from tasks.common.gcp import GCP_RETRY, EnsureResult, InfraError, gcp_errors, wait_for, with_retry

PUBLIC_MEMBERS = {"allUsers", "allAuthenticatedUsers"}
SCANNING_ON = artifactregistry_v1.Repository.VulnerabilityScanningConfig.EnablementConfig.INHERITED


# Bucket ------------------------------------------------------------------------------------------------------
def ensure_bucket(target: GcpTarget) -> EnsureResult:
    """The model bucket: single region = the service's, uniform access, public access prevention, labels."""
    return ensure_regional_bucket(target, target.bucket_name, "bucket", "model weights")


def ensure_build_bucket(target: GcpTarget) -> EnsureResult:
    """The build bucket (Cloud Build sources and logs), kept apart from the model bucket: the build identity
    administers it (tasks/infra/build_identity.py). Same region and settings as the model bucket."""
    return ensure_regional_bucket(target, target.build_bucket_name, "build_bucket", "build sources and logs")


def ensure_regional_bucket(target: GcpTarget, name: str, field: str, holds: str) -> EnsureResult:
    """The bucket ``name`` (GcpTarget field ``field``; ``holds`` says what it stores, for errors): single region =
    the service's, uniform access, public access prevention, labels. A found one is checked and repaired; a wrong
    region or public members are an error."""
    storage = clients.storage(target)
    with gcp_errors("storage", "roles/storage.admin", f"bucket gs://{name}", target):
        try:
            bucket = storage.get_bucket(name)
        except gexc.NotFound:
            return _create_bucket(storage, target, name, field, holds)
        return _check_bucket(bucket, target, field, holds)


def _create_bucket(storage: gcs.Client, target: GcpTarget, name: str, field: str, holds: str) -> EnsureResult:
    bucket = storage.bucket(name)
    bucket.iam_configuration.uniform_bucket_level_access_enabled = True
    bucket.iam_configuration.public_access_prevention = "enforced"
    bucket.labels = dict(target.labels)
    try:
        storage.create_bucket(bucket, location=target.region)
    except gexc.Conflict:
        try:
            return _check_bucket(storage.get_bucket(name), target, field, holds)  # created by a concurrent run
        except (gexc.Forbidden, gexc.NotFound):
            raise InfraError(
                f"bucket name gs://{name} is taken by another project (bucket names are global); "
                f"set GcpTarget.{field} to another name"
            ) from None
    return EnsureResult(kind="bucket", name=f"gs://{name}", action="created")


def _check_bucket(bucket: gcs.Bucket, target: GcpTarget, field: str, holds: str) -> EnsureResult:
    name = f"gs://{bucket.name}"
    if (bucket.location or "").upper() != target.region.upper() or bucket.location_type != "region":
        raise InfraError(
            f"bucket {name} is in {bucket.location} ({bucket.location_type}), the service in {target.region}: "
            f"{holds} must sit in the service's own single region (lesson 18); set GcpTarget.{field} to a new "
            "name and the pipeline creates it there"
        )
    policy = bucket.get_iam_policy(requested_policy_version=3)
    public = sorted({m for b in policy.bindings for m in b["members"]} & PUBLIC_MEMBERS)
    if public:
        raise InfraError(
            f"bucket {name} is public ({', '.join(public)} in its IAM policy); {holds} must not be: remove "
            f"those members, or point GcpTarget.{field} at a private bucket"
        )
    changes = []
    if not bucket.iam_configuration.uniform_bucket_level_access_enabled:
        bucket.iam_configuration.uniform_bucket_level_access_enabled = True
        changes.append("uniform bucket-level access turned on")
    if bucket.iam_configuration.public_access_prevention != "enforced":
        bucket.iam_configuration.public_access_prevention = "enforced"
        changes.append("public access prevention enforced")
    missing = {k: v for k, v in target.labels.items() if (bucket.labels or {}).get(k) != v}
    if missing:
        bucket.labels = {**(bucket.labels or {}), **missing}
        changes.append(f"labels set: {', '.join(sorted(missing))}")
    if changes:
        bucket.patch(if_metageneration_match=bucket.metageneration)  # retried on 429/5xx only when conditional
        return EnsureResult(kind="bucket", name=name, action="updated", changes=changes)
    return EnsureResult(kind="bucket", name=name, action="found")


# Artifact Registry -------------------------------------------------------------------------------------------
def repository_path(target: GcpTarget) -> str:
    return f"{target.location_path}/repositories/{target.artifact_repository}"


def ensure_artifact_registry(target: GcpTarget) -> EnsureResult:
    """A Docker repository in the region with vulnerability scanning on (lesson 17) and the target's labels."""
    registry = clients.artifact_registry(target)
    name = repository_path(target)
    with gcp_errors("artifactregistry", "roles/artifactregistry.admin", f"repository {name}", target):
        try:
            repository = registry.get_repository(name=name, retry=GCP_RETRY)
        except gexc.NotFound:
            wanted = artifactregistry_v1.Repository(
                format_=artifactregistry_v1.Repository.Format.DOCKER,
                description="vLLM images for Cloud Run (hf-cloudrun-pipeline)",
                labels=dict(target.labels),
                vulnerability_scanning_config=artifactregistry_v1.Repository.VulnerabilityScanningConfig(
                    enablement_config=SCANNING_ON
                ),
            )
            try:
                operation = registry.create_repository(
                    parent=target.location_path,
                    repository=wanted,
                    repository_id=target.artifact_repository,
                    retry=GCP_RETRY,
                )
                wait_for(operation, clients.operation_polling(target))
            except gexc.Conflict:
                return ensure_artifact_registry(target)  # a concurrent run created it: check it as found
            return EnsureResult(kind="artifact-registry", name=name, action="created")
        if repository.format_ != artifactregistry_v1.Repository.Format.DOCKER:
            raise InfraError(
                f"repository {name} exists with format {repository.format_.name}, not DOCKER; set "
                "GcpTarget.artifact_repository to another name"
            )
        changes, paths = [], []
        if repository.vulnerability_scanning_config.enablement_config != SCANNING_ON:
            repository.vulnerability_scanning_config.enablement_config = SCANNING_ON
            changes.append("vulnerability scanning turned on")
            paths.append("vulnerability_scanning_config")
        missing = {k: v for k, v in target.labels.items() if repository.labels.get(k) != v}
        if missing:
            repository.labels.update(missing)
            changes.append(f"labels set: {', '.join(sorted(missing))}")
            paths.append("labels")
        if not changes:
            return EnsureResult(kind="artifact-registry", name=name, action="found")
        registry.update_repository(
            repository=repository, update_mask=field_mask_pb2.FieldMask(paths=paths), retry=GCP_RETRY
        )
        return EnsureResult(kind="artifact-registry", name=name, action="updated", changes=changes)


# Network -----------------------------------------------------------------------------------------------------
def wait_global_operation(target: GcpTarget, operation: compute_v1.Operation, what: str) -> None:
    operations = clients.compute_global_operations(target)
    while operation.status != compute_v1.Operation.Status.DONE:
        operation = operations.wait(project=target.project, operation=operation.name, retry=GCP_RETRY)
    _raise_operation_error(operation, what)


def wait_region_operation(target: GcpTarget, operation: compute_v1.Operation, what: str) -> None:
    operations = clients.compute_region_operations(target)
    while operation.status != compute_v1.Operation.Status.DONE:
        operation = operations.wait(
            project=target.project, region=target.region, operation=operation.name, retry=GCP_RETRY
        )
    _raise_operation_error(operation, what)


def _raise_operation_error(operation: compute_v1.Operation, what: str) -> None:
    if operation.error and operation.error.errors:
        details = "; ".join(e.message for e in operation.error.errors)
        raise InfraError(f"{what} failed: {details}")


def ensure_network(target: GcpTarget) -> EnsureResult:
    """A custom-mode VPC with regional routing for Direct VPC egress (lesson 15)."""
    networks = clients.compute_networks(target)
    name = f"projects/{target.project}/global/networks/{target.network}"
    with gcp_errors("compute", "roles/compute.networkAdmin", f"network {target.network}", target):
        try:
            network = networks.get(project=target.project, network=target.network, retry=GCP_RETRY)
        except gexc.NotFound:
            resource = compute_v1.Network(
                name=target.network,
                auto_create_subnetworks=False,
                routing_config=compute_v1.NetworkRoutingConfig(routing_mode="REGIONAL"),
                description="Direct VPC egress for vLLM on Cloud Run (hf-cloudrun-pipeline)",
            )
            try:
                operation = networks.insert_unary(project=target.project, network_resource=resource, retry=GCP_RETRY)
            except gexc.Conflict:
                return ensure_network(target)  # a concurrent run created it: check it as found
            wait_global_operation(target, operation, f"creating network {target.network}")
            return EnsureResult(kind="network", name=name, action="created")
        if network.auto_create_subnetworks:
            raise InfraError(
                f"network {target.network} is in auto mode (a subnet in every region, fixed ranges); use a "
                "custom-mode network: set GcpTarget.network to a new name and the pipeline creates one"
            )
        return EnsureResult(kind="network", name=name, action="found")


def ensure_subnet(target: GcpTarget) -> EnsureResult:
    """The subnet with the target's range and Private Google Access on (turned on if it was off)."""
    subnetworks = clients.compute_subnetworks(target)
    name = f"projects/{target.project}/regions/{target.region}/subnetworks/{target.subnet}"
    network_link = f"projects/{target.project}/global/networks/{target.network}"
    with gcp_errors("compute", "roles/compute.networkAdmin", f"subnet {target.subnet}", target):
        try:
            subnet = subnetworks.get(
                project=target.project, region=target.region, subnetwork=target.subnet, retry=GCP_RETRY
            )
        except gexc.NotFound:
            return _create_subnet(target, subnetworks, name, network_link)
        if not subnet.network.endswith(network_link):
            raise InfraError(
                f"subnet {target.subnet} belongs to {subnet.network.rsplit('/', 1)[-1]}, not {target.network}; set "
                "GcpTarget.subnet to another name"
            )
        if subnet.ip_cidr_range != target.subnet_range:
            raise InfraError(
                f"subnet {target.subnet} exists with range {subnet.ip_cidr_range}, GcpTarget.subnet_range says "
                f"{target.subnet_range}; set subnet_range to {subnet.ip_cidr_range} or use another subnet name"
            )
        if subnet.private_ip_google_access:
            return EnsureResult(kind="subnet", name=name, action="found")
        operation = subnetworks.set_private_ip_google_access_unary(
            project=target.project,
            region=target.region,
            subnetwork=target.subnet,
            subnetworks_set_private_ip_google_access_request_resource=(
                compute_v1.SubnetworksSetPrivateIpGoogleAccessRequest(private_ip_google_access=True)
            ),
            retry=GCP_RETRY,
        )
        wait_region_operation(target, operation, f"turning on Private Google Access on {target.subnet}")
        return EnsureResult(kind="subnet", name=name, action="updated", changes=["Private Google Access turned on"])


def _create_subnet(target: GcpTarget, subnetworks, name: str, network_link: str) -> EnsureResult:
    resource = compute_v1.Subnetwork(
        name=target.subnet,
        network=network_link,
        ip_cidr_range=target.subnet_range,
        region=target.region,
        private_ip_google_access=True,
        description="Direct VPC egress for vLLM on Cloud Run (hf-cloudrun-pipeline)",
    )
    try:
        operation = subnetworks.insert_unary(
            project=target.project, region=target.region, subnetwork_resource=resource, retry=GCP_RETRY
        )
    except gexc.Conflict:
        return ensure_subnet(target)  # a concurrent run created it: check its range and access as found
    except gexc.BadRequest as exc:
        if "conflicts with" in exc.message:
            raise InfraError(
                f"subnet_range {target.subnet_range} overlaps another subnet of network {target.network}: "
                f"{exc.message.split(': ', 1)[-1]} Choose a free range for GcpTarget.subnet_range"
            ) from None
        raise
    wait_region_operation(target, operation, f"creating subnet {target.subnet}")
    return EnsureResult(kind="subnet", name=name, action="created")


# Service account ---------------------------------------------------------------------------------------------
def iam_call(target: GcpTarget, method: str, path: str, body: dict | None = None) -> dict:
    """One IAM REST call (iam_admin_v1 has no REST transport), errors mapped like the client libraries'."""
    rest = clients.iam(target)

    def call() -> dict:
        response = rest.session.request(method, rest.url(path), json=body, timeout=60)
        if response.status_code >= 400:
            raise gexc.from_http_response(response)
        return response.json() if response.content else {}

    return with_retry(call)


def service_account_path(project: str, email: str) -> str:
    """The IAM resource name of a service account: ``projects/PROJECT/serviceAccounts/EMAIL``."""
    return f"projects/{project}/serviceAccounts/{email}"


def get_or_create_service_account(
    target: GcpTarget, account_id: str, email: str, display_name: str, description: str
) -> EnsureResult:
    """The service account ``email`` in the target's project: found, else created as ``account_id`` (a concurrent
    creation counts as found)."""
    with gcp_errors("iam", "roles/iam.serviceAccountAdmin", f"service account {email}", target):
        try:
            iam_call(target, "GET", service_account_path(target.project, email))
            return EnsureResult(kind="service-account", name=email, action="found")
        except gexc.NotFound:
            pass
        try:
            iam_call(
                target,
                "POST",
                f"projects/{target.project}/serviceAccounts",
                {"accountId": account_id, "serviceAccount": {"displayName": display_name, "description": description}},
            )
        except gexc.Conflict:
            return EnsureResult(kind="service-account", name=email, action="found")
    return EnsureResult(kind="service-account", name=email, action="created")


def ensure_service_account(target: GcpTarget) -> EnsureResult:
    """A dedicated service account for the service (never the Compute default one, lesson 19)."""
    return get_or_create_service_account(
        target,
        target.service_account_name,
        target.service_account_email,
        display_name="vLLM serving (hf-cloudrun-pipeline)",
        description="Runs Cloud Run services that serve Hugging Face models with vLLM",
    )


# Secret Manager ----------------------------------------------------------------------------------------------
def secret_path(target: GcpTarget, secret_id: str | None = None) -> str:
    return f"projects/{target.project}/secrets/{secret_id or target.hf_token_secret}"


def regional_replication(target: GcpTarget) -> secretmanager_v1.Replication:
    """The token's payload kept in the service's region only. Automatic replication creates the secret in
    ``global``, which organizations restricting ``gcp.resourceLocations`` refuse ("Constraint
    constraints/gcp.resourceLocations violated ... attempting to create a secret in [global]", firebase-tools
    issue 6454; terraform-dynamic-python-webapp PR 118 switched to user-managed replication for it)."""
    replica = secretmanager_v1.Replication.UserManaged.Replica(location=target.region)
    return secretmanager_v1.Replication(user_managed=secretmanager_v1.Replication.UserManaged(replicas=[replica]))


def ensure_secret(target: GcpTarget, value: SecretStr, secret_id: str | None = None) -> EnsureResult:
    """The secret with ``value`` as its latest version; a version is added only when the value changed."""
    manager = clients.secret_manager(target)
    name = secret_path(target, secret_id)
    created = False
    with gcp_errors("secretmanager", "roles/secretmanager.admin", f"secret {name}", target):
        try:
            manager.get_secret(name=name, retry=GCP_RETRY)
        except gexc.NotFound:
            try:
                manager.create_secret(
                    parent=f"projects/{target.project}",
                    secret_id=name.rsplit("/", 1)[1],
                    secret=secretmanager_v1.Secret(
                        replication=regional_replication(target), labels=dict(target.labels)
                    ),
                    retry=GCP_RETRY,
                )
                created = True
            except gexc.Conflict:
                pass
        data = value.get_secret_value().encode()
        if not created:
            try:
                current = manager.access_secret_version(name=f"{name}/versions/latest", retry=GCP_RETRY).payload.data
            except gexc.NotFound:
                current = None  # no version yet
            except gexc.BadRequest as exc:  # FAILED_PRECONDITION arrives as HTTP 400 over REST
                if "state" not in exc.message:
                    raise
                current = None  # the latest version is disabled or destroyed
            if current == data:
                return EnsureResult(kind="secret", name=name, action="found")
        manager.add_secret_version(
            parent=name,
            payload=secretmanager_v1.SecretPayload(data=data, data_crc32c=google_crc32c.value(data)),
            retry=GCP_RETRY,
        )
    return EnsureResult(
        kind="secret", name=name, action="created" if created else "updated", changes=[] if created else ["new version"]
    )


gcs_ensure_bucket = task(name="gcs_ensure_bucket")(ensure_bucket)
gcs_ensure_build_bucket = task(name="gcs_ensure_build_bucket")(ensure_build_bucket)
artifactregistry_ensure_repository = task(name="artifactregistry_ensure_repository")(ensure_artifact_registry)
compute_ensure_network = task(name="compute_ensure_network")(ensure_network)
compute_ensure_subnet = task(name="compute_ensure_subnet")(ensure_subnet)
iam_ensure_service_account = task(name="iam_ensure_service_account")(ensure_service_account)


@task(name="secretmanager_ensure_hf_token")
def secretmanager_ensure_hf_token(
    target: GcpTarget, source: ModelSource, token_secret_block: str | None = None
) -> EnsureResult:
    """Store the Hub token in Secret Manager (for builds or services that need it at run time).

    The value is read inside the task from the Prefect Secret block (or HF_TOKEN), so it never becomes a
    task parameter; a new version is added only when it changed.
    """
    token = clients.hub_token(source, token_secret_block)
    if token is None:
        raise InfraError(
            f"no Hub token to store for {source.repo_id}: name a Prefect Secret block in "
            "ModelSource.token_secret_block (or set HF_TOKEN on the worker)"
        )
    return ensure_secret(target, token)
