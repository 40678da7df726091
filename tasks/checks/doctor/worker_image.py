"""doctor's worker image row: does the cloud-run-v2 pool's image hold this project's tree? Its runs read
``deployments/*.yaml`` and the flows from the image, not from this checkout (tasks/image/worker_image.py). Read-only:
one Artifact Registry ``tags.list`` for an image named by digest, nothing else.

A stale or unjudgeable image is a warning, not a failure: doctor is also promote-model's first step, and a promotion
started from this checkout runs this checkout's files whatever the pool's image holds; ``bootstrap deploy`` is where a
stale image is refused, before deployments that would run in it are registered.
"""

from __future__ import annotations

from pathlib import Path

from google.api_core import exceptions as gexc

from blocks.target import GcpTarget
from tasks.checks.doctor.rows import Check, unreadable
from tasks.image.worker_image import judge_worker_image

NAME = "worker image"
TAG_READER_ROLE = "roles/artifactregistry.reader"  # holds artifactregistry.tags.list


def check_worker_image(
    target: GcpTarget, pool: str, pool_type: str | None, image: str | None, project_dir: Path, fix: str
) -> Check:
    """The row for work pool ``pool`` (``pool_type`` None: no such pool) whose base job template names ``image``,
    judged against ``project_dir``; ``fix`` is the command that rebuilds the image and points the pool at it."""
    if pool_type is None:
        return Check(name=NAME, status="ok", detail=f"no work pool '{pool}' yet: bootstrap gcp creates it")
    if pool_type != "cloud-run-v2":
        detail = f"work pool '{pool}' is a {pool_type} pool: its runs read the worker's own checkout, no image to check"
        return Check(name=NAME, status="ok", detail=detail)
    if not image:
        return Check(name=NAME, status="fail", detail=f"work pool '{pool}' names no image for its jobs", fix=fix)
    try:
        verdict = judge_worker_image(image, project_dir, lambda: target)
    except gexc.GoogleAPICallError as exc:
        return unreadable(NAME, target, exc, TAG_READER_ROLE)
    if verdict.state == "current":
        return Check(name=NAME, status="ok", detail=f"work pool '{pool}' runs {image}, built from this tree "
                     f"({verdict.tree_tag})")  # fmt: skip
    if verdict.state == "stale":
        detail = (
            f"work pool '{pool}' runs {image} (tag {verdict.image_tag}), built from another tree than this one (tag "
            f"{verdict.tree_tag} now): its runs read the old deployments/ and flows"
        )
        summary = f"stale: the pool's image has tag {verdict.image_tag}, this tree {verdict.tree_tag}"
        return Check(name=NAME, status="warn", detail=detail, fix=fix, summary=summary)
    detail = f"work pool '{pool}' runs {image}: whether it holds this tree cannot be checked: {verdict.why}"
    return Check(name=NAME, status="warn", detail=detail, fix=fix, summary="cannot be checked: " + verdict.why)
