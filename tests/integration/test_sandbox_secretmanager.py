"""Secret Manager stand-in through the real secretmanager_v1 REST client (tasks.common.clients.secret_manager)."""

from __future__ import annotations

import base64
import contextlib
import uuid

import google_crc32c
import pytest
from google.api_core import exceptions
from google.api_core.retry import Retry, if_exception_type
from google.cloud import secretmanager_v1 as sm
from google.iam.v1 import policy_pb2
from starlette.applications import Starlette
from starlette.testclient import TestClient

from sandbox.authz import has_permission
from sandbox.config import SandboxConfig
from sandbox.control import ControlContext
from sandbox.control.errors import GoogleApiError, google_error_handler
from sandbox.control.iam import DEFAULT_PROJECT_NUMBER, Iam
from sandbox.control.secretmanager import SecretManager
from sandbox.faults import FaultRegistry
from tasks.common import clients

State = sm.SecretVersion.State
AUTOMATIC = sm.Replication(automatic=sm.Replication.Automatic())
FAST_RETRY = dict(initial=0.01, maximum=0.05, multiplier=2, timeout=10)


@pytest.fixture(scope="module")
def client(sandbox_target) -> sm.SecretManagerServiceClient:
    return clients.secret_manager(sandbox_target)


@pytest.fixture(scope="module")
def parent(sandbox_target) -> str:
    return f"projects/{sandbox_target.project}"


@pytest.fixture
def secret_id(client, parent) -> str:
    """A fresh secret id; the secret is deleted afterwards if the test left it."""
    name = f"secret-{uuid.uuid4().hex[:10]}"
    yield name
    with contextlib.suppress(exceptions.NotFound):
        client.delete_secret(name=f"{parent}/secrets/{name}")


def numbered(secret_id: str) -> str:
    """The name the real API answers with: the project NUMBER, not the id."""
    return f"projects/{DEFAULT_PROJECT_NUMBER}/secrets/{secret_id}"


def crc(data: bytes) -> int:
    return google_crc32c.value(data)


def make(client, parent: str, secret_id: str, *payloads: bytes, **fields) -> sm.Secret:
    secret = client.create_secret(
        parent=parent, secret_id=secret_id, secret=sm.Secret(replication=fields.pop("replication", AUTOMATIC), **fields)
    )
    for data in payloads:
        client.add_secret_version(parent=secret.name, payload=sm.SecretPayload(data=data, data_crc32c=crc(data)))
    return secret


def test_create_add_versions_and_access(client, parent, secret_id):
    secret = make(client, parent, secret_id, labels={"managed-by": "tests"})
    assert secret.name == numbered(secret_id)
    assert secret.labels == {"managed-by": "tests"}
    assert secret.create_time and secret.etag
    assert "automatic" in secret.replication

    first = client.add_secret_version(
        parent=secret.name, payload=sm.SecretPayload(data=b"token-1", data_crc32c=crc(b"token-1"))
    )
    assert first.name == f"{numbered(secret_id)}/versions/1"
    assert first.state == State.ENABLED
    assert first.client_specified_payload_checksum
    second = client.add_secret_version(parent=f"{parent}/secrets/{secret_id}", payload=sm.SecretPayload(data=b"tok-2"))
    assert second.name.endswith("/versions/2")
    assert not second.client_specified_payload_checksum

    latest = client.access_secret_version(name=f"{parent}/secrets/{secret_id}/versions/latest")
    assert latest.name == f"{numbered(secret_id)}/versions/2"  # "latest" answers with the resolved number
    assert latest.payload.data == b"tok-2"
    assert latest.payload.data_crc32c == crc(b"tok-2")  # the server computes it when the client did not
    by_number = client.access_secret_version(name=f"{numbered(secret_id)}/versions/1")
    assert by_number.payload.data == b"token-1"

    got = client.get_secret(name=f"{parent}/secrets/{secret_id}")
    assert got.name == secret.name and got.etag == secret.etag
    assert client.get_secret_version(name=f"{secret.name}/versions/latest").name.endswith("/versions/2")
    versions = list(client.list_secret_versions(parent=secret.name))
    assert [v.name.rsplit("/", 1)[1] for v in versions] == ["2", "1"]  # newest first
    assert secret.name in {s.name for s in client.list_secrets(parent=parent)}


def test_disable_enable_and_destroy(client, parent, secret_id):
    secret = make(client, parent, secret_id, b"old", b"new")
    v1, v2 = f"{secret.name}/versions/1", f"{secret.name}/versions/2"

    disabled = client.disable_secret_version(name=v2)
    assert disabled.state == State.DISABLED
    # 400 FAILED_PRECONDITION on the wire; google-api-core maps by HTTP status, so BadRequest.
    with pytest.raises(exceptions.BadRequest) as caught:
        client.access_secret_version(name=f"{secret.name}/versions/latest")
    assert f"Secret Version [{v2}] is in DISABLED state." in str(caught.value)  # latest does not fall back
    assert client.enable_secret_version(name=v2).state == State.ENABLED
    assert client.access_secret_version(name=v2).payload.data == b"new"

    with pytest.raises(exceptions.Conflict):  # a stale etag on a version is 409 ABORTED
        client.destroy_secret_version(request={"name": v1, "etag": '"stale"'})
    destroyed = client.destroy_secret_version(name=v1)
    assert destroyed.state == State.DESTROYED
    assert destroyed.destroy_time
    with pytest.raises(exceptions.BadRequest, match="DESTROYED"):
        client.access_secret_version(name=v1)
    with pytest.raises(exceptions.BadRequest, match="DESTROYED"):
        client.enable_secret_version(name=v1)
    states = {v.name: v.state for v in client.list_secret_versions(parent=secret.name)}
    assert states == {v1: State.DESTROYED, v2: State.ENABLED}
    enabled_only = list(client.list_secret_versions(request={"parent": secret.name, "filter": "state:ENABLED"}))
    assert [v.name for v in enabled_only] == [v2]


def test_crc32c_mismatch_is_400(client, parent, secret_id):
    secret = make(client, parent, secret_id)
    with pytest.raises(exceptions.BadRequest, match=r"[Cc]hecksum"):
        client.add_secret_version(parent=secret.name, payload=sm.SecretPayload(data=b"abc", data_crc32c=crc(b"abd")))
    with pytest.raises(exceptions.NotFound, match="not found or has no versions"):
        client.access_secret_version(name=f"{secret.name}/versions/latest")


def test_duplicate_and_missing(client, parent, secret_id):
    make(client, parent, secret_id)
    with pytest.raises(exceptions.Conflict) as caught:
        make(client, parent, secret_id)
    # The REST client prefixes the server's message with the method and URL.
    assert caught.value.message.endswith(f": Secret [{numbered(secret_id)}] already exists.")

    missing = f"{parent}/secrets/missing-{uuid.uuid4().hex[:8]}"
    with pytest.raises(exceptions.NotFound):
        client.get_secret(name=missing)
    with pytest.raises(exceptions.NotFound, match=r"not found or has no versions\."):
        client.access_secret_version(name=f"{missing}/versions/latest")
    with pytest.raises(exceptions.NotFound, match=r"Secret Version \[.*/versions/7\] not found"):
        client.get_secret_version(name=f"{parent}/secrets/{secret_id}/versions/7")
    with pytest.raises(exceptions.BadRequest):
        client.create_secret(parent=parent, secret_id="bad id!", secret=sm.Secret(replication=AUTOMATIC))
    with pytest.raises(exceptions.BadRequest, match="replication"):
        client.create_secret(parent=parent, secret_id=f"{secret_id}-x", secret=sm.Secret())
    with pytest.raises(exceptions.Forbidden):
        client.get_secret(name=f"projects/someone-elses-project/secrets/{secret_id}")


def test_update_labels_and_delete_with_etags(client, parent, secret_id):
    secret = make(client, parent, secret_id, b"v", labels={"a": "1"})
    updated = client.update_secret(
        secret=sm.Secret(name=secret.name, labels={"a": "2", "b": "3"}), update_mask={"paths": ["labels"]}
    )
    assert updated.labels == {"a": "2", "b": "3"}
    assert updated.etag != secret.etag
    with pytest.raises(exceptions.Conflict):
        client.update_secret(
            secret=sm.Secret(name=secret.name, labels={}, etag=secret.etag), update_mask={"paths": ["labels"]}
        )
    with pytest.raises(exceptions.BadRequest):
        client.update_secret(
            secret=sm.Secret(name=secret.name, replication=AUTOMATIC), update_mask={"paths": ["replication"]}
        )
    with pytest.raises(exceptions.Conflict):
        client.delete_secret(request={"name": secret.name, "etag": secret.etag})
    client.delete_secret(request={"name": secret.name, "etag": updated.etag})
    with pytest.raises(exceptions.NotFound):
        client.get_secret(name=secret.name)


def test_user_managed_replication(client, parent, secret_id):
    replication = sm.Replication(
        user_managed=sm.Replication.UserManaged(replicas=[sm.Replication.UserManaged.Replica(location="us-central1")])
    )
    secret = make(client, parent, secret_id, b"x", replication=replication)
    assert [r.location for r in secret.replication.user_managed.replicas] == ["us-central1"]
    version = client.get_secret_version(name=f"{secret.name}/versions/1")
    assert [r.location for r in version.replication_status.user_managed.replicas] == ["us-central1"]


@pytest.mark.usefixtures("iam_propagated")  # binds an account created a moment ago, raw
def test_secret_iam_policy_read_modify_write(client, parent, secret_id, sandbox_target):
    secret = make(client, parent, secret_id, b"hf_x")
    iam = clients.iam(sandbox_target)
    account_id = f"sm-{uuid.uuid4().hex[:8]}"
    created = iam.session.post(iam.url(f"{parent}/serviceAccounts"), json={"accountId": account_id})
    member = f"serviceAccount:{created.json()['email']}"

    policy = client.get_iam_policy(request={"resource": secret.name})
    assert list(policy.bindings) == []
    policy.bindings.append(policy_pb2.Binding(role="roles/secretmanager.secretAccessor", members=[member]))
    stored = client.set_iam_policy(request={"resource": secret.name, "policy": policy})
    assert [(b.role, list(b.members)) for b in stored.bindings] == [("roles/secretmanager.secretAccessor", [member])]
    assert stored.etag != policy.etag

    # Writing back the policy read before the change: its etag is stale now.
    with pytest.raises(exceptions.Conflict) as caught:
        client.set_iam_policy(request={"resource": secret.name, "policy": policy})
    assert caught.value.code == 409
    assert "concurrent policy changes" in caught.value.message

    ghost = policy_pb2.Policy(
        bindings=[
            policy_pb2.Binding(
                role="roles/secretmanager.secretAccessor",
                members=[f"serviceAccount:ghost-1@{sandbox_target.project}.iam.gserviceaccount.com"],
            )
        ]
    )
    with pytest.raises(exceptions.BadRequest, match="does not exist"):
        client.set_iam_policy(request={"resource": secret.name, "policy": ghost})
    assert client.get_iam_policy(request={"resource": secret.name}).etag == stored.etag


def test_403_fault_surfaces_as_permission_denied(client, parent, secret_id, sb):
    secret = make(client, parent, secret_id, b"x")
    sb.add_fault("control", path=f"/secrets/{secret_id}/versions/latest:access", status=403, times=1)
    with pytest.raises(exceptions.Forbidden):  # PermissionDenied is a Forbidden
        client.access_secret_version(name=f"{secret.name}/versions/latest")
    assert client.access_secret_version(name=f"{secret.name}/versions/latest").payload.data == b"x"


def test_429_then_success_with_a_retry(client, parent, secret_id, sb):
    secret = make(client, parent, secret_id, b"x")
    sb.add_fault("control", path=f"/secrets/{secret_id}/versions/latest:access", status=429, times=2)
    retry = Retry(predicate=if_exception_type(exceptions.TooManyRequests), **FAST_RETRY)
    answer = client.access_secret_version(name=f"{secret.name}/versions/latest", retry=retry)
    assert answer.payload.data == b"x"
    assert [f["fired"] for f in sb.faults()] == [2]


def test_create_that_another_caller_won(client, parent, secret_id, sb):
    """A "replace" fault: the create happens, the caller sees 409, and the secret is there."""
    sb.add_fault("control", path=r"/secrets$", method="POST", action="replace", status=409, times=1)
    with pytest.raises(exceptions.Conflict):
        make(client, parent, secret_id)
    assert client.get_secret(name=f"{parent}/secrets/{secret_id}").name == numbered(secret_id)


def test_admin_state_never_shows_payloads(client, parent, secret_id, sb):
    payload = f"hf_{uuid.uuid4().hex}".encode()
    secret = make(client, parent, secret_id, payload)
    response = sb.admin.get("/secretmanager/state")
    assert response.status_code == 200
    text = response.text
    assert payload.decode() not in text and base64.b64encode(payload).decode() not in text
    assert str(crc(payload)) not in text
    entry = next(s for s in response.json()["secrets"] if s["name"] == secret.name)
    assert [v["state"] for v in entry["versions"]] == ["ENABLED"]
    assert "payload" not in entry["versions"][0]


def test_python_api_for_other_modules(tmp_path):
    """What Cloud Run calls through ctx.module("secretmanager") to resolve secret env vars."""
    config = SandboxConfig(iam_propagation_seconds=0)  # the account below is bound at once
    ctx = ControlContext(config=config, faults=FaultRegistry(), state_dir=tmp_path, gcs_url="", gcs_emulator_url="")
    modules = [Iam(ctx), SecretManager(ctx)]
    ctx.modules.update({m.name: m for m in modules})
    app = Starlette(
        routes=[r for m in modules for r in m.routes()], exception_handlers={GoogleApiError: google_error_handler}
    )
    module: SecretManager = ctx.module("secretmanager")
    base = f"/v1/projects/{config.project}"
    with TestClient(app) as http:
        sa = http.post(f"{base}/serviceAccounts", json={"accountId": "vllm-serving"}).json()["email"]
        assert http.post(f"{base}/secrets?secretId=hf-token", json={"replication": {"automatic": {}}}).is_success
        assert module.exists("hf-token") and module.latest_value("hf-token") is None
        for data in (b"one", b"two"):
            added = http.post(
                f"{base}/secrets/hf-token:addVersion", json={"payload": {"data": base64.b64encode(data).decode()}}
            )
            assert added.is_success
        assert module.latest_value("hf-token") == b"two"
        assert module.latest_value(f"projects/{config.project}/secrets/hf-token") == b"two"
        assert module.value(f"projects/{DEFAULT_PROJECT_NUMBER}/secrets/hf-token/versions/1") == b"one"
        assert module.value("hf-token", "1") == b"one"
        assert module.version_info("hf-token")["name"].endswith("/versions/2")
        assert module.latest_value("projects/other-project/secrets/hf-token") is None
        assert module.latest_value("missing") is None

        assert module.policy("hf-token") == {"version": 1, "etag": "ACAB", "bindings": []}
        secret, access = f"projects/{config.project}/secrets/hf-token", "secretmanager.versions.access"
        assert not has_permission(ctx, f"serviceAccount:{sa}", access, secret)  # what a revision's start checks
        binding = {"role": "roles/secretmanager.secretAccessor", "members": [f"serviceAccount:{sa}"]}
        assert http.post(f"{base}/secrets/hf-token:setIamPolicy", json={"policy": {"bindings": [binding]}}).is_success
        assert module.policy("hf-token")["bindings"] == [binding]
        assert has_permission(ctx, f"serviceAccount:{sa}", access, secret)
        compute_default = f"serviceAccount:{DEFAULT_PROJECT_NUMBER}-compute@developer.gserviceaccount.com"
        assert not has_permission(ctx, compute_default, access, secret)

        assert http.post(f"{base}/secrets/hf-token/versions/2:disable", json={}).is_success
        assert module.latest_value("hf-token") is None  # Cloud Run would fail the revision, not fall back
        assert module.version_info("hf-token")["state"] == "DISABLED"
