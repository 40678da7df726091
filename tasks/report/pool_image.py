"""The image a work pool's jobs run, read and changed through the Prefect API, and what bootstrap does about it before
it deploys: does the pool's image hold this project's tree? (tasks/image/worker_image.py judges.)

- A process pool's runs read the worker's own checkout: nothing to check.
- A ``cloud-run-v2`` pool whose image holds the tree: one line saying so.
- One whose image was built by us from another tree is stale: refused (``StaleWorkerImage``, a ValueError: bootstrap
  prints ``error: ...`` and exits 2) naming the image, its tag, the tree's tag and the command; with ``build`` the
  image is built (or found: same content tag, no build) and the pool's ``image`` default set to it instead.
- An image we did not build (a team's own ``--worker-image``) cannot be judged: a warning line, not a refusal.
  Refusing would block every deploy of a team whose CI builds the image from the same commit, with no way to say
  so; the warning names the risk and the command that takes it away.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from google.api_core import exceptions as gexc
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import WorkPoolUpdate
from prefect.exceptions import ObjectNotFound

from blocks.target import GcpTarget
from tasks.checks.doctor.rows import google_text
from tasks.checks.doctor.worker_image import TAG_READER_ROLE
from tasks.image.worker_image import WorkerImageVerdict, judge_worker_image, tree_tag
from tasks.report.work_pool import build_worker_image

CLOUD_RUN_POOL = "cloud-run-v2"


class StaleWorkerImage(ValueError):
    """The pool's image was built from another tree than this one: its runs would not see this tree's files."""


@dataclass(frozen=True)
class PoolImage:
    """A work pool as far as its image goes: its name, type, and the base job template's ``image`` default."""

    name: str
    type: str
    image: str | None


def read_pool(name: str) -> PoolImage | None:
    """The pool ``name`` and its image variable's default, from the Prefect API; None when there is no such pool."""
    with get_client(sync_client=True) as client:
        try:
            pool = client.read_work_pool(name)
        except ObjectNotFound:
            return None
    properties = (pool.base_job_template or {}).get("variables", {}).get("properties", {})
    image = (properties.get("image") or {}).get("default")
    return PoolImage(name, pool.type, image)


def set_pool_image(name: str, image: str) -> None:
    """Point the pool's ``image`` variable default at ``image``; the rest of its base job template is kept."""
    with get_client(sync_client=True) as client:
        template = copy.deepcopy(client.read_work_pool(name).base_job_template)
        template["variables"]["properties"]["image"]["default"] = image
        client.update_work_pool(name, WorkPoolUpdate(base_job_template=template))


def unknown_warning(pool: str, verdict: WorkerImageVerdict, fix: str) -> str:
    """The warning for an image that cannot be judged."""
    return (
        f"warning: work pool '{pool}' runs {verdict.image}: whether it holds this tree (content tag "
        f"{verdict.tree_tag}) cannot be checked: {verdict.why}. Its runs read deployments/ and the flows from that "
        f"image: make sure it was built from this tree, or build it from this tree with `{fix}`"
    )


def stale_message(pool: str, verdict: WorkerImageVerdict, fix: str) -> str:
    """The refusal for a stale image: the image, both tags, what goes wrong, the command."""
    return (
        f"work pool '{pool}' runs the worker image {verdict.image} (tag {verdict.image_tag}), built from another tree "
        f"than this one (tag {verdict.tree_tag} now): its runs read deployments/ and the flows from that image, so a "
        "new model file fails ('spec_file ... does not exist') and an edited one is ignored. Rebuild it and point the "
        f"pool at it: `{fix}`"
    )


def judged(image: str, project_dir: Path, target: Callable[[], GcpTarget]) -> WorkerImageVerdict:
    """The verdict; a registry that cannot be read makes it unknown, naming Google's words and the role to read."""
    try:
        return judge_worker_image(image, project_dir, target)
    except gexc.GoogleAPICallError as exc:
        why = f"its tags could not be read ({google_text(exc)}; {TAG_READER_ROLE} reads them)"
        return WorkerImageVerdict("unknown", image, tree_tag(project_dir), why=why)


def check_pool_image(
    pool: PoolImage, project_dir: Path, target: Callable[[], GcpTarget], build: bool, fix: str
) -> list[str]:
    """Before a deploy: the lines to print about the pool's image (a ``warning: `` line for one that cannot be
    judged). ``build``: build (or find) the image of ``project_dir`` and set the pool to it. ``target`` gives the
    GcpTarget the registry and Cloud Build are reached with; it is called only when needed. Raises StaleWorkerImage
    for a stale image when not ``build``."""
    if pool.type != CLOUD_RUN_POOL:  # a process worker runs the flows from its own checkout
        return [f"work pool '{pool.name}' ({pool.type}): no worker image to build"] if build else []
    if build:
        image = build_worker_image(target(), project_dir)
        if image == pool.image:
            return [f"worker image: {image} holds this tree: unchanged"]
        set_pool_image(pool.name, image)
        updated = f"work pool '{pool.name}' ({CLOUD_RUN_POOL}): image updated (was {pool.image})"
        return [f"worker image: {image}", updated]
    if not pool.image:
        raise ValueError(f"work pool '{pool.name}' ({CLOUD_RUN_POOL}) names no image: give it one with `{fix}`")
    verdict = judged(pool.image, project_dir, target)
    if verdict.state == "stale":
        raise StaleWorkerImage(stale_message(pool.name, verdict, fix))
    if verdict.state == "unknown":
        return [unknown_warning(pool.name, verdict, fix)]
    return [f"worker image: {pool.image} holds this tree ({verdict.tree_tag})"]


def pinned_image_warning(pool: str, image: str, project_dir: Path, target: GcpTarget, fix: str) -> str | None:
    """``bootstrap gcp --worker-image REF``: the user chose the image, so nothing is refused; a warning when it cannot
    be judged, or is ours but built from another tree (``bootstrap deploy`` would refuse it)."""
    verdict = judged(image, project_dir, lambda: target)
    if verdict.state == "unknown":
        return unknown_warning(pool, verdict, fix)
    if verdict.state == "stale":
        return f"warning: {stale_message(pool, verdict, fix)}"
    return None
