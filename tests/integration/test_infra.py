"""Infrastructure get-or-create, least-privilege IAM and teardown against the sandbox, with the real clients."""

from __future__ import annotations

import itertools
import json

import pytest
from google.api_core.exceptions import BadRequest, Forbidden, NotFound
from google.cloud import compute_v1, run_v2, secretmanager_v1
from pydantic import SecretStr

from blocks import GcpTarget
from tasks.common import clients
from tasks.common.gcp import InfraError
from tasks.infra import access, ensure, teardown
from tests.support.models import tiny_model_files, upload_model
from tests.support.sandbox_config import config_setter
from tests.support.services import gpu_service

_ids = itertools.count()
WRITES = {"POST", "PUT", "PATCH", "DELETE"}
TOKEN = SecretStr("hf_infraTestTokenValue000000000000000")


@pytest.fixture
def target(sandbox_target) -> GcpTarget:
    """The sandbox target with names of its own, so tests never see each other's resources."""
    n = next(_ids)
    return sandbox_target.model_copy(
        update={
            "bucket": f"infra-test-{n}",
            "artifact_repository": f"images-{n}",
            "network": f"vpc-{n}",
            "subnet": f"vpc-{n}-subnet",
            "service_account_name": f"serving-sa-{n}",
            "hf_token_secret": f"hf-token-{n}",
            "invokers": ["group:ml-apps@example.com"],
        }
    )


def ensure_all(target: GcpTarget) -> dict[str, str]:
    steps = [
        ensure.ensure_bucket(target),
        ensure.ensure_artifact_registry(target),
        ensure.ensure_network(target),
        ensure.ensure_subnet(target),
        ensure.ensure_service_account(target),
        ensure.ensure_secret(target, TOKEN),
        access.grant_bucket_object_viewer(target),
        access.grant_secret_accessor(target),
    ]
    return {f"{s.kind}:{s.name.split(' ')[0]}": s.action for s in steps}


def writes_since(sb, since: int) -> list[str]:
    return [f"{r['method']} {r['path']}" for r in sb.requests(since=since) if r["method"] in WRITES]


def test_empty_project_gets_everything_and_a_second_run_writes_nothing(sb, target):
    first = ensure_all(target)
    assert set(first.values()) <= {"created", "updated"}
    assert first[f"bucket:gs://{target.bucket_name}"] == "created"
    since = sb.last_request_seq()
    second = ensure_all(target)
    assert set(second.values()) == {"found"}
    assert writes_since(sb, since) == []


def test_created_resources_have_the_settings_the_lessons_ask_for(target):
    ensure_all(target)
    bucket = clients.storage(target).get_bucket(target.bucket_name)
    assert bucket.location == "US-CENTRAL1" and bucket.location_type == "region"
    assert bucket.iam_configuration.uniform_bucket_level_access_enabled
    assert bucket.iam_configuration.public_access_prevention == "enforced"
    assert bucket.labels["managed-by"] == "hf-cloudrun-pipeline"
    repository = clients.artifact_registry(target).get_repository(name=ensure.repository_path(target))
    assert repository.vulnerability_scanning_config.enablement_config.name == "INHERITED"
    assert repository.labels["managed-by"] == "hf-cloudrun-pipeline"
    network = clients.compute_networks(target).get(project=target.project, network=target.network)
    assert network.auto_create_subnetworks is False and network.routing_config.routing_mode == "REGIONAL"
    subnet = clients.compute_subnetworks(target).get(
        project=target.project, region=target.region, subnetwork=target.subnet
    )
    assert subnet.ip_cidr_range == "10.8.0.0/26" and subnet.private_ip_google_access


def test_iam_is_exactly_least_privilege(target):
    ensure_all(target)
    member = f"serviceAccount:{target.service_account_email}"
    bucket_policy = clients.storage(target).bucket(target.bucket_name).get_iam_policy(requested_policy_version=3)
    roles_of_sa = {b["role"] for b in bucket_policy.bindings if member in b["members"]}
    assert roles_of_sa == {"roles/storage.objectViewer"}
    secret_policy = clients.secret_manager(target).get_iam_policy(request={"resource": ensure.secret_path(target)})
    assert [(b.role, list(b.members)) for b in secret_policy.bindings] == [
        ("roles/secretmanager.secretAccessor", [member])
    ]


@pytest.mark.usefixtures("iam_propagated")  # raw binding / deploy of a new account
def test_codelab_storage_admin_grant_is_narrowed_to_object_viewer(target):
    ensure.ensure_bucket(target)
    ensure.ensure_service_account(target)
    bucket = clients.storage(target).bucket(target.bucket_name)
    policy = bucket.get_iam_policy(requested_policy_version=3)
    member = f"serviceAccount:{target.service_account_email}"
    policy.bindings.append({"role": "roles/storage.admin", "members": {member}})
    bucket.set_iam_policy(policy)
    result = access.grant_bucket_object_viewer(target)
    assert set(result.changes) == {"removed roles/storage.admin", "granted roles/storage.objectViewer"}
    roles = {b["role"] for b in bucket.get_iam_policy(requested_policy_version=3).bindings if member in b["members"]}
    assert roles == {"roles/storage.objectViewer"}


def test_subnet_without_private_google_access_is_repaired(target):
    ensure.ensure_network(target)
    subnets = clients.compute_subnetworks(target)
    operation = subnets.insert_unary(
        project=target.project,
        region=target.region,
        subnetwork_resource=compute_v1.Subnetwork(
            name=target.subnet,
            network=f"projects/{target.project}/global/networks/{target.network}",
            ip_cidr_range=target.subnet_range,
            private_ip_google_access=False,
        ),
    )
    clients.compute_region_operations(target).wait(
        project=target.project, region=target.region, operation=operation.name
    )
    result = ensure.ensure_subnet(target)
    assert (result.action, result.changes) == ("updated", ["Private Google Access turned on"])
    assert subnets.get(project=target.project, region=target.region, subnetwork=target.subnet).private_ip_google_access


def test_overlapping_subnet_range_is_a_clear_error(target):
    ensure.ensure_network(target)
    ensure.ensure_subnet(target)
    other = target.model_copy(update={"subnet": f"{target.subnet}-2", "subnet_range": "10.8.0.0/25"})
    with pytest.raises(
        InfraError, match=r"subnet_range 10\.8\.0\.0/25 overlaps another subnet of network .*free range"
    ):
        ensure.ensure_subnet(other)


def test_bucket_in_another_region_or_public_is_refused(target):
    storage = clients.storage(target)
    storage.create_bucket(target.bucket_name, location="europe-west4")
    with pytest.raises(InfraError, match=r"is in EUROPE-WEST4 \(region\), the service in us-central1.*lesson 18"):
        ensure.ensure_bucket(target)
    public = target.model_copy(update={"bucket": f"{target.bucket_name}-public"})
    bucket = storage.create_bucket(public.bucket_name, location=public.region)
    policy = bucket.get_iam_policy(requested_policy_version=3)
    policy.bindings.append({"role": "roles/storage.objectViewer", "members": {"allUsers"}})
    bucket.set_iam_policy(policy)
    with pytest.raises(InfraError, match=r"is public \(allUsers in its IAM policy\)"):
        ensure.ensure_bucket(public)


def test_bucket_without_public_access_prevention_is_repaired_through_a_503(sb, target):
    clients.storage(target).create_bucket(target.bucket_name, location=target.region)
    sb.add_fault("gcs", path=f"^/storage/v1/b/{target.bucket_name}$", method="PATCH", status=503, times=1)
    result = ensure.ensure_bucket(target)
    assert result.action == "updated"
    assert "public access prevention enforced" in result.changes
    assert "uniform bucket-level access turned on" in result.changes
    assert [rule["fired"] for rule in sb.faults()] == [1]
    bucket = clients.storage(target).get_bucket(target.bucket_name)
    assert bucket.iam_configuration.public_access_prevention == "enforced"
    assert ensure.ensure_bucket(target).action == "found"


def test_creates_that_lose_a_race_report_found(sb, target):
    sb.add_fault("gcs", path="^/storage/v1/b$", method="POST", action="replace", status=409, times=1)
    sb.add_fault("control", path="/global/networks$", method="POST", action="replace", status=409, times=1)
    sb.add_fault("control", path="/serviceAccounts$", method="POST", action="replace", status=409, times=1)
    sb.add_fault("control", path="/repositories$", method="POST", action="replace", status=409, times=1)
    assert ensure.ensure_bucket(target).action == "found"
    assert ensure.ensure_network(target).action == "found"
    assert ensure.ensure_service_account(target).action == "found"
    assert ensure.ensure_artifact_registry(target).action == "found"
    sb.add_fault("control", path="/subnetworks$", method="POST", action="replace", status=409, times=1)
    since = sb.last_request_seq()
    assert ensure.ensure_subnet(target).action == "found"
    assert all(rule["fired"] == 1 for rule in sb.faults())
    # the winner's subnet was read back and checked (range, Private Google Access), not taken on trust
    calls = [(r["method"], r["status"]) for r in sb.requests("control", since=since) if "/subnetworks" in r["path"]]
    assert calls == [("GET", 404), ("POST", 409), ("GET", 200)]
    subnet = clients.compute_subnetworks(target).get(
        project=target.project, region=target.region, subnetwork=target.subnet
    )
    assert subnet.ip_cidr_range == target.subnet_range and subnet.private_ip_google_access


def test_secret_create_that_loses_a_race_still_stores_the_value(sb, target):
    # The concurrent creator made the secret but has not added a version yet: the value must still be stored.
    sb.add_fault("control", path="/secrets$", method="POST", action="replace", status=409, times=1)
    result = ensure.ensure_secret(target, TOKEN)
    assert (result.action, result.changes) == ("updated", ["new version"])
    assert [rule["fired"] for rule in sb.faults()] == [1]
    manager = clients.secret_manager(target)
    assert len(list(manager.list_secret_versions(parent=ensure.secret_path(target)))) == 1
    latest = manager.access_secret_version(name=f"{ensure.secret_path(target)}/versions/latest").payload.data
    assert latest == TOKEN.get_secret_value().encode()
    since = sb.last_request_seq()
    assert ensure.ensure_secret(target, TOKEN).action == "found"
    assert writes_since(sb, since) == []


def test_a_stale_etag_restarts_the_read_modify_write(sb, target):
    ensure.ensure_bucket(target)
    ensure.ensure_service_account(target)
    ensure.ensure_secret(target, TOKEN)
    sb.add_fault("gcs", path="/iam$", method="PUT", status=412, times=1)
    aborted = '{"error": {"code": 409, "message": "concurrent policy changes", "status": "ABORTED"}}'
    sb.add_fault("control", path=":setIamPolicy$", method="POST", status=409, times=1, body=aborted)
    assert access.grant_bucket_object_viewer(target).changes == ["granted roles/storage.objectViewer"]
    assert access.grant_secret_accessor(target).action == "updated"
    assert all(rule["fired"] == 1 for rule in sb.faults())


# Raw binding / deploy of a new account, its weights bucket granted raw right before (no product wait for either).
@pytest.mark.usefixtures("iam_propagated", "grants_propagated")
def test_a_stale_etag_restarts_the_service_invokers_read_modify_write(sb, target):
    ensure.ensure_bucket(target)
    ensure.ensure_service_account(target)
    service_id = f"infra-svc-{next(_ids)}"
    service = _deploy_private_service(sb, target, service_id)
    try:
        aborted = '{"error": {"code": 409, "message": "concurrent policy changes", "status": "ABORTED"}}'
        sb.add_fault(
            "control", path=f"/services/{service_id}:setIamPolicy$", method="POST", status=409, times=1, body=aborted
        )
        since = sb.last_request_seq()
        result = access.ensure_service_invokers(target, service_id)
        assert (result.action, result.changes) == (
            "updated",
            ["granted roles/run.invoker to group:ml-apps@example.com"],
        )
        assert [rule["fired"] for rule in sb.faults()] == [1]
        policy_calls = [r["path"].rsplit(":", 1)[1] for r in sb.requests(since=since) if "IamPolicy" in r["path"]]
        assert policy_calls == ["getIamPolicy", "setIamPolicy", "getIamPolicy", "setIamPolicy"]  # read again
        bindings = clients.run_services(target).get_iam_policy(request={"resource": service.name}).bindings
        assert [(b.role, list(b.members)) for b in bindings] == [("roles/run.invoker", ["group:ml-apps@example.com"])]
    finally:
        teardown.delete_service(target, service_id)


def test_403_names_the_api_to_enable_or_the_role_to_grant(sb, target):
    disabled = (
        '{"error": {"code": 403, "message": "Compute Engine API has not been used in project 123 before or it '
        'is disabled.", "status": "PERMISSION_DENIED"}}'
    )
    sb.add_fault("control", path="/global/networks/", method="GET", status=403, body=disabled, times=1)
    with pytest.raises(InfraError, match=r"gcloud services enable compute\.googleapis\.com --project sandbox-project"):
        ensure.ensure_network(target)
    sb.add_fault("control", path="/serviceAccounts/", method="GET", status=403, times=1)
    with pytest.raises(InfraError, match=r"grant the identity running this flow roles/iam\.serviceAccountAdmin"):
        ensure.ensure_service_account(target)


FIRST_CALLS = {
    # step: (server, path of its first call (a GET), API title, service to enable, role to grant, resource named)
    "bucket": (
        "gcs",
        "^/storage/v1/b/{bucket}$",
        "Cloud Storage",
        "storage",
        "roles/storage.admin",
        "bucket gs://{bucket}",
    ),
    "artifact-registry": (
        "control",
        "/repositories/{repo}$",
        "Artifact Registry",
        "artifactregistry",
        "roles/artifactregistry.admin",
        "repository {repo_path}",
    ),
    "subnet": (
        "control",
        "/subnetworks/{subnet}$",
        "Compute Engine",
        "compute",
        "roles/compute.networkAdmin",
        "subnet {subnet}",
    ),
    "secret": (
        "control",
        "/secrets/{secret}$",
        "Secret Manager",
        "secretmanager",
        "roles/secretmanager.admin",
        "secret {secret_path}",
    ),
}
ENSURE = {
    "bucket": ensure.ensure_bucket,
    "artifact-registry": ensure.ensure_artifact_registry,
    "subnet": ensure.ensure_subnet,
    "secret": lambda target: ensure.ensure_secret(target, TOKEN),
}


@pytest.mark.parametrize("cause", ["api-disabled", "permission-denied"])
@pytest.mark.parametrize("step", list(FIRST_CALLS))
def test_403_on_the_first_call_of_each_step_names_the_fix(sb, target, step, cause):
    server, path, title, api, role, what = FIRST_CALLS[step]
    names = {
        "bucket": target.bucket_name,
        "repo": target.artifact_repository,
        "repo_path": ensure.repository_path(target),
        "subnet": target.subnet,
        "secret": target.hf_token_secret,
        "secret_path": ensure.secret_path(target),
    }
    project = target.project
    if cause == "api-disabled":
        message = (
            f"{title} API has not been used in project 123456789012 before or it is disabled. Enable it by visiting "
            f"https://console.developers.google.com/apis/api/{api}.googleapis.com/overview?project=123456789012 "
            "then retry."
        )
        expected = (
            f"{what.format(**names)}: the {title} API is not enabled in project {project}; enable it with "
            f"`gcloud services enable {api}.googleapis.com --project {project}` and run again"
        )
    else:
        message = "The caller does not have permission"
        expected = (
            f"{what.format(**names)}: permission denied in project {project}; grant the identity running this flow "
            f"{role} (or a role that includes it) and run again"
        )
    body = json.dumps({"error": {"code": 403, "message": message, "status": "PERMISSION_DENIED"}})
    sb.add_fault(server, path=path.format(**names), method="GET", status=403, body=body, times=1)
    since = sb.last_request_seq()
    with pytest.raises(InfraError) as caught:
        ENSURE[step](target)
    assert str(caught.value) == expected
    assert [rule["fired"] for rule in sb.faults()] == [1]
    assert writes_since(sb, since) == []


def test_429_then_success_is_retried(sb, target):
    sb.add_fault("control", path="/serviceAccounts/", method="GET", status=429, times=2)
    assert ensure.ensure_service_account(target).action == "created"


def test_secret_gets_a_new_version_only_when_the_value_changes(target):
    manager = clients.secret_manager(target)
    assert ensure.ensure_secret(target, TOKEN).action == "created"
    assert ensure.ensure_secret(target, TOKEN).action == "found"
    assert ensure.ensure_secret(target, SecretStr("hf_rotatedTokenValue0000000000000000")).action == "updated"
    versions = list(manager.list_secret_versions(parent=ensure.secret_path(target)))
    assert len(versions) == 2
    latest = manager.access_secret_version(name=f"{ensure.secret_path(target)}/versions/latest").payload.data
    assert latest == b"hf_rotatedTokenValue0000000000000000"


def _deploy_private_service(sb, target: GcpTarget, service_id: str) -> run_v2.Service:
    sb.run("POST", "/idle")  # what earlier tests left idle holds nothing: Cloud Run's idle time has passed
    upload_model(clients.storage(target), target.bucket_name, "models/tiny", tiny_model_files(),
                 readers=[f"serviceAccount:{target.service_account_email}"])  # fmt: skip
    spec = gpu_service(target.bucket_name)
    spec.template.service_account = target.service_account_email
    return (
        clients.run_services(target)
        .create_service(parent=target.location_path, service=spec, service_id=service_id)
        .result(polling=clients.operation_polling(target))
    )


@pytest.mark.usefixtures("grants_propagated")  # the weights bucket is granted right before a raw deploy
def test_service_invokers_are_exactly_the_listed_principals(sb, target):
    ensure_all(target)
    service_id = f"infra-svc-{next(_ids)}"
    service = _deploy_private_service(sb, target, service_id)
    try:
        services = clients.run_services(target)
        policy = services.get_iam_policy(request={"resource": service.name})
        policy.bindings.add(role="roles/run.invoker", members=["user:someone-else@example.com"])
        services.set_iam_policy(request={"resource": service.name, "policy": policy})
        result = access.ensure_service_invokers(target, service_id)
        assert set(result.changes) == {
            "granted roles/run.invoker to group:ml-apps@example.com",
            "removed roles/run.invoker from user:someone-else@example.com",
        }
        bindings = services.get_iam_policy(request={"resource": service.name}).bindings
        assert [(b.role, list(b.members)) for b in bindings] == [("roles/run.invoker", ["group:ml-apps@example.com"])]
    finally:
        teardown.delete_service(target, service_id)


@pytest.mark.usefixtures("grants_propagated")  # the weights bucket is granted right before a raw deploy
def test_teardown_twice_in_a_row_succeeds(sb, target):
    ensure_all(target)
    service_id = f"infra-svc-{next(_ids)}"
    _deploy_private_service(sb, target, service_id)
    steps = [
        lambda: teardown.delete_service(target, service_id),
        lambda: teardown.delete_subnet(target),
        lambda: teardown.delete_network(target),
        lambda: teardown.delete_service_account(target),
        lambda: teardown.delete_secret(target),
        lambda: teardown.delete_bucket(target),
    ]
    assert [step().action for step in steps] == ["deleted"] * 6
    assert [step().action for step in steps] == ["absent"] * 6


# Organization policy on resource locations -----------------------------------------------------------------
US_ONLY = {"gcp.resourceLocations": {"rules": [{"values": {"allowedValues": ["in:us-locations"]}}]}}
EU_ONLY = {"gcp.resourceLocations": {"rules": [{"values": {"allowedValues": ["in:eu-locations"]}}]}}


def test_a_location_policy_refuses_a_global_secret_and_the_products_regional_secret_is_created(sb, target):
    manager = clients.secret_manager(target)
    with config_setter(sb, "org_policies") as org_policies:
        org_policies(US_ONLY)
        # What the product did before, and most tools still do: automatic replication lives in "global".
        with pytest.raises(BadRequest) as refused:
            manager.create_secret(
                parent=f"projects/{target.project}",
                secret_id=f"{target.hf_token_secret}-global",
                secret=secretmanager_v1.Secret(
                    replication=secretmanager_v1.Replication(automatic=secretmanager_v1.Replication.Automatic())
                ),
            )
        assert "Constraint constraints/gcp.resourceLocations violated for [orgpolicy:projects/" in refused.value.message
        assert "attempting to create a secret in [global]" in refused.value.message
        assert ensure.ensure_secret(target, TOKEN).action == "created"
    secret = manager.get_secret(name=ensure.secret_path(target))
    assert [r.location for r in secret.replication.user_managed.replicas] == [target.region]
    latest = manager.access_secret_version(name=f"{ensure.secret_path(target)}/versions/latest").payload.data
    assert latest == TOKEN.get_secret_value().encode()


def test_a_location_policy_that_excludes_the_region_refuses_the_secret_with_the_constraint(sb, target):
    with config_setter(sb, "org_policies") as org_policies:
        org_policies(EU_ONLY)
        with pytest.raises(BadRequest, match=rf"attempting to create a secret in \[{target.region}\]"):
            ensure.ensure_secret(target, TOKEN)
    with pytest.raises(NotFound):
        clients.secret_manager(target).get_secret(name=ensure.secret_path(target))


@pytest.mark.usefixtures("iam_propagated", "grants_propagated")
def test_a_compile_cache_grant_lets_the_account_write_its_caches_only_and_is_kept_by_later_runs(sb, target):
    ensure.ensure_bucket(target)
    ensure.ensure_service_account(target)
    prefix = f"gs://{target.bucket_name}/compile-cache/"
    first = access.grant_bucket_object_viewer(target, compile_cache=True)
    assert first.changes == ["granted roles/storage.objectViewer", f"granted roles/storage.objectUser on {prefix}"]
    assert access.grant_bucket_object_viewer(target, compile_cache=True).changes == [], "idempotent"
    # A service without the cache, promoted later on the same target, must not take it from the others.
    assert access.grant_bucket_object_viewer(target).changes == []
    member = f"serviceAccount:{target.service_account_email}"
    policy = clients.storage(target).bucket(target.bucket_name).get_iam_policy(requested_policy_version=3)
    (writer,) = [b for b in policy.bindings if member in b["members"] and b["role"] == "roles/storage.objectUser"]
    assert writer["condition"]["expression"] == (
        f'resource.name.startsWith("projects/_/buckets/{target.bucket_name}/objects/compile-cache/")'
    )
    before = sb.configure()["caller"]
    try:
        sb.configure(caller=member)  # as the serving account: the cache is writable, the weights are not
        bucket = clients.storage(target).bucket(target.bucket_name)
        bucket.blob("compile-cache/org/model/abc/cpu-1/inductor/x.so").upload_from_string(b"kernel")
        with pytest.raises(Forbidden):
            bucket.blob("model-cache/org/model/abc/model.safetensors").upload_from_string(b"overwritten weights")
    finally:
        sb.configure(caller=before)
