"""The sandbox's caller and its IAM roles: every API answers 403 as Google does when a permission is missing.

Real clients over real HTTP (run_v2, compute_v1, secretmanager_v1, google-cloud-storage, an AuthorizedSession
for IAM and Resource Manager); the caller's roles are set in the project IAM policy per test and restored after.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from google.api_core import exceptions as gexc
from google.auth.credentials import AnonymousCredentials
from google.auth.transport.requests import AuthorizedSession
from google.cloud import run_v2, secretmanager_v1

from blocks.target import GcpTarget
from sandbox.handle import SandboxHandle
from tasks.common import clients
from tasks.common.permissions import explain_denied


@pytest.fixture
def roles(sb: SandboxHandle) -> Iterator[SandboxHandle]:
    """The sandbox; whatever roles a test gives the caller, it is owner again afterwards."""
    try:
        yield sb
    finally:
        sb.set_caller_roles(["roles/owner"])


def _session() -> AuthorizedSession:
    return AuthorizedSession(AnonymousCredentials())


def _wire(exc: gexc.GoogleAPICallError) -> dict:
    """The error object the sandbox sent (the client's message prefixes the method and URL)."""
    return exc.response.json()["error"]


def _service(target: GcpTarget, account: str | None) -> run_v2.Service:
    # Model Garden's vLLM image: one the sandbox's Cloud Run knows (validate-only requests never start it).
    image = "us-docker.pkg.dev/vertex-ai/vertex-vision-model-garden-dockers/pytorch-vllm-serve:20250101"
    container = run_v2.Container(image=image, args=["vllm", "serve", "m"])
    template = run_v2.RevisionTemplate(containers=[container], service_account=account or "")
    return run_v2.Service(template=template)


def _create(target: GcpTarget, account: str | None = None) -> str:
    """Ask to create a service (validate only: nothing is deployed); its name."""
    service_id = f"authz-{uuid.uuid4().hex[:6]}"
    request = run_v2.CreateServiceRequest(
        parent=target.location_path, service=_service(target, account), service_id=service_id, validate_only=True
    )
    clients.run_services(target).create_service(request=request)
    return f"{target.location_path}/services/{service_id}"


def test_default_caller_is_owner_and_project_policy_says_so(sb: SandboxHandle, sandbox_target: GcpTarget) -> None:
    url = f"{sb.control_url}/v3/projects/{sandbox_target.project}:getIamPolicy"
    policy = _session().post(url, json={}).json()
    owners = next(b["members"] for b in policy["bindings"] if b["role"] == "roles/owner")
    assert owners == ["user:sandbox-owner@example.com"]
    project = _session().get(f"{sb.control_url}/v3/projects/{sandbox_target.project}").json()
    assert project["projectId"] == sandbox_target.project and project["state"] == "ACTIVE"


def test_run_create_without_permission_is_403_with_googles_message(
    roles: SandboxHandle, sandbox_target: GcpTarget
) -> None:
    roles.set_caller_roles(["roles/run.viewer"])
    services = clients.run_services(sandbox_target)
    service_id = f"authz-{uuid.uuid4().hex[:6]}"
    with pytest.raises(gexc.Forbidden) as caught:
        services.create_service(
            parent=sandbox_target.location_path,
            service=_service(sandbox_target, None),
            service_id=service_id,
        )
    resource = f"{sandbox_target.location_path}/services/{service_id}"
    assert _wire(caught.value)["message"] == (
        f"Permission 'run.services.create' denied on resource '{resource}' (or resource may not exist)."
    )
    assert caught.value.reason == "IAM_PERMISSION_DENIED"
    assert caught.value.domain == "iam.googleapis.com"
    assert caught.value.metadata["permission"] == "run.services.create"
    # What the product tells the user from that message.
    assert "grant roles/run.admin" in explain_denied(caught.value.message, sandbox_target.project)


def test_run_deploy_as_a_service_account_needs_act_as(roles: SandboxHandle, sandbox_target: GcpTarget) -> None:
    roles.set_caller_roles(["roles/run.admin"])
    account = f"{sandbox_target.service_account_name}@{sandbox_target.project}.iam.gserviceaccount.com"
    with pytest.raises(gexc.Forbidden) as caught:
        _create(sandbox_target, account)
    assert _wire(caught.value)["message"] == (
        f"Permission 'iam.serviceaccounts.actAs' denied on service account {account} (or it may not exist)."
    )
    explained = explain_denied(caught.value.message, sandbox_target.project)
    assert "iam.serviceAccounts.actAs" in explained and "roles/iam.serviceAccountUser" in explained


def test_a_build_as_a_service_account_needs_act_as_and_cloud_build_names_it_by_id(
    roles: SandboxHandle, sandbox_target: GcpTarget
) -> None:
    from google.cloud.devtools import cloudbuild_v1

    from sandbox.identity import unique_id

    roles.set_caller_roles(["roles/cloudbuild.builds.editor"])
    email = f"{sandbox_target.build_service_account_name}@{sandbox_target.project}.iam.gserviceaccount.com"
    build = cloudbuild_v1.Build(
        steps=[cloudbuild_v1.BuildStep(name="ubuntu", args=["true"])],
        service_account=f"projects/{sandbox_target.project}/serviceAccounts/{email}",
        options=cloudbuild_v1.BuildOptions(logging=cloudbuild_v1.BuildOptions.LoggingMode.CLOUD_LOGGING_ONLY),
    )
    with pytest.raises(gexc.Forbidden) as caught:
        clients.cloud_build(sandbox_target).create_build(parent=sandbox_target.location_path, build=build)
    wire = _wire(caught.value)
    assert wire["message"] == (
        "generic::permission_denied: caller does not have permission to act as service account "
        f"projects/{sandbox_target.project}/serviceAccounts/{unique_id(email)}."
    )
    assert wire["details"][0]["metadata"]["permission"] == "iam.serviceAccounts.actAs"
    explained = explain_denied(caught.value.message, sandbox_target.project)
    assert "iam.serviceAccounts.actAs" in explained and "roles/iam.serviceAccountUser" in explained


@pytest.mark.usefixtures("grants_propagated")  # actAs is granted raw right before the deploy, with no product wait
def test_act_as_granted_on_the_account_alone_is_enough(roles: SandboxHandle, sandbox_target: GcpTarget) -> None:
    """serviceAccountUser on the one account (its own IAM policy), not on the project, lets the deploy through."""
    before = roles.configure()["iam_propagation_seconds"]
    roles.configure(iam_propagation_seconds=0)  # a brand-new account is not the subject here
    try:
        _act_as_on_the_account(roles, sandbox_target)
    finally:
        roles.configure(iam_propagation_seconds=before)


def _act_as_on_the_account(roles: SandboxHandle, sandbox_target: GcpTarget) -> None:
    session = _session()
    account_id = f"authz-{uuid.uuid4().hex[:6]}"
    created = session.post(
        f"{roles.control_url}/v1/projects/{sandbox_target.project}/serviceAccounts", json={"accountId": account_id}
    ).json()
    email = created["email"]
    name = f"projects/{sandbox_target.project}/serviceAccounts/{email}"
    binding = {"role": "roles/iam.serviceAccountUser", "members": ["user:sandbox-owner@example.com"]}
    answer = session.post(f"{roles.control_url}/v1/{name}:setIamPolicy", json={"policy": {"bindings": [binding]}})
    assert answer.status_code == 200, answer.text
    roles.set_caller_roles(["roles/run.admin"])
    tested = session.post(
        f"{roles.control_url}/v1/{name}:testIamPermissions", json={"permissions": ["iam.serviceAccounts.actAs"]}
    ).json()
    assert tested == {"permissions": ["iam.serviceAccounts.actAs"]}
    assert _create(sandbox_target, email)  # no 403: actAs on the account itself is enough


def test_traffic_only_update_needs_no_act_as(roles: SandboxHandle, sandbox_target: GcpTarget) -> None:
    """A scaling or traffic change makes no revision: nothing new runs as anyone, so no actAs is checked."""
    services = clients.run_services(sandbox_target)
    name = f"{sandbox_target.location_path}/services/authz-absent"
    roles.set_caller_roles(["roles/run.developer"])
    scaling = run_v2.Service(name=name, scaling=run_v2.ServiceScaling(min_instance_count=1))
    with pytest.raises(gexc.NotFound):  # allowed, and then: no such service
        services.update_service(service=scaling, update_mask={"paths": ["scaling"]})
    with pytest.raises(gexc.Forbidden, match=r"iam\.serviceaccounts\.actAs"):
        services.update_service(service=run_v2.Service(_service(sandbox_target, None), name=name))
    # run.developer may not change who can invoke: setIamPolicy is run.admin's only.
    with pytest.raises(gexc.Forbidden, match=r"run\.services\.setIamPolicy"):
        services.set_iam_policy(request={"resource": name, "policy": {"bindings": []}})


def test_storage_compute_secrets_iam_logging_deny_in_their_own_words(
    roles: SandboxHandle, sandbox_target: GcpTarget
) -> None:
    roles.set_caller_roles(["roles/viewer"])
    project = sandbox_target.project
    with pytest.raises(gexc.Forbidden) as caught:
        clients.storage(sandbox_target).create_bucket(f"authz-{uuid.uuid4().hex[:8]}", location=sandbox_target.region)
    assert _wire(caught.value)["message"].startswith(
        "sandbox-owner@example.com does not have storage.buckets.create access to the Google Cloud project."
    )
    assert caught.value.errors[0]["reason"] == "forbidden"
    with pytest.raises(gexc.Forbidden) as caught:
        clients.compute_networks(sandbox_target).delete_unary(project=project, network="authz-none")
    assert (
        _wire(caught.value)["message"]
        == f"Required 'compute.networks.delete' permission for 'projects/{project}/global/networks/authz-none'"
    )
    with pytest.raises(gexc.Forbidden) as caught:
        clients.secret_manager(sandbox_target).create_secret(
            parent=f"projects/{project}",
            secret_id="authz-secret",
            secret=secretmanager_v1.Secret(replication={"automatic": {}}),
        )
    assert _wire(caught.value)["message"] == (
        f"Permission 'secretmanager.secrets.create' denied for resource 'projects/{project}/secrets/authz-secret' "
        "(or it may not exist)."
    )
    response = _session().post(
        f"{roles.control_url}/v1/projects/{project}/serviceAccounts", json={"accountId": "authz-nobody"}
    )
    assert response.status_code == 403
    assert response.json()["error"]["message"] == (
        "Permission 'iam.serviceAccounts.create' denied on resource (or it may not exist)."
    )
    # Viewer reads: a get is allowed (404 here, not 403).
    with pytest.raises(gexc.NotFound):
        clients.compute_networks(sandbox_target).get(project=project, network="authz-none")


def test_test_iam_permissions_answers_what_the_caller_holds(roles: SandboxHandle, sandbox_target: GcpTarget) -> None:
    roles.set_caller_roles(["roles/run.admin", "roles/storage.objectViewer"])
    asked = ["run.services.create", "storage.objects.get", "storage.buckets.create", "iam.serviceAccounts.actAs"]
    answer = _session().post(
        f"{roles.control_url}/v3/projects/{sandbox_target.project}:testIamPermissions", json={"permissions": asked}
    )
    assert answer.json() == {"permissions": ["run.services.create", "storage.objects.get"]}
    roles.set_caller_roles([])
    answer = _session().post(
        f"{roles.control_url}/v3/projects/{sandbox_target.project}:testIamPermissions", json={"permissions": asked}
    )
    assert answer.json() == {}


@pytest.mark.usefixtures("grants_propagated")  # the bucket role is granted raw right before the read
def test_a_bucket_policy_adds_to_the_project_policy(roles: SandboxHandle, sandbox_target: GcpTarget) -> None:
    storage = clients.storage(sandbox_target)
    bucket = storage.create_bucket(f"authz-{uuid.uuid4().hex[:8]}", location=sandbox_target.region)
    blob = bucket.blob("a.txt")
    blob.upload_from_string(b"hello")
    policy = bucket.get_iam_policy(requested_policy_version=3)
    policy.bindings.append({"role": "roles/storage.objectViewer", "members": {"user:sandbox-owner@example.com"}})
    bucket.set_iam_policy(policy)
    try:
        roles.set_caller_roles([])
        assert storage.bucket(bucket.name).blob("a.txt").download_as_bytes() == b"hello"
        with pytest.raises(gexc.Forbidden, match=r"storage\.objects\.create access to the Google Cloud Storage object"):
            storage.bucket(bucket.name).blob("b.txt").upload_from_string(b"no")
    finally:
        roles.set_caller_roles(["roles/owner"])
        blob.delete()
        bucket.delete()
