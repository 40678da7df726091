"""Cloud Build runs as an identity that needs rights (issue 12): the sandbox enforces them, the product grants them.

New projects build as the Compute Engine default account with no role (the sandbox's default project policy);
the product builds as its own account, granted Storage Admin on a build bucket of its own (what Google's build logs
page asks of a user-chosen build account; objectViewer + objectCreator are refused at create), nothing on the model
bucket, and artifactregistry.writer on the repository. Needs the sandbox's permission model (sandbox.authz, H2).
"""

from __future__ import annotations

import itertools
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
from google.api_core import exceptions
from google.cloud.devtools import cloudbuild_v1 as cb

from blocks import GcpTarget, ImageBuild
from tasks.common import clients
from tasks.image.builds import ImageBuildError, build_image
from tasks.infra import build_identity, ensure

Status = cb.Build.Status
_ids = itertools.count()
DOCKERFILE = 'FROM python:3.12-slim\nCOPY app.py /app/app.py\nCMD ["python", "/app/app.py"]\n'


@pytest.fixture
def target(sandbox_target) -> GcpTarget:
    """Buckets, a repository and a build account of its own: no grant from another test applies."""
    n = f"{next(_ids)}-{uuid.uuid4().hex[:4]}"
    fresh = sandbox_target.model_copy(
        update={
            "bucket": f"build-id-{n}",
            "build_bucket": f"build-id-{n}-builds",
            "artifact_repository": f"build-id-{n}",
            "build_service_account_name": f"build-id-{n}",
        }
    )
    ensure.ensure_bucket(fresh)
    ensure.ensure_build_bucket(fresh)
    ensure.ensure_artifact_registry(fresh)
    return fresh


def roles_of(target: GcpTarget, bucket: str) -> set[str]:
    """The roles the build identity holds on ``bucket``."""
    policy = clients.storage(target).bucket(bucket).get_iam_policy(requested_policy_version=3)
    member = f"serviceAccount:{target.build_service_account_email}"
    return {b["role"] for b in policy.bindings if member in b["members"]}


def bind(target: GcpTarget, bucket: str, *roles: str) -> None:
    """Bind ``roles`` on ``bucket`` to the build identity, as a hand-made (or an earlier version's) grant would."""
    handle = clients.storage(target).bucket(bucket)
    policy = handle.get_iam_policy(requested_policy_version=3)
    member = f"serviceAccount:{target.build_service_account_email}"
    policy.bindings.extend({"role": role, "members": {member}} for role in roles)
    handle.set_iam_policy(policy)


@pytest.fixture
def app(tmp_path: Path) -> ImageBuild:
    source = tmp_path / f"app-{next(_ids)}"
    source.mkdir()
    (source / "Dockerfile").write_text(DOCKERFILE)
    (source / "app.py").write_text(f"print({uuid.uuid4().hex!r})\n")  # a new content tag: never found built
    return ImageBuild(source_dir=str(source), image_name="app", max_jobs_ladder=[8])


def finished_build(target: GcpTarget, build_id: str) -> cb.Build:
    return clients.cloud_build(target).get_build(name=f"{target.build_location_path}/builds/{build_id}")


def test_a_build_as_the_dedicated_identity_succeeds(target, app):
    results = build_identity.ensure_build_identity(target)
    assert [(r.kind, r.action) for r in results] == [
        ("service-account", "created"),
        ("iam", "updated"),
        ("iam", "updated"),
        ("iam", "found"),  # nothing to remove from the model bucket
    ]
    assert results[1].changes == ["granted roles/storage.admin"]
    assert results[2].changes == [
        f"granted roles/artifactregistry.writer to serviceAccount:{target.build_service_account_email}"
    ]
    assert [r.action for r in build_identity.ensure_build_identity(target)] == ["found"] * 4  # idempotent
    assert roles_of(target, target.build_bucket_name) == {"roles/storage.admin"}
    assert roles_of(target, target.bucket_name) == set()  # builds never touch the weights

    result = build_image(target, app)
    # A new project: a push made before the repository's grant took effect is denied and built again on the same rung
    # (the next test); the last attempt is the one that pushed.
    *denied, attempt = result.attempts
    assert [(a.status, a.max_jobs) for a in denied] == [("FAILURE", attempt.max_jobs)] * len(denied)
    build = finished_build(target, attempt.build_id)
    assert build.status == Status.SUCCESS
    assert build.service_account == build_identity.build_account_resource(target)
    assert build.options.logging == cb.BuildOptions.LoggingMode.GCS_ONLY
    assert build.source.storage_source.bucket == target.build_bucket_name
    assert build.logs_bucket == f"gs://{target.build_bucket_name}/cloudbuild-logs"
    gcs = clients.storage(target)
    log = gcs.bucket(target.build_bucket_name).blob(f"cloudbuild-logs/log-{build.id}.txt")
    assert log.download_as_text().rstrip().endswith("DONE")  # written by the build identity to the build bucket
    assert list(gcs.list_blobs(target.bucket_name)) == []  # neither source nor log in the model bucket


def test_without_the_repository_grant_the_push_is_denied_and_the_error_names_the_grant(target, app):
    build_identity.ensure_build_service_account(target)
    build_identity.grant_build_bucket_access(target)  # the repository grant is missing
    with pytest.raises(ImageBuildError) as caught:
        build_image(target, app)
    repository = f"projects/{target.project}/locations/{target.region}/repositories/{target.artifact_repository}"
    message = str(caught.value)
    assert "ended FAILURE" in message
    # docker push's own line, in the log tail the error carries
    assert (
        f'denied: Permission "artifactregistry.repositories.uploadArtifacts" denied on resource "{repository}" '
        "(or it may not exist)"
    ) in message
    assert (
        f"fix: the build identity {target.build_service_account_email} may not push to the repository; grant it "
        "roles/artifactregistry.writer there (the ensure-infrastructure step does): `gcloud artifacts repositories "
        f"add-iam-policy-binding {target.artifact_repository} --project {target.project} --location {target.region} "
        f"--member serviceAccount:{target.build_service_account_email} --role roles/artifactregistry.writer`"
    ) in message


def test_a_push_denied_while_this_runs_repository_grant_propagates_is_built_again(sb, target, app, grant_propagation):
    """A new project: the writer role this run granted on the repository does not count yet when the build pushes
    (IAM "Access change propagation": typically 2 minutes), and docker push is denied. The build runs again on the same
    rung until the grant counts (tasks/infra/propagation.py), not failing a promotion that a rerun would pass. The
    window stays open until a push was denied, then closes: nothing depends on how long a build takes."""
    email = target.build_service_account_email
    build_identity.ensure_build_service_account(target)
    # The build bucket's rights held long since (a project role set through the sandbox's admin, outside any
    # propagation window): only the repository's grant is new here.
    held = sb.set_caller_roles(["roles/storage.admin"], member=f"serviceAccount:{email}")
    try:
        grant_propagation(10**9)  # no grant made from now on counts until the window closes below
        assert build_identity.grant_build_repository_writer(target).action == "updated"
        with ThreadPoolExecutor(1) as pool:
            building = pool.submit(build_image, target, app)
            first = wait_for_denied_push(target, email, building)
            grant_propagation(0)  # the grant has propagated
            result = building.result(timeout=600)
    finally:
        sb.set_caller_roles(held, member=f"serviceAccount:{email}")
    assert result.attempts[0].build_id == first.id
    *denied, pushed = result.attempts
    assert denied and [(a.status, a.max_jobs) for a in denied] == [("FAILURE", 8)] * len(denied)
    assert (pushed.status, pushed.max_jobs) == ("SUCCESS", 8)  # the same rung: no memory was short
    repository = f"projects/{target.project}/locations/{target.region}/repositories/{target.artifact_repository}"
    log = sb.admin.get(f"/cloudbuild/logs/{first.id}").text
    assert f'Permission "artifactregistry.repositories.uploadArtifacts" denied on resource "{repository}"' in log
    assert result.image.startswith(f"{target.region}-docker.pkg.dev/{target.project}/{target.artifact_repository}/")


def wait_for_denied_push(target: GcpTarget, email: str, building: Future) -> cb.Build:
    """The first build of ``email`` that ended FAILURE (its push denied), while ``building`` runs."""
    listed = cb.ListBuildsRequest(project_id=target.project, parent=target.build_location_path)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        builds = clients.cloud_build(target).list_builds(request=listed)
        failed = [b for b in builds if b.service_account.endswith(email) and b.status == Status.FAILURE]
        if failed:
            return min(failed, key=lambda b: b.create_time)
        if building.done():
            building.result()  # its error, when build_image gave up on the denied push
            raise AssertionError("build_image finished before any push was denied")
        time.sleep(0.1)
    raise AssertionError("no build of the account was denied its push in 300 s")


@pytest.mark.usefixtures("grants_propagated")  # binds by hand right before the build: no product wait for it
def test_without_read_access_to_the_source_the_create_is_refused(target, app):
    """Cloud Build reads the source object as the build's account when the build is created: without
    storage.objects.get the create answers 400 "could not resolve source" with Cloud Storage's 403 inside
    (google/mcp-security issue 132); no grant of this run explains it, so it fails at once, naming the fix."""
    build_identity.ensure_build_service_account(target)
    build_identity.grant_build_repository_writer(target)
    member = f"serviceAccount:{target.build_service_account_email}"
    # Enough for the create-time logs bucket check (buckets.get, objects.create), no objects.get.
    bind(target, target.build_bucket_name, "roles/storage.objectCreator", "roles/storage.legacyBucketReader")
    with pytest.raises(ImageBuildError) as caught:
        build_image(target, app)
    message = str(caught.value)
    assert (
        f"could not resolve source: googleapi: Error 403: {target.build_service_account_email} does not have "
        "storage.objects.get access to the Google Cloud Storage object. Permission 'storage.objects.get' denied on "
        "resource (or it may not exist)., forbidden"
    ) in message
    assert f"gs://{target.build_bucket_name} --member {member} --role roles/storage.admin" in message


@pytest.mark.usefixtures("grants_propagated")  # binds by hand: the refusal must be the roles', not the window's
def test_object_roles_on_the_logs_bucket_are_refused_at_create_and_storage_admin_builds(target, app):
    # The grant set of a990ab2 (objectViewer + objectCreator): Google's build logs page asks for Storage Admin for a
    # user-chosen build account, and the create is refused with Cloud Build's 400 before anything runs.
    build_identity.ensure_build_service_account(target)
    build_identity.grant_build_repository_writer(target)
    member = f"serviceAccount:{target.build_service_account_email}"
    bind(target, target.build_bucket_name, "roles/storage.objectViewer", "roles/storage.objectCreator")
    with pytest.raises(ImageBuildError) as caught:
        build_image(target, app)
    message = str(caught.value)
    refusal = f'invalid bucket "{target.build_bucket_name}"; builder service account does not have access to the bucket'
    assert refusal in message
    assert f"gs://{target.build_bucket_name} --member {member} --role roles/storage.admin" in message
    raw = cb.Build(  # the same create by hand: Cloud Build's status and message as they are
        steps=[cb.BuildStep(name="ubuntu", args=["true"])],
        service_account=build_identity.build_account_resource(target),
        logs_bucket=f"gs://{target.build_bucket_name}/cloudbuild-logs",
        options=cb.BuildOptions(logging=cb.BuildOptions.LoggingMode.GCS_ONLY),
    )
    with pytest.raises(exceptions.BadRequest) as refused:
        clients.cloud_build(target).create_build(parent=target.build_location_path, build=raw)
    assert refused.value.code == 400 and refused.value.message.endswith(refusal)
    listed = cb.ListBuildsRequest(project_id=target.project, parent=target.build_location_path)
    builds = clients.cloud_build(target).list_builds(request=listed)
    assert not [b for b in builds if b.service_account.endswith(target.build_service_account_email)]  # none ran

    assert build_identity.grant_build_bucket_access(target).changes == ["granted roles/storage.admin"]
    (attempt,) = build_image(target, app).attempts
    assert attempt.status == "SUCCESS"


def test_the_model_bucket_roles_of_an_earlier_version_are_removed(target, iam_propagated):
    build_identity.ensure_build_service_account(target)  # bound by hand right after: no propagation window here
    bind(target, target.bucket_name, "roles/storage.objectViewer", "roles/storage.objectCreator")
    results = build_identity.ensure_build_identity(target)
    assert sorted(results[3].changes) == ["removed roles/storage.objectCreator", "removed roles/storage.objectViewer"]
    assert roles_of(target, target.bucket_name) == set()
    assert roles_of(target, target.build_bucket_name) == {"roles/storage.admin"}


def test_a_build_as_the_default_identity_of_a_new_project_cannot_read_its_source(sb, target, app):
    # What the product did before it had a build identity: no serviceAccount, so the Compute default account,
    # which has no role in a new project.
    gcs = clients.storage(target)
    gcs.bucket(target.bucket_name).blob("src/app.tar.gz").upload_from_string(
        b"not read", content_type="application/gzip"
    )
    request = cb.Build(
        source=cb.Source(storage_source=cb.StorageSource(bucket=target.bucket_name, object_="src/app.tar.gz")),
        steps=[cb.BuildStep(name="gcr.io/cloud-builders/docker", args=["build", "."])],
        logs_bucket=f"gs://{target.bucket_name}/cloudbuild-logs",
    )
    default = f"{sb.configure()['project_number']}-compute@developer.gserviceaccount.com"
    with pytest.raises(exceptions.BadRequest, match=f'invalid bucket "{target.bucket_name}"; builder service account'):
        clients.cloud_build(target).create_build(parent=target.build_location_path, build=request)
    request.logs_bucket = ""  # Cloud Build's own logs bucket: the source fetch is what fails then
    operation = clients.cloud_build(target).create_build(parent=target.build_location_path, build=request)
    with pytest.raises(exceptions.GoogleAPICallError):
        operation.result(polling=clients.operation_polling(target), timeout=60)
    build = finished_build(target, operation.metadata.build.id)
    assert build.status == Status.FAILURE
    assert build.failure_info.type_ == cb.Build.FailureInfo.FailureType.FETCH_SOURCE_FAILED
    assert build.service_account == f"projects/{target.project}/serviceAccounts/{default}"
    log = sb.admin.get(f"/cloudbuild/logs/{build.id}").text
    assert f"AccessDeniedException: 403 {default} does not have storage.objects.get access" in log


def test_a_build_with_its_own_account_and_no_logging_option_gets_the_real_400(target, iam_propagated):
    build_identity.ensure_build_service_account(target)  # raw creates right after: no propagation window here
    request = cb.Build(
        steps=[cb.BuildStep(name="ubuntu", args=["true"])],
        service_account=build_identity.build_account_resource(target),
    )
    with pytest.raises(exceptions.BadRequest) as caught:
        clients.cloud_build(target).create_build(parent=target.build_location_path, build=request)
    assert caught.value.message.endswith(
        "if 'build.service_account' is specified, the build must either (a) specify 'build.logs_bucket', (b) use the "
        "REGIONAL_USER_OWNED_BUCKET build.options.default_logs_bucket_behavior option, or (c) use either "
        "CLOUD_LOGGING_ONLY / NONE logging options"
    )
    request.options.logging = cb.BuildOptions.LoggingMode.CLOUD_LOGGING_ONLY  # an explicit choice is accepted
    operation = clients.cloud_build(target).create_build(parent=target.build_location_path, build=request)
    assert operation.result(polling=clients.operation_polling(target), timeout=60).status == Status.SUCCESS
