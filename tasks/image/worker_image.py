"""The worker image: this project's ./Dockerfile, tagged by what its build context holds, and whether an image a
work pool names holds the project's tree as it is now.

On a ``cloud-run-v2`` pool every flow run reads ``deployments/*.yaml`` and runs the flows' code from inside this
image (flows/project.py), not from the checkout ``prefect deploy`` ran in. An image built before a model file was
added fails that model's runs ("spec_file ... does not exist"); one built before a file was edited runs the old
file without a word. The image's tag is the content tag of its build context (tasks/image/images.py ``content_tag``
over ``tree_digest``: every file ``docker build`` sends, the .dockerignore applied, ``deployments/`` included), so
comparing that tag with the tag the tree has now tells whether the image holds it.

A pool names the image by digest (``build_worker_image`` returns ``...@sha256:...``): its tags are read from Artifact
Registry (``tags.list`` filtered by the version, the filter the ListTagsRequest reference documents:
``version="projects/p1/locations/us-central1/repositories/repo1/packages/pkg1/versions/1.0"``). An image that is not
ours (another name or registry, or a version with no content tag, such as one built by a team's own CI) cannot be
judged: the verdict says so rather than guessing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from google.api_core import exceptions as gexc
from google.cloud import artifactregistry_v1

from blocks.images import ImageBuild
from blocks.target import GcpTarget
from tasks.common import clients
from tasks.common.gcp import GCP_RETRY
from tasks.image.builds import source_digest
from tasks.image.image_reference import ImageReference, InvalidImageReference, parse_image_reference
from tasks.image.images import content_tag

WORKER_IMAGE_NAME = "hf-cloudrun-pipeline"
CONTENT_TAG_PREFIX = "src-"  # content_tag's prefix: a tag of ours
DOCKER_HOST_SUFFIX = "-docker.pkg.dev"  # Artifact Registry's Docker hosts: LOCATION-docker.pkg.dev/PROJECT/REPO/IMAGE

State = Literal["current", "stale", "unknown"]


def worker_image_build(project_dir: Path) -> ImageBuild:
    """The ImageBuild of this project's ./Dockerfile (prefect base image + ``pip install .``).

    Nothing is compiled, so there is no OOM ladder: one attempt. The default pool's e2-standard-2 (2 vCPU, 8 GB)
    is the machine the free build-minutes apply to (https://cloud.google.com/build/pricing); 100 GB is the disk
    that comes free; pip installing a few wheels takes minutes, so 30 minutes is ample.
    """
    return ImageBuild(
        source_dir=str(project_dir),
        image_name=WORKER_IMAGE_NAME,
        max_jobs_ladder=[1],
        max_jobs_floor=1,
        machine_type="E2_STANDARD_2",
        disk_size_gb=100,
        timeout_seconds=1800,
    )


def rebuild_command(target_name: str) -> str:
    """The command that builds the worker image from this tree (or finds it built) and points the pool at it."""
    return f"python -m flows.bootstrap deploy --build-worker-image --name {target_name}"


def tree_tag(project_dir: Path) -> str:
    """The content tag the worker image built from ``project_dir`` as it is now has (no cloud call)."""
    build = worker_image_build(project_dir)
    return content_tag(build, source_digest(build))


@dataclass(frozen=True)
class WorkerImageVerdict:
    """Whether ``image`` holds the tree: ``current`` (its tag is the tree's), ``stale`` (another content tag of ours),
    or ``unknown`` (``why`` says why it cannot be judged)."""

    state: State
    image: str
    tree_tag: str
    image_tag: str | None = None
    why: str = ""


def our_reference(image: str) -> ImageReference | None:
    """The parsed reference when ``image`` is named as ours: ``LOCATION-docker.pkg.dev/PROJECT/REPO/`` followed by
    ``WORKER_IMAGE_NAME``; None for any other image."""
    try:
        ref = parse_image_reference(image)
    except InvalidImageReference:
        return None
    parts = ref.path.split("/")
    if not ref.domain.endswith(DOCKER_HOST_SUFFIX) or len(parts) != 3 or parts[2] != WORKER_IMAGE_NAME:
        return None
    return ref


def content_tags(target: GcpTarget, ref: ImageReference) -> list[str]:
    """Our content tags on the version ``ref``'s digest names, read from Artifact Registry with the target's clients
    (the repository is the one the reference names). Raises google.api_core's NotFound for an image not there."""
    assert ref.digest is not None
    project, repository, image = ref.path.split("/")
    location = ref.domain.removesuffix(DOCKER_HOST_SUFFIX)
    package = f"projects/{project}/locations/{location}/repositories/{repository}/packages/{image}"
    request = artifactregistry_v1.ListTagsRequest(parent=package, filter=f'version="{package}/versions/{ref.digest}"')
    found = clients.artifact_registry(target).list_tags(request=request, retry=GCP_RETRY)
    names = (tag.name.rsplit("/", 1)[-1] for tag in found)
    return sorted(name for name in names if name.startswith(CONTENT_TAG_PREFIX))


def judge_worker_image(image: str, project_dir: Path, target: Callable[[], GcpTarget]) -> WorkerImageVerdict:
    """Whether ``image`` was built from ``project_dir`` as it is now. ``target`` is called only when the registry
    must be asked (an image of ours named by digest), for its clients; google.api_core errors other than NotFound
    propagate (the caller says which role reads tags)."""
    wanted = tree_tag(project_dir)
    ref = our_reference(image)
    if ref is None:
        why = f"it is not an Artifact Registry image named {WORKER_IMAGE_NAME}, so bootstrap did not build it"
        return WorkerImageVerdict("unknown", image, wanted, why=why)
    if ref.digest is not None:  # the digest is what is pulled, whatever tag the reference also spells
        try:
            tags = content_tags(target(), ref)
        except gexc.NotFound:
            why = "Artifact Registry has no such image (deleted, or another project's)"
            return WorkerImageVerdict("unknown", image, wanted, why=why)
    else:
        tags = [ref.tag] if ref.tag and ref.tag.startswith(CONTENT_TAG_PREFIX) else []
    if not tags:
        why = f"it carries no content tag of ours ({CONTENT_TAG_PREFIX}...), so what it was built from is not known"
        return WorkerImageVerdict("unknown", image, wanted, why=why)
    if wanted in tags:
        return WorkerImageVerdict("current", image, wanted, image_tag=wanted)
    return WorkerImageVerdict("stale", image, wanted, image_tag=tags[0])
