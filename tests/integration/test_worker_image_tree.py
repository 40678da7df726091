"""The cloud-run-v2 pool's worker image holds the tree its deployments are registered from.

Against a real Prefect API and the sandbox's Artifact Registry and Cloud Build, with the tree changed in a copy of the
project (a new model file): `python -m flows.bootstrap deploy` refuses a stale pool image, naming it, both content tags
and the command; `--build-worker-image` builds the new tree and points the pool at it; an unchanged tree is left alone
with no build; doctor's row says current or stale; an image we did not build is a warning, not a refusal.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from prefect.client.orchestration import get_client
from prefect.exceptions import ObjectNotFound
from prefect.settings import PREFECT_API_URL

from blocks.target import GcpTarget
from flows.project import pipeline_pool
from tasks.checks import doctor as checks
from tasks.image.worker_image import judge_worker_image, rebuild_command, tree_tag
from tasks.report.pool_image import PoolImage, check_pool_image, read_pool
from tasks.report.work_pool import build_worker_image, cloud_run_base_job_template, ensure_work_pool
from tests.support.project_copy import NEW_MODEL, add_model_file, copy_of_project

ROOT = Path(__file__).resolve().parents[2]
_ids = itertools.count()


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def builds_created(sb, since: int) -> list[str]:
    return [r["path"] for r in sb.requests(since=since) if r["method"] == "POST" and r["path"].endswith("/builds")]


def writes(sb, since: int) -> list[str]:
    return [f"{r['method']} {r['path']}" for r in sb.requests(since=since) if r["method"] not in ("GET", "HEAD")]


@pytest.fixture
def target(prefect_api, sandbox_target) -> tuple[str, GcpTarget]:
    """A GcpTarget block with a repository and build bucket of its own: the first build really builds."""
    n, suffix = next(_ids), uuid.uuid4().hex[:6]
    gcp = sandbox_target.model_copy(
        update={"artifact_repository": f"tree-images-{n}-{suffix}", "build_bucket": f"tree-builds-{n}-{suffix}"}
    )
    name = unique("tree")
    gcp.save(name)
    return name, gcp


@pytest.fixture
def project(tmp_path) -> Path:
    """A copy of the project's build context whose prefect.yaml names a pool of its own (the test's, not the
    session's hf-pipeline)."""
    copy = copy_of_project(tmp_path / "project")
    prefect_file = copy / "prefect.yaml"
    prefect_file.write_text(prefect_file.read_text().replace("name: hf-pipeline", f"name: {unique('tree-pool')}"))
    return copy


@pytest.fixture
def pool(project, target) -> PoolImage:
    """The copy's cloud-run-v2 pool, running the worker image built from the copy as it is now."""
    _, gcp = target
    name = pipeline_pool(project / "prefect.yaml")
    image = build_worker_image(gcp, project)
    ensure_work_pool(name, "cloud-run-v2", cloud_run_base_job_template(gcp, image, credentials_block=None))
    yield PoolImage(name, "cloud-run-v2", image)
    with get_client(sync_client=True) as client:  # the pool and whatever a test deployed on it
        for deployment in client.read_deployments():
            if deployment.work_pool_name == name:
                client.delete_deployment(deployment.id)
        with contextlib.suppress(ObjectNotFound):
            client.delete_work_pool(name)


def bootstrap_deploy(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`python -m flows.bootstrap deploy ...` as typed in the copy (its own flows and tree), against the session's
    Prefect server."""
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()}
    return subprocess.run([sys.executable, "-m", "flows.bootstrap", "deploy", *args], cwd=project, env=env,
                          capture_output=True, text=True, timeout=900)  # fmt: skip


# Builds are counted: the grants the build makes count at once (test_build_identity.py covers the product's waits).
pytestmark = pytest.mark.usefixtures("grants_propagated")


def test_a_new_model_file_with_a_stale_pool_image_is_refused_naming_the_image_both_tags_and_the_fix(
    sb, project, target, pool
):
    name, _ = target
    built_from = tree_tag(project)
    model = add_model_file(project)
    now = tree_tag(project)
    assert now != built_from  # deployments/ is part of what the tag is computed over
    since = sb.last_request_seq()
    done = bootstrap_deploy(project, "--name", name)
    assert done.returncode == 2, done.stdout + done.stderr
    [error] = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert f"work pool '{pool.name}' runs the worker image {pool.image} (tag {built_from})" in error
    assert f"(tag {now} now)" in error and "spec_file ... does not exist" in error
    assert error.endswith(f"`python -m flows.bootstrap deploy --build-worker-image --name {name}`")
    assert "Traceback" not in done.stderr
    # Refused before anything changed: the pool keeps its image, nothing was built, no deployment registered.
    assert read_pool(pool.name).image == pool.image
    assert writes(sb, since) == []
    with get_client(sync_client=True) as client:
        assert not [d for d in client.read_deployments() if d.name == model]


def test_build_worker_image_builds_the_new_tree_and_the_pool_runs_it(sb, project, target, pool):
    name, gcp = target
    model = add_model_file(project)
    since = sb.last_request_seq()
    done = bootstrap_deploy(project, "--name", name, "--build-worker-image")
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(builds_created(sb, since)) == 1
    image = read_pool(pool.name).image
    assert image != pool.image and f"worker image: {image}" in done.stdout
    assert f"work pool '{pool.name}' (cloud-run-v2): image updated (was {pool.image})" in done.stdout
    # The pool's new image carries the tree's content tag in Artifact Registry: it holds the new model file.
    verdict = judge_worker_image(image, project, lambda: gcp)
    assert (verdict.state, verdict.image_tag) == ("current", tree_tag(project))
    with get_client(sync_client=True) as client:  # and the deploy went on: the new model's deployment exists
        deployment = client.read_deployment_by_name(f"promote-model/{model}")
    assert deployment.work_pool_name == pool.name
    assert deployment.parameters == {"spec_file": f"deployments/{model}.yaml"}


def test_an_unchanged_tree_is_left_alone_with_no_build(sb, project, target, pool):
    name, gcp = target
    fix = rebuild_command(name)
    since = sb.last_request_seq()
    assert check_pool_image(read_pool(pool.name), project, lambda: gcp, build=False, fix=fix) == [
        f"worker image: {pool.image} holds this tree ({tree_tag(project)})"
    ]
    assert check_pool_image(read_pool(pool.name), project, lambda: gcp, build=True, fix=fix) == [
        f"worker image: {pool.image} holds this tree: unchanged"
    ]
    assert builds_created(sb, since) == [] and writes(sb, since) == []
    assert read_pool(pool.name).image == pool.image


def test_doctor_says_whether_the_pools_image_holds_the_tree_naming_both_tags(sb, project, target, pool):
    name, gcp = target
    fix = rebuild_command(name)

    def row() -> checks.Check:
        found = read_pool(pool.name)
        return checks.check_worker_image(gcp, pool.name, found.type, found.image, project, fix)

    since = sb.last_request_seq()
    current = row()
    assert current.status == "ok" and current.detail.endswith(f"built from this tree ({tree_tag(project)})")
    built_from = tree_tag(project)
    (project / "deployments" / "team-llama.yaml").write_text(NEW_MODEL)  # a model file the image does not hold
    stale = row()
    assert stale.status == "warn" and stale.fix == fix
    assert f"runs {pool.image} (tag {built_from}), built from another tree" in stale.detail
    assert f"(tag {tree_tag(project)} now)" in stale.detail
    assert writes(sb, since) == []  # read-only


def test_an_image_we_did_not_build_is_a_warning_not_a_refusal(sb, project, target):
    """A team's own image (their CI's tag): bootstrap cannot tell what it holds, so it says so and deploys."""
    name, gcp = target
    pool_name = unique("own-image")
    own = f"{gcp.region}-docker.pkg.dev/{gcp.project}/team-images/hf-cloudrun-pipeline:v42"
    ensure_work_pool(pool_name, "cloud-run-v2", cloud_run_base_job_template(gcp, own, credentials_block=None))
    try:
        found = read_pool(pool_name)
        [line] = check_pool_image(found, project, lambda: gcp, build=False, fix=rebuild_command(name))
        assert line.startswith(f"warning: work pool '{pool_name}' runs {own}: whether it holds this tree")
        assert "no content tag of ours" in line and rebuild_command(name) in line
        doctor_row = checks.check_worker_image(gcp, pool_name, found.type, found.image, project, rebuild_command(name))
        assert doctor_row.status == "warn" and doctor_row.summary.startswith("cannot be checked")
        process = checks.check_worker_image(gcp, "laptop", "process", None, project, rebuild_command(name))
        assert process.status == "ok" and "process pool" in process.detail
    finally:
        with get_client(sync_client=True) as client:
            client.delete_work_pool(pool_name)
