"""IAM stand-in: service accounts through the IAM REST API, as tasks.common.clients.iam() reaches it.

iam_admin_v1 has no REST transport (FACTS.md), so these tests use the same AuthorizedSession the product
uses and check the JSON and error codes of the real API.
"""

from __future__ import annotations

import uuid

import pytest
import requests
from google.api_core import exceptions
from google.api_core.retry import Retry, if_exception_type

from sandbox.config import SandboxConfig
from sandbox.control import ControlContext
from sandbox.control.iam import DEFAULT_PROJECT_NUMBER, Iam
from sandbox.faults import FaultRegistry
from tasks.common import clients

COMPUTE_DEFAULT = f"{DEFAULT_PROJECT_NUMBER}-compute@developer.gserviceaccount.com"


@pytest.fixture(scope="module")
def iam(sandbox_target) -> clients.GoogleRest:
    return clients.iam(sandbox_target)


@pytest.fixture(scope="module")
def project(sandbox_target) -> str:
    return sandbox_target.project


def new_id(prefix: str = "sa") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def create(iam: clients.GoogleRest, project: str, account_id: str, **fields: str) -> requests.Response:
    return iam.session.post(
        iam.url(f"projects/{project}/serviceAccounts"), json={"accountId": account_id, "serviceAccount": fields}
    )


def account_url(iam: clients.GoogleRest, project: str, key: str, verb: str = "") -> str:
    return iam.url(f"projects/{project}/serviceAccounts/{key}") + (f":{verb}" if verb else "")


def error(response: requests.Response) -> dict:
    return response.json()["error"]


def test_create_get_and_delete_a_service_account(iam, project):
    account_id = new_id()
    created = create(iam, project, account_id, displayName="Serving", description="runs vLLM")
    assert created.status_code == 200, created.text
    body = created.json()
    email = f"{account_id}@{project}.iam.gserviceaccount.com"
    assert body["email"] == email
    assert body["name"] == f"projects/{project}/serviceAccounts/{email}"
    assert body["projectId"] == project
    assert len(body["uniqueId"]) == 21 and body["uniqueId"].isdigit()
    assert body["oauth2ClientId"] == body["uniqueId"]
    assert body["displayName"] == "Serving" and body["description"] == "runs vLLM"
    assert body["etag"]
    assert "disabled" not in body  # false is omitted, as on GCP

    # By email, by unique id, and with the "-" project wildcard.
    for project_part, key in ((project, email), (project, body["uniqueId"]), ("-", email)):
        got = iam.session.get(account_url(iam, project_part, key))
        assert got.status_code == 200, got.text
        assert got.json()["uniqueId"] == body["uniqueId"]

    assert iam.session.delete(account_url(iam, project, email)).json() == {}
    missing = iam.session.get(account_url(iam, project, email))
    assert missing.status_code == 404
    assert error(missing) == {"code": 404, "message": "Unknown service account", "status": "NOT_FOUND"}

    # Re-creating the same id gives a new account with a new unique id.
    again = create(iam, project, account_id)
    assert again.status_code == 200
    assert again.json()["uniqueId"] != body["uniqueId"]


def test_list_pages_through_every_account(iam, project):
    emails = {create(iam, project, new_id("lst")).json()["email"] for _ in range(3)}
    seen: list[str] = []
    token = ""
    while True:
        params = {"pageSize": 2, **({"pageToken": token} if token else {})}
        page = iam.session.get(iam.url(f"projects/{project}/serviceAccounts"), params=params).json()
        assert len(page.get("accounts", [])) <= 2
        seen += [a["email"] for a in page.get("accounts", [])]
        token = page.get("nextPageToken", "")
        if not token:
            break
    assert emails <= set(seen)
    assert COMPUTE_DEFAULT in seen
    assert len(seen) == len(set(seen))


def test_duplicate_account_is_409_already_exists(iam, project):
    account_id = new_id()
    assert create(iam, project, account_id).status_code == 200
    duplicate = create(iam, project, account_id)
    assert duplicate.status_code == 409
    assert error(duplicate)["status"] == "ALREADY_EXISTS"
    assert error(duplicate)["message"] == (
        f"Service account {account_id} already exists within project projects/{project}."
    )


@pytest.mark.parametrize(
    ("account_id", "message"),
    [
        ("short", 'The account ID "short" does not have a length between 6 and 30.'),
        ("a" * 31, f'The account ID "{"a" * 31}" does not have a length between 6 and 30.'),
        ("Upper-case", "does not match"),
        ("1starts-with-digit", "does not match"),
        ("ends-with-hyphen-", "does not match"),
        ("under_score", "does not match"),
    ],
)
def test_bad_account_id_is_400(iam, project, account_id, message):
    response = create(iam, project, account_id)
    assert response.status_code == 400
    assert error(response)["status"] == "INVALID_ARGUMENT"
    assert message in error(response)["message"]


def test_missing_account_and_foreign_project(iam, project):
    missing = f"nobody-{uuid.uuid4().hex[:6]}@{project}.iam.gserviceaccount.com"
    assert iam.session.get(account_url(iam, project, missing)).status_code == 404
    assert iam.session.delete(account_url(iam, project, missing)).status_code == 404
    # Documented: with "-" a missing account is 403, not 404.
    assert iam.session.get(account_url(iam, "-", missing)).status_code == 403
    foreign = create(iam, "someone-elses-project", new_id())
    assert foreign.status_code == 403
    assert error(foreign)["status"] == "PERMISSION_DENIED"


def test_compute_default_service_account_exists(iam, project, sb):
    got = iam.session.get(account_url(iam, project, COMPUTE_DEFAULT))
    assert got.status_code == 200
    assert got.json()["displayName"] == "Compute Engine default service account"
    state = sb.admin.get("/iam/state").json()
    assert state["computeDefaultServiceAccount"] == COMPUTE_DEFAULT
    assert COMPUTE_DEFAULT in {a["email"] for a in state["serviceAccounts"]}


def test_patch_needs_an_update_mask(iam, project):
    email = create(iam, project, new_id(), displayName="Old", description="keep").json()["email"]
    patched = iam.session.patch(
        account_url(iam, project, email),
        json={"serviceAccount": {"displayName": "New", "description": "ignored"}, "updateMask": "displayName"},
    )
    assert patched.status_code == 200, patched.text
    assert patched.json()["displayName"] == "New"
    assert patched.json()["description"] == "keep"
    no_mask = iam.session.patch(account_url(iam, project, email), json={"serviceAccount": {"displayName": "X"}})
    assert no_mask.status_code == 400
    assert iam.session.get(account_url(iam, project, email)).json()["displayName"] == "New"


def test_disable_and_enable(iam, project):
    email = create(iam, project, new_id()).json()["email"]
    assert iam.session.post(account_url(iam, project, email, "disable")).status_code == 200
    assert iam.session.get(account_url(iam, project, email)).json()["disabled"] is True
    assert iam.session.post(account_url(iam, project, email, "enable")).status_code == 200
    assert "disabled" not in iam.session.get(account_url(iam, project, email)).json()


def test_service_account_iam_policy_read_modify_write(iam, project):
    email = create(iam, project, new_id()).json()["email"]
    get_url = account_url(iam, project, email, "getIamPolicy")
    set_url = account_url(iam, project, email, "setIamPolicy")

    empty = iam.session.post(get_url, json={})
    assert empty.status_code == 200
    assert empty.json() == {"version": 1, "etag": "ACAB"}  # no "bindings" key while empty, as on GCP

    policy = empty.json()
    policy["bindings"] = [{"role": "roles/iam.serviceAccountUser", "members": ["user:deployer@example.com"]}]
    updated = iam.session.post(set_url, json={"policy": policy})
    assert updated.status_code == 200, updated.text
    assert updated.json()["etag"] != "ACAB"
    assert iam.session.post(get_url, json={}).json()["bindings"] == policy["bindings"]

    stale = iam.session.post(set_url, json={"policy": {**policy, "bindings": []}})  # still carries "ACAB"
    assert stale.status_code == 409
    assert error(stale)["status"] == "ABORTED"

    ghost = f"ghost-{uuid.uuid4().hex[:6]}@{project}.iam.gserviceaccount.com"
    bad_member = iam.session.post(
        set_url,
        json={
            "policy": {"bindings": [{"role": "roles/iam.serviceAccountUser", "members": [f"serviceAccount:{ghost}"]}]}
        },
    )
    assert bad_member.status_code == 400
    assert error(bad_member)["message"] == f"Service account {ghost} does not exist."


def test_429_then_success_with_a_retry(iam, project, sb):
    account_id = new_id()
    sb.add_fault("control", path=f"/serviceAccounts/{account_id}@", method="GET", status=429, times=1)
    email = create(iam, project, account_id).json()["email"]

    def get() -> dict:
        response = iam.session.get(account_url(iam, project, email))
        if response.status_code >= 400:
            raise exceptions.from_http_response(response)
        return response.json()

    retry = Retry(predicate=if_exception_type(exceptions.TooManyRequests), initial=0.01, maximum=0.05, timeout=10)
    assert retry(get)()["email"] == email
    assert [f["fired"] for f in sb.faults()] == [1]


def test_403_fault_surfaces_as_forbidden(iam, project, sb):
    account_id = new_id()
    sb.add_fault("control", path=r"/serviceAccounts$", method="POST", status=403, times=1)
    response = create(iam, project, account_id)
    assert response.status_code == 403
    with pytest.raises(exceptions.Forbidden):
        raise exceptions.from_http_response(response)
    assert create(iam, project, account_id).status_code == 200


def test_python_api_for_other_modules(tmp_path):
    config = SandboxConfig()
    ctx = ControlContext(config=config, faults=FaultRegistry(), state_dir=tmp_path, gcs_url="", gcs_emulator_url="")
    module = Iam(ctx)
    assert module.exists(COMPUTE_DEFAULT)
    assert module.exists(f"serviceAccount:{COMPUTE_DEFAULT}")
    assert not module.exists(f"vllm-serving@{config.project}.iam.gserviceaccount.com")
    assert module.get(COMPUTE_DEFAULT)["projectId"] == config.project
    assert module.get("nobody@example.com") is None
    assert module.compute_default_email == COMPUTE_DEFAULT
