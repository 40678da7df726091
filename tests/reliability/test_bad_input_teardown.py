"""Issue 14's loose ends: teardown deletes the Artifact Registry repository when asked, like the buckets; a service
name no Cloud Run service can have is refused by name instead of being reported "absent"; and promote-model's
generic-image guard knows the image however it is spelled.

End to end: the flows in-process against the sandbox, through the real clients.
"""

from __future__ import annotations

import contextlib
import itertools

import pytest
from google.api_core import exceptions as gexc

from blocks import GcpTarget
from flows.teardown import teardown
from tasks.common import clients
from tasks.common.naming import repository_host
from tasks.common.permissions import DEPLOYER_ROLES
from tasks.infra import ensure
from tests.support.bad_input import CLOUD, fails_cleanly, promote

pytestmark = pytest.mark.prefect
_ids = itertools.count()


def find_image(sb, reference: str) -> int:
    """The sandbox registry's answer for ``reference``: 200 when it holds the image, 404 when not."""
    return sb.admin.get("/artifactregistry/find", params={"ref": reference}).status_code


@pytest.fixture
def own_registry(sb, flow_env):
    """A target of its own whose repository holds a pushed image, so the session's shared repository stays."""
    n = next(_ids)
    name = f"td-registry-{n}"
    gcp = GcpTarget.model_validate({**flow_env.model_dump(), "artifact_repository": f"td-images-{n}"})
    gcp.save(name, overwrite=True)
    assert ensure.ensure_artifact_registry(gcp).action == "created"
    # What a build's `docker push` leaves (tasks/image/builds.py pushes built serving images here).
    pushed = sb.admin.post(
        "/artifactregistry/images",
        json={"repository": gcp.artifact_repository, "image": "vllm-cpu", "tags": ["v1"], "location": gcp.region},
    )
    pushed.raise_for_status()
    yield name, gcp
    registry = clients.artifact_registry(gcp)
    with contextlib.suppress(gexc.NotFound):  # a failed test may leave it behind
        registry.delete_repository(name=ensure.repository_path(gcp)).result(timeout=30)


def test_teardown_deletes_the_artifact_repository_only_when_asked(sb, own_registry):
    name, gcp = own_registry
    image = f"{repository_host(gcp)}/vllm-cpu:v1"
    registry = clients.artifact_registry(gcp)
    service = f"td-none-{next(_ids)}"

    assert [(r.kind, r.action) for r in teardown(service=service, target=name)] == [("service", "absent")]
    assert registry.get_repository(name=ensure.repository_path(gcp)).name == ensure.repository_path(gcp)  # opt-in

    since = sb.last_request_seq()
    results = teardown(service=service, target=name, artifact_repository=True)
    assert [(r.kind, r.action) for r in results] == [("service", "absent"), ("artifact-registry", "deleted")]
    assert results[-1].name == ensure.repository_path(gcp)
    deletes = [r for r in sb.requests("control", since=since) if r["method"] == "DELETE"]
    assert [r["path"] for r in deletes][-1] == f"/v1/{ensure.repository_path(gcp)}"
    with pytest.raises(gexc.NotFound):
        registry.get_repository(name=ensure.repository_path(gcp))
    assert find_image(sb, image) == 404  # its images went with it

    again = teardown(service=service, target=name, artifact_repository=True)  # idempotent
    assert [(r.kind, r.action) for r in again] == [("service", "absent"), ("artifact-registry", "absent")]


def test_the_readme_roles_delete_the_repository_and_repo_admin_falls_short(sb, own_registry):
    """The deployer roles (docs/first-run.md) hold artifactregistry.repositories.delete (Artifact Registry
    Administrator); the narrower Repository Administrator does not, and the teardown says which permission and role
    are missing."""
    name, gcp = own_registry
    roles = [need.role for need in DEPLOYER_ROLES]
    service = f"td-none-{next(_ids)}"
    narrower = [r for r in roles if r != "roles/artifactregistry.admin"] + ["roles/artifactregistry.repoAdmin"]
    with sb.caller_roles(narrower), pytest.raises(Exception) as caught:  # the text is what matters
        teardown(service=service, target=name, artifact_repository=True)
    message = str(caught.value)
    assert "missing permission artifactregistry.repositories.delete" in message, message
    assert "--role=roles/artifactregistry.admin" in message, message
    assert clients.artifact_registry(gcp).get_repository(name=ensure.repository_path(gcp))  # still there
    with sb.caller_roles(roles):
        results = teardown(service=service, target=name, artifact_repository=True)
    assert [(r.kind, r.action) for r in results] == [("service", "absent"), ("artifact-registry", "deleted")]


@pytest.mark.parametrize(
    "service",
    [
        "Tiny-Chat",  # Cloud Run ids are lowercase
        "tiny_chat",  # an underscore, as a Hub repo name has
        "google/gemma-4-31b-it",  # the model id
        "https://tiny-chat-abc123-ew.a.run.app",  # the URL
        "tiny-chat-",
        "1-tiny-chat",
        "tiny chat",
        "tiny-chat\n",
        "",
        "a" * 50,  # Cloud Run: fewer than 50 characters
    ],
)
def test_teardown_refuses_a_name_no_service_can_have(sb, flow_env, service):
    since = sb.last_request_seq()
    message = fails_cleanly(sb, lambda: teardown(service=service), "service:", "gcloud run services list")
    assert repr(service) in message  # quoted as given, so a stray space or newline shows
    # Not even a read: the refusal comes before the target is loaded and anything is looked up.
    assert [r for r in sb.requests(since=since) if r["server"] in CLOUD] == []


def test_teardown_takes_the_longest_name_cloud_run_allows(flow_env):
    """49 characters is a valid Cloud Run name (preflight's 46 leaves room for the candidate tag of services the
    pipeline creates; a teardown must reach any service)."""
    assert [(r.kind, r.action) for r in teardown(service="a" * 49)] == [("service", "absent")]


@pytest.mark.parametrize(
    "image",
    [
        "index.docker.io/vllm/vllm-openai:v0.33.0",
        "registry-1.docker.io/vllm/vllm-openai:v0.33.0",
        "Docker.io/vllm/vllm-openai:v0.33.0",
        "mirror.gcr.io/vllm/vllm-openai:v0.33.0",
    ],
)
def test_promote_refuses_the_generic_image_however_it_is_spelled(sb, flow_env, image):
    """Lesson 1 on the L4: vllm/vllm-openai dies with "driver too old" whichever registry name pulls it."""
    message = fails_cleanly(sb, lambda: promote(image=image), f"image: {image}", "set allow_generic_vllm_image")
    assert "CUDA" in message
