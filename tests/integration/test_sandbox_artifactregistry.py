"""Artifact Registry stand-in and the shared operation store, through the real artifactregistry_v1 REST client."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import uuid

import httpx
import pytest
from google.api_core import exceptions, operation
from google.cloud import artifactregistry_v1 as ar
from google.iam.v1 import policy_pb2
from google.longrunning import operations_pb2
from google.protobuf import field_mask_pb2, json_format

from sandbox.config import SandboxConfig
from sandbox.control import ControlContext
from sandbox.control.errors import GoogleApiError
from sandbox.control.operations import Operations, operation_json
from sandbox.faults import FaultRegistry
from tasks.common import clients

Scanning = ar.Repository.VulnerabilityScanningConfig
_ids = itertools.count()
DIGEST_A = "sha256:" + "a" * 64
DIGEST_B = "sha256:" + "b" * 64


@pytest.fixture(scope="module")
def registry(sandbox_target) -> ar.ArtifactRegistryClient:
    return clients.artifact_registry(sandbox_target)


@pytest.fixture
def polling(sandbox_target):
    return clients.operation_polling(sandbox_target)


@pytest.fixture
def repo_id(registry, sandbox_target, polling):
    """A fresh repository id, deleted afterwards if the test left it behind."""
    repository_id = f"ar-{next(_ids)}-{uuid.uuid4().hex[:6]}"
    yield repository_id
    with contextlib.suppress(exceptions.NotFound):
        registry.delete_repository(name=f"{sandbox_target.location_path}/repositories/{repository_id}").result(
            polling=polling
        )


def docker_repository(**fields) -> ar.Repository:
    return ar.Repository(
        format_=ar.Repository.Format.DOCKER,
        description="vLLM serving images",
        labels={"managed-by": "hf-cloudrun-pipeline"},
        vulnerability_scanning_config=Scanning(enablement_config=Scanning.EnablementConfig.INHERITED),
        **fields,
    )


def create(registry, target, polling, repository_id: str, repository: ar.Repository | None = None) -> ar.Repository:
    operation = registry.create_repository(
        parent=target.location_path, repository=repository or docker_repository(), repository_id=repository_id
    )
    return operation.result(timeout=30, polling=polling)


def record_image(sb, repository: str, image: str, **fields) -> dict:
    response = sb.admin.post("/artifactregistry/images", json={"repository": repository, "image": image, **fields})
    response.raise_for_status()
    return response.json()


def find_image(sb, reference: str) -> dict | None:
    response = sb.admin.get("/artifactregistry/find", params={"ref": reference})
    return response.json() if response.status_code == 200 else None


# Repositories -------------------------------------------------------------------------------------------------
def test_create_docker_repository_polls_an_operation_and_reads_back(sb, registry, sandbox_target, polling, repo_id):
    since = sb.last_request_seq()
    operation = registry.create_repository(
        parent=sandbox_target.location_path, repository=docker_repository(), repository_id=repo_id
    )
    assert not operation.operation.done  # a real operation: the client has to poll it
    created = operation.result(timeout=30, polling=polling)
    name = f"{sandbox_target.location_path}/repositories/{repo_id}"
    assert created.name == name
    assert created.format_ == ar.Repository.Format.DOCKER
    assert created.mode == ar.Repository.Mode.STANDARD_REPOSITORY
    assert dict(created.labels) == {"managed-by": "hf-cloudrun-pipeline"}
    scanning = created.vulnerability_scanning_config
    assert scanning.enablement_config == Scanning.EnablementConfig.INHERITED
    assert scanning.enablement_state == Scanning.EnablementState.SCANNING_ACTIVE
    assert scanning.enablement_state_reason
    assert created.create_time and created.update_time
    assert created.registry_uri == f"{sandbox_target.region}-docker.pkg.dev/{sandbox_target.project}/{repo_id}"
    polls = [r for r in sb.requests("control", since) if "/operations/" in r["path"] and r["method"] == "GET"]
    assert 1 <= len(polls) <= 10

    fetched = registry.get_repository(name=name)
    assert fetched == created


def test_scanning_disabled_is_reported_as_disabled(registry, sandbox_target, polling, repo_id):
    spec = docker_repository()
    spec.vulnerability_scanning_config = Scanning(enablement_config=Scanning.EnablementConfig.DISABLED)
    created = create(registry, sandbox_target, polling, repo_id, spec)
    assert created.vulnerability_scanning_config.enablement_state == Scanning.EnablementState.SCANNING_DISABLED


def test_duplicate_create_conflicts(registry, sandbox_target, polling, repo_id):
    create(registry, sandbox_target, polling, repo_id)
    with pytest.raises(exceptions.Conflict, match="the repository already exists"):
        create(registry, sandbox_target, polling, repo_id)


@pytest.mark.parametrize("bad_id", ["Upper-case", "1starts-with-digit", "under_score", "ends-with-hyphen-", "a" * 64])
def test_invalid_repository_ids_are_refused(registry, sandbox_target, bad_id):
    with pytest.raises(exceptions.BadRequest, match="Invalid repository ID"):
        registry.create_repository(
            parent=sandbox_target.location_path, repository=docker_repository(), repository_id=bad_id
        )


def test_location_must_be_a_region_and_project_must_be_ours(registry, sandbox_target):
    with pytest.raises(exceptions.BadRequest, match="location"):
        registry.create_repository(
            parent=f"projects/{sandbox_target.project}/locations/us-central1-a",
            repository=docker_repository(),
            repository_id="zonal",
        )
    with pytest.raises(exceptions.Forbidden, match=r"artifactregistry\.repositories\.get"):
        registry.get_repository(name="projects/someone-else/locations/us-central1/repositories/x")


def test_format_is_required(registry, sandbox_target):
    with pytest.raises(exceptions.BadRequest, match="format"):
        registry.create_repository(
            parent=sandbox_target.location_path, repository=ar.Repository(), repository_id="no-format"
        )


def test_missing_repository_is_not_found(registry, sandbox_target):
    with pytest.raises(exceptions.NotFound, match="Requested entity was not found"):
        registry.get_repository(name=f"{sandbox_target.location_path}/repositories/never-created")


def test_update_labels_with_a_field_mask(registry, sandbox_target, polling, repo_id):
    created = create(registry, sandbox_target, polling, repo_id)
    change = ar.Repository(name=created.name, labels={"team": "ml", "cost-center": "42"}, description="ignored")
    updated = registry.update_repository(repository=change, update_mask=field_mask_pb2.FieldMask(paths=["labels"]))
    assert dict(updated.labels) == {"team": "ml", "cost-center": "42"}
    assert updated.description == "vLLM serving images"  # not in the mask
    assert updated.update_time > created.update_time
    assert registry.get_repository(name=created.name) == updated

    with pytest.raises(exceptions.BadRequest, match="immutable"):
        registry.update_repository(
            repository=ar.Repository(name=created.name, format_=ar.Repository.Format.PYTHON),
            update_mask=field_mask_pb2.FieldMask(paths=["format"]),
        )
    disabled = registry.update_repository(
        repository=ar.Repository(
            name=created.name,
            vulnerability_scanning_config=Scanning(enablement_config=Scanning.EnablementConfig.DISABLED),
        ),
        update_mask=field_mask_pb2.FieldMask(paths=["vulnerability_scanning_config.enablement_config"]),
    )
    assert disabled.vulnerability_scanning_config.enablement_state == Scanning.EnablementState.SCANNING_DISABLED
    assert dict(disabled.labels) == {"team": "ml", "cost-center": "42"}


def test_iam_policy_read_modify_write_and_stale_etag(registry, sandbox_target, polling, repo_id):
    name = create(registry, sandbox_target, polling, repo_id).name
    first = registry.get_iam_policy(request={"resource": name})
    assert first.etag and not first.bindings
    member = "user:ml-dev@example.com"  # a user: the test needs no service account (and so no IAM propagation)
    wanted = policy_pb2.Policy(
        etag=first.etag, bindings=[policy_pb2.Binding(role="roles/artifactregistry.reader", members=[member])]
    )
    written = registry.set_iam_policy(request={"resource": name, "policy": wanted})
    assert written.etag != first.etag
    read = registry.get_iam_policy(request={"resource": name})
    assert [(b.role, list(b.members)) for b in read.bindings] == [("roles/artifactregistry.reader", [member])]
    assert read.etag == written.etag

    stale = policy_pb2.Policy(etag=first.etag, bindings=[])
    with pytest.raises(exceptions.Conflict, match="concurrent policy changes"):
        registry.set_iam_policy(request={"resource": name, "policy": stale})
    assert registry.get_iam_policy(request={"resource": name}).etag == written.etag


def test_delete_is_an_operation_and_then_not_found(registry, sandbox_target, polling, repo_id):
    name = create(registry, sandbox_target, polling, repo_id).name
    registry.delete_repository(name=name).result(timeout=30, polling=polling)
    with pytest.raises(exceptions.NotFound):
        registry.get_repository(name=name)
    with pytest.raises(exceptions.NotFound):
        registry.delete_repository(name=name)


def test_list_repositories_pages_through_all(registry, sandbox_target, polling):
    ids = [f"ar-list-{uuid.uuid4().hex[:6]}-{i}" for i in range(3)]
    try:
        for repository_id in ids:
            create(registry, sandbox_target, polling, repository_id)
        names = {f"{sandbox_target.location_path}/repositories/{i}" for i in ids}
        listed = [r.name for r in registry.list_repositories(parent=sandbox_target.location_path)]
        assert names <= set(listed)
        paged = registry.list_repositories(request={"parent": sandbox_target.location_path, "page_size": 1})
        assert [r.name for r in paged] == listed
    finally:
        for repository_id in ids:
            with contextlib.suppress(exceptions.NotFound):
                registry.delete_repository(name=f"{sandbox_target.location_path}/repositories/{repository_id}")


# Docker images ----------------------------------------------------------------------------------------------
def test_recorded_images_are_listed_and_found_by_tag_and_digest(sb, registry, sandbox_target, polling, repo_id):
    repo = create(registry, sandbox_target, polling, repo_id)
    host = f"{sandbox_target.region}-docker.pkg.dev/{sandbox_target.project}/{repo_id}"
    old = record_image(sb, repo_id, "team/vllm", digest=DIGEST_A, tags=["v1", "latest"], sizeBytes=1000)
    assert old["uri"] == f"{host}/team/vllm@{DIGEST_A}"
    assert old["name"] == f"{repo.name}/dockerImages/team%2Fvllm@{DIGEST_A}"
    new = record_image(sb, repo_id, "team/vllm", digest=DIGEST_B, tags=["v2", "latest"], sizeBytes=3000)

    images = {i.uri: i for i in registry.list_docker_images(parent=repo.name)}
    assert set(images) == {old["uri"], new["uri"]}
    assert sorted(images[old["uri"]].tags) == ["v1"]  # "latest" moved to the newer push
    assert sorted(images[new["uri"]].tags) == ["latest", "v2"]
    assert images[new["uri"]].image_size_bytes == 3000
    assert images[new["uri"]].media_type and images[new["uri"]].upload_time and images[new["uri"]].build_time
    got = registry.get_docker_image(name=new["name"])
    assert got.uri == new["uri"]

    assert find_image(sb, f"{host}/team/vllm:v1")["uri"] == old["uri"]
    assert find_image(sb, f"{host}/team/vllm")["uri"] == new["uri"]  # no tag means latest
    assert find_image(sb, f"{host}/team/vllm@{DIGEST_A}")["uri"] == old["uri"]
    assert find_image(sb, f"{host}/team/vllm:v9") is None
    assert find_image(sb, f"{host}/team/other:v1") is None
    assert find_image(sb, f"europe-west4-docker.pkg.dev/{sandbox_target.project}/{repo_id}/team/vllm:v1") is None

    package = f"{repo.name}/packages/team%2Fvllm"
    tags = {t.name.rsplit("/", 1)[1]: t.version for t in registry.list_tags(parent=package)}
    assert tags == {"v1": f"{package}/versions/{DIGEST_A}", "latest": f"{package}/versions/{DIGEST_B}",
                    "v2": f"{package}/versions/{DIGEST_B}"}  # fmt: skip
    assert registry.get_tag(name=f"{package}/tags/latest").version == f"{package}/versions/{DIGEST_B}"
    with pytest.raises(exceptions.NotFound):
        registry.get_tag(name=f"{package}/tags/v9")
    assert registry.get_repository(name=repo.name).size_bytes == 4000


def test_recording_into_a_missing_repository_fails(sb):
    response = sb.admin.post("/artifactregistry/images", json={"repository": "no-such-repo", "image": "vllm"})
    assert response.status_code == 404


# Operations -------------------------------------------------------------------------------------------------
def test_operations_get_and_cancel_over_rest_and_nothing_else(registry, sandbox_target, polling, repo_id):
    operation = registry.create_repository(
        parent=sandbox_target.location_path, repository=docker_repository(), repository_id=repo_id
    )
    operation.result(polling=polling)
    name = operation.operation.name
    base = sandbox_target.endpoints.artifactregistry
    done = httpx.get(f"{base}/v1/{name}").json()
    assert done["done"] is True
    assert done["response"]["@type"] == "type.googleapis.com/google.devtools.artifactregistry.v1.Repository"
    assert done["response"]["name"].endswith(f"/repositories/{repo_id}")
    assert done["metadata"]["@type"].endswith("artifactregistry.v1.OperationMetadata")
    assert httpx.post(f"{base}/v1/{name}:cancel", json={}).json() == {}  # already done: nothing to cancel
    # Artifact Registry publishes only get and cancel for operations (artifactregistry.v1 discovery document):
    # wait, list and delete are URLs its front end does not serve.
    for refused in (
        httpx.post(f"{base}/v1/{name}:wait", json={"timeout": "10s"}),
        httpx.get(f"{base}/v1/{sandbox_target.location_path}/operations"),
        httpx.delete(f"{base}/v1/{name}"),
    ):
        assert refused.status_code == 404 and "was not found on this server" in refused.text
    other = httpx.get(f"{base}/v1/projects/someone-else/locations/us-central1/operations/x")
    assert other.status_code == 403


# Faults -----------------------------------------------------------------------------------------------------
def test_a_429_surfaces_as_too_many_requests_once(sb, registry, sandbox_target, polling, repo_id):
    name = create(registry, sandbox_target, polling, repo_id).name
    sb.add_fault("control", path=f"/repositories/{repo_id}$", method="GET", status=429, times=1)
    with pytest.raises(exceptions.TooManyRequests):
        registry.get_repository(name=name)
    assert registry.get_repository(name=name).name == name


def test_create_that_another_caller_won_conflicts_but_exists(sb, registry, sandbox_target, polling, repo_id):
    sb.add_fault("control", path=r"/repositories$", method="POST", action="replace", status=409, times=1)
    with pytest.raises(exceptions.Conflict):
        create(registry, sandbox_target, polling, repo_id)
    name = f"{sandbox_target.location_path}/repositories/{repo_id}"
    assert registry.get_repository(name=name).format_ == ar.Repository.Format.DOCKER


# The operation store's Python API (what Cloud Build will call), checked against google-api-core's parsing -----
def _store(tmp_path) -> Operations:
    ctx = ControlContext(
        config=SandboxConfig(), faults=FaultRegistry(), state_dir=tmp_path, gcs_url="", gcs_emulator_url=""
    )
    return Operations(ctx)


def _as_client_sees_it(store: Operations, name: str) -> operation.Operation:
    """The operation as the REST client parses it (strictly), wrapped in the client's future."""
    snapshot = store.get(name)
    assert snapshot is not None
    parsed = json_format.Parse(json.dumps(operation_json(snapshot)), operations_pb2.Operation())
    return operation.Operation(
        parsed,
        refresh=lambda **_: parsed,
        cancel=lambda **_: None,
        result_type=ar.Repository,
        metadata_type=ar.OperationMetadata,
    )


def test_store_failure_maps_to_the_grpc_code(tmp_path):
    store = _store(tmp_path)
    op = store.create("projects/p/locations/us-central1", metadata=ar.OperationMetadata())
    assert op.name.startswith("projects/p/locations/us-central1/operations/") and not op.done
    assert store.fail(op.name, GoogleApiError(404, "Repository gone.", "NOT_FOUND"))
    assert not store.finish(op.name, ar.Repository(name="late"))  # a done operation stays as it ended
    with pytest.raises(exceptions.NotFound, match="Repository gone"):
        _as_client_sees_it(store, op.name).result()


def test_store_finish_later_wait_and_cancel(tmp_path):
    store = _store(tmp_path)
    cancelled: list[str] = []

    async def scenario() -> tuple[operations_pb2.Operation, operations_pb2.Operation]:
        finishing = store.create("projects/p/locations/us-central1")
        store.finish_later(finishing.name, ar.Repository(name="projects/p/locations/us-central1/repositories/r"), 0.01)
        done = await store.wait(finishing.name, timeout_s=5)
        running = store.create("projects/p/locations/us-central1", on_cancel=cancelled.append)
        assert store.cancel(running.name) and not store.cancel(running.name)
        return done, store.get(running.name)

    done, cancelled_op = asyncio.run(scenario())
    assert done.done
    assert _as_client_sees_it(store, done.name).result().name.endswith("/repositories/r")
    assert cancelled == [cancelled_op.name]
    with pytest.raises(exceptions.Cancelled):
        _as_client_sees_it(store, cancelled_op.name).result()
