"""IAM eventual consistency: a new service account is unknown to other APIs for a while, and the product waits.

The sandbox hides a new account from setIamPolicy elsewhere and from Cloud Run for ``iam_propagation_seconds``
(simulated); raw calls get the errors Google gives, the product's grant, deploy and build steps retry exactly
those errors and log why they wait.
"""

from __future__ import annotations

import itertools
import logging
import time
import uuid
from collections.abc import Iterator

import pytest
from google.api_core import exceptions as gexc
from google.cloud import run_v2
from google.cloud.devtools import cloudbuild_v1 as cb
from pydantic import SecretStr

from blocks import ImageBuild
from sandbox.identity import unique_id
from tasks.common import clients
from tasks.common.logs import PACKAGE_LOGGER
from tasks.deploy.cloudrun import deploy_candidate
from tasks.image.builds import build_image
from tasks.infra import access, build_identity, ensure
from tests.support.models import tiny_model_files, upload_model
from tests.support.services import gpu_service

_ids = itertools.count()
TOKEN = SecretStr("hf_propagationTestTokenValue0000000000")
VIEWER = "roles/storage.objectViewer"


@pytest.fixture
def target(sandbox_target):
    n = next(_ids)
    return sandbox_target.model_copy(
        update={
            "bucket": f"propagation-{n}",
            "artifact_repository": f"propagation-images-{n}",
            "service_account_name": f"fresh-sa-{n}",
            "hf_token_secret": f"propagation-token-{n}",
        }
    )


def waits_logged(caplog, email: str, seen_by: str) -> list[str]:
    wanted = f"service account {email}, or its new grant, is not visible to {seen_by} yet (IAM propagation"
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith(wanted)]


@pytest.fixture
def deployed(sb, target) -> Iterator[None]:
    """What earlier tests left idle holds nothing (Cloud Run's idle time has passed); the services the test deploys
    (named after its target's bucket) are deleted after it."""
    sb.run("POST", "/idle")
    yield
    services = clients.run_services(target)
    for service in services.list_services(parent=target.location_path):
        if service.name.rsplit("/", 1)[1].startswith(target.bucket):
            services.delete_service(name=service.name).result(polling=clients.operation_polling(target))


# The grants here are the new account's, tested for its visibility (iam_propagation); that they then take a while to
# count is test_a_build_right_after_its_account_gets_the_source_bucket_waits_for_the_grant's subject.
@pytest.mark.usefixtures("deployed", "grants_propagated")
def test_a_new_account_is_unknown_to_other_apis_until_iam_propagates(sb, target, iam_propagation):
    """Raw calls, no product waits: each API answers as Google's does, and the same calls pass once propagated."""
    storage = clients.storage(target)
    ensure.ensure_bucket(target)
    ensure.ensure_secret(target, TOKEN)
    ensure.ensure_artifact_registry(target)
    upload_model(storage, target.bucket_name, "models/tiny", tiny_model_files())
    iam_propagation(3600)  # an hour of simulated time: the window cannot close while this test runs
    ensure.ensure_service_account(target)
    email, member = target.service_account_email, f"serviceAccount:{target.service_account_email}"
    # The IAM API itself answers for the account at once.
    assert ensure.iam_call(target, "GET", f"projects/{target.project}/serviceAccounts/{email}")["email"] == email

    bucket = storage.bucket(target.bucket_name)

    def bind_bucket() -> None:
        policy = bucket.get_iam_policy(requested_policy_version=3)
        policy.bindings.append({"role": VIEWER, "members": {member}})
        bucket.set_iam_policy(policy)

    secret = ensure.secret_path(target)
    manager = clients.secret_manager(target)
    registry = clients.artifact_registry(target)
    repository = ensure.repository_path(target)
    one_binding = {"bindings": [{"role": "roles/secretmanager.secretAccessor", "members": [member]}]}
    reader = {"bindings": [{"role": "roles/artifactregistry.reader", "members": [member]}]}
    services = clients.run_services(target)
    spec = gpu_service(target.bucket_name)
    spec.template.service_account = email

    def deploy() -> run_v2.Service:
        operation = services.create_service(parent=target.location_path, service=spec, service_id=target.bucket)
        return operation.result(timeout=60, polling=clients.operation_polling(target))

    with pytest.raises(gexc.BadRequest) as storage_error:
        bind_bucket()
    assert storage_error.value.message.endswith(f"Service account {email} does not exist.")
    assert [e["reason"] for e in storage_error.value.errors] == ["invalid"]  # Storage's own error shape
    with pytest.raises(gexc.BadRequest, match=f"Service account {email} does not exist."):
        manager.set_iam_policy(request={"resource": secret, "policy": one_binding})
    with pytest.raises(gexc.BadRequest, match=f"Service account {email} does not exist."):
        registry.set_iam_policy(request={"resource": repository, "policy": reader})
    with pytest.raises(gexc.Forbidden) as run_error:
        deploy()
    assert run_error.value.message.endswith(
        f"Permission 'iam.serviceaccounts.actAs' denied on service account {email} (or it may not exist)."
    )

    iam_propagation(0)  # IAM has caught up: the very same calls succeed
    bind_bucket()
    manager.set_iam_policy(request={"resource": secret, "policy": one_binding})
    registry.set_iam_policy(request={"resource": repository, "policy": reader})
    revision = clients.run_revisions(target).get_revision(name=deploy().latest_ready_revision)
    assert revision.service_account == email
    assert any(member in b["members"] for b in bucket.get_iam_policy(requested_policy_version=3).bindings)


def test_grants_right_after_creating_the_account_wait_and_say_why(sb, target, iam_propagation, caplog):
    caplog.set_level(logging.INFO, logger=PACKAGE_LOGGER)
    ensure.ensure_bucket(target)
    ensure.ensure_secret(target, TOKEN)
    iam_propagation(200)  # 2 s at the default clock: far longer than the calls between create and grant take
    since = sb.last_request_seq()
    assert ensure.ensure_service_account(target).action == "created"
    assert access.grant_bucket_object_viewer(target).changes == [f"granted {VIEWER}"]
    assert access.grant_secret_accessor(target).action == "updated"
    email = target.service_account_email
    assert waits_logged(caplog, email, "Cloud Storage")  # it waited, and said why
    assert not waits_logged(caplog, email, "Secret Manager")  # by then IAM had propagated the account
    puts = [r["status"] for r in sb.requests("gcs", since=since) if r["method"] == "PUT" and r["path"].endswith("/iam")]
    assert puts[0] == 400 and puts[-1] == 200  # refused while unknown, then accepted


@pytest.mark.usefixtures("deployed")
def test_a_deploy_naming_a_new_account_waits_for_cloud_run_to_see_it(sb, target, iam_propagation, caplog):
    caplog.set_level(logging.INFO, logger=PACKAGE_LOGGER)
    ensure.ensure_bucket(target)
    # This test's own bucket, readable by any account: the new one cannot be granted it before IAM knows it.
    upload_model(clients.storage(target), target.bucket_name, "models/tiny", tiny_model_files(),
                 readers=["allAuthenticatedUsers"])  # fmt: skip
    service_id = f"{target.bucket}-svc"
    spec = gpu_service(target.bucket_name)
    spec.template.service_account = target.service_account_email
    spec.template.revision = f"{service_id}-first"
    iam_propagation(200)
    since = sb.last_request_seq()
    ensure.ensure_service_account(target)
    candidate = deploy_candidate(target, service_id, spec)
    assert candidate.first_deploy and candidate.revision == f"{service_id}-first"
    assert waits_logged(caplog, target.service_account_email, "Cloud Run")
    creates = [
        r["status"]
        for r in sb.requests("control", since=since)
        if r["method"] == "POST" and r["path"].endswith("/services")
    ]
    assert creates[0] == 403 and creates[-1] == 200


def test_an_account_that_never_appears_fails_with_the_fix_after_the_deadline(sb, target):
    """The wait is bounded: an account that never shows up ends in an error naming both causes and the fix."""
    from tasks.common.gcp import InfraError
    from tasks.infra.propagation import when_visible

    ghost = f"never-created@{target.project}.iam.gserviceaccount.com"
    spec = gpu_service(target.bucket_name)
    spec.template.service_account = ghost
    services = clients.run_services(target)
    with pytest.raises(InfraError, match=r"still not visible to Cloud Run after 2 s.*roles/iam.serviceAccountUser"):
        when_visible(
            lambda: services.create_service(parent=target.location_path, service=spec, service_id=target.bucket),
            ghost,
            "Cloud Run",
            deadline_s=2,
        )


def test_a_build_as_a_new_build_identity_waits_for_cloud_build_to_see_it(sb, target, iam_propagation, caplog, tmp_path):
    """Cloud Build refuses a build run as an account it cannot see yet, as it refuses a caller without actAs; the
    product's build waits for it, says why, and then builds."""
    caplog.set_level(logging.INFO, logger=PACKAGE_LOGGER)
    target = target.model_copy(update={"build_service_account_name": f"fresh-build-{next(_ids)}"})
    ensure.ensure_bucket(target)
    ensure.ensure_build_bucket(target)
    ensure.ensure_artifact_registry(target)
    (tmp_path / "Dockerfile").write_text("FROM python:3.12-slim\nCOPY app.py /app/app.py\n")
    (tmp_path / "app.py").write_text(f"print({uuid.uuid4().hex!r})\n")  # a new content tag: never found built
    app = ImageBuild(source_dir=str(tmp_path), image_name="app", max_jobs_ladder=[8])
    account, email = build_identity.build_account_resource(target), target.build_service_account_email
    scale = sb.configure()["time_scale"]

    iam_propagation(3600)  # an hour of simulated time: the window cannot close during the raw call
    created = time.monotonic()
    assert build_identity.ensure_build_service_account(target).action == "created"
    raw = cb.Build(
        steps=[cb.BuildStep(name="gcr.io/cloud-builders/docker", args=["version"])],
        service_account=account,
        options=cb.BuildOptions(logging=cb.BuildOptions.LoggingMode.CLOUD_LOGGING_ONLY),
    )
    with pytest.raises(gexc.Forbidden) as refused:
        clients.cloud_build(target).create_build(parent=target.location_path, build=raw)
    # Cloud Build's words name the account by its numeric unique id (BusyaPrime/Operator-OS-Dev's CI log).
    assert refused.value.message.endswith(
        ": generic::permission_denied: caller does not have permission to act as service account "
        f"projects/{target.project}/serviceAccounts/{unique_id(email)}."
    )

    # The grants go through as if IAM had caught up (they have their own waits, tested above); then the window,
    # counted from the account's creation, is set to close 1.5 s from now: Cloud Build has not caught up yet.
    iam_propagation(0)
    build_identity.ensure_build_identity(target)
    iam_propagation((time.monotonic() - created + 1.5) / scale)
    since = sb.last_request_seq()
    result = build_image(target, app)
    assert [a.status for a in result.attempts] == ["SUCCESS"]
    assert waits_logged(caplog, email, "Cloud Build")  # it waited, and said why
    creates = [
        r["status"]
        for r in sb.requests("control", since=since)
        if r["method"] == "POST" and r["path"].endswith("/builds")
    ]
    assert creates[0] == 403 and creates[-1] == 200  # refused while unseen, then accepted


def test_a_build_right_after_its_account_gets_the_source_bucket_waits_for_the_grant(
    sb, target, iam_propagation, grant_propagation, caplog, tmp_path
):
    """Cloud Build reads the source as the build's account when the build is created: right after the account was
    granted the bucket, the grant has not taken effect and the create answers 400 (DefangLabs/pulumi-defang issue
    115); the product's build waits for it, says why, and then builds."""
    caplog.set_level(logging.INFO, logger=PACKAGE_LOGGER)
    target = target.model_copy(update={"build_service_account_name": f"granted-build-{next(_ids)}"})
    ensure.ensure_bucket(target)
    ensure.ensure_build_bucket(target)
    ensure.ensure_artifact_registry(target)
    (tmp_path / "Dockerfile").write_text("FROM python:3.12-slim\nCOPY app.py /app/app.py\n")
    (tmp_path / "app.py").write_text(f"print({uuid.uuid4().hex!r})\n")
    app = ImageBuild(source_dir=str(tmp_path), image_name="app", max_jobs_ladder=[8])
    email = target.build_service_account_email
    iam_propagation(0)  # the account itself is known everywhere at once: only the grant lags
    grant_propagation(150)  # 1.5 s at the default clock, past the upload of the source
    build_identity.ensure_build_identity(target)
    since = sb.last_request_seq()
    result = build_image(target, app)
    assert [a.status for a in result.attempts] == ["SUCCESS"]
    assert waits_logged(caplog, email, "Cloud Build")
    creates = [
        r for r in sb.requests("control", since=since) if r["method"] == "POST" and r["path"].endswith("/builds")
    ]
    assert creates[0]["status"] == 400 and creates[-1]["status"] == 200
