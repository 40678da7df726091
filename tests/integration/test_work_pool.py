"""Bootstrap's Prefect-side building blocks against a real Prefect API and the sandbox.

- The Cloud Run pool's credentials default is a block reference the worker resolves through the API.
- ``ensure_work_pool`` is idempotent on a real server: created, then unchanged; a drifted template is put back;
  a pool of another type is refused with the fix.
- ``build_worker_image`` builds this project's Dockerfile with Cloud Build (the sandbox's) once, by digest, and a
  second call changes nothing.
"""

from __future__ import annotations

import io
import itertools
import shutil
import tarfile
import uuid
from pathlib import Path

import pytest
import yaml
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import WorkPoolUpdate
from prefect.workers.process import ProcessWorker
from prefect_gcp import GcpCredentials

from blocks.target import GcpTarget
from tasks.common import clients
from tasks.image.build_context import context_files
from tasks.image.builds import source_digest
from tasks.image.images import build_plan, content_tag
from tasks.image.worker_image import WORKER_IMAGE_NAME
from tasks.report.work_pool import (
    WorkPoolError,
    build_worker_image,
    cloud_run_base_job_template,
    ensure_work_pool,
    worker_image_build,
)
from tests.support.cloud_run_job import key_file_block_data, prepare_job, problems

ROOT = Path(__file__).resolve().parents[2]
PREFECT_YAML = yaml.safe_load((ROOT / "prefect.yaml").read_text())
_ids = itertools.count()
TARGET = GcpTarget(project="acme-ml-prod", region="europe-west4")
IMAGE = "europe-west4-docker.pkg.dev/acme-ml-prod/vllm-images/hf-cloudrun-pipeline@sha256:" + "b" * 64


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def stored_template(name: str) -> dict:
    with get_client(sync_client=True) as client:
        return client.read_work_pool(name).base_job_template


# Credentials block reference ------------------------------------------------------------------------------------
def test_the_credentials_default_references_the_saved_block_and_the_worker_resolves_it(prefect_api):
    block_name = unique("pipeline")
    block_id = GcpCredentials(**key_file_block_data("acme-ml-prod")).save(block_name)
    template = cloud_run_base_job_template(TARGET, IMAGE, credentials_block=block_name)
    assert template["variables"]["properties"]["credentials"]["default"] == {
        "$ref": {"block_document_id": str(block_id)}
    }
    # The worker reads the block through the API when it builds the job (no job variables on the deployment).
    deployment = PREFECT_YAML["deployments"][0]
    configuration, _ = prepare_job(deployment, template, {}, PREFECT_YAML.get("pull", []), "hf-pipeline", api_url=None)
    assert configuration.credentials.project == "acme-ml-prod"
    assert configuration.credentials.service_account_info is not None
    assert configuration.project == "acme-ml-prod"  # the job is created in the credentials' project
    assert problems(configuration.job_body) == []


def test_a_missing_credentials_block_is_refused_with_the_fix(prefect_api):
    with pytest.raises(WorkPoolError, match=r"no gcp-credentials block named 'nowhere-\w+' .*: save one first"):
        cloud_run_base_job_template(TARGET, IMAGE, credentials_block=unique("nowhere"))


# ensure_work_pool -------------------------------------------------------------------------------------------------
def test_a_process_pool_is_created_once_and_then_left_alone(prefect_api):
    name = unique("laptop")
    assert ensure_work_pool(name, "process", None) == "created"
    assert ensure_work_pool(name, "process", None) == "unchanged"
    with get_client(sync_client=True) as client:
        pool = client.read_work_pool(name)
    assert pool.type == "process"
    assert pool.base_job_template == ProcessWorker.get_default_base_job_template()


def test_a_cloud_run_pool_whose_template_drifted_is_put_back(prefect_api):
    name = unique("cloud-run")
    template = cloud_run_base_job_template(TARGET, IMAGE, credentials_block=None)
    assert ensure_work_pool(name, "cloud-run-v2", template) == "created"
    assert ensure_work_pool(name, "cloud-run-v2", template) == "unchanged"
    assert stored_template(name) == template

    # Someone edits the pool in the UI: a smaller machine. Bootstrap puts our values back.
    drifted = stored_template(name)
    drifted["variables"]["properties"]["memory"]["default"] = "512Mi"
    with get_client(sync_client=True) as client:
        client.update_work_pool(name, WorkPoolUpdate(base_job_template=drifted))
    assert ensure_work_pool(name, "cloud-run-v2", template) == "updated"
    assert stored_template(name)["variables"]["properties"]["memory"]["default"] == "4Gi"

    # A new worker image is a new template: the pool follows it.
    newer = cloud_run_base_job_template(TARGET, IMAGE.replace("b" * 64, "c" * 64), credentials_block=None)
    assert ensure_work_pool(name, "cloud-run-v2", newer) == "updated"
    assert ensure_work_pool(name, "cloud-run-v2", newer) == "unchanged"


def test_a_pool_of_another_type_is_refused_and_left_as_it_was(prefect_api):
    name = unique("taken")
    assert ensure_work_pool(name, "process", None) == "created"
    with pytest.raises(WorkPoolError, match=rf"'{name}' exists with type 'process', not 'cloud-run-v2'.*--pool NAME"):
        ensure_work_pool(name, "cloud-run-v2", cloud_run_base_job_template(TARGET, IMAGE, credentials_block=None))
    assert stored_template(name) == ProcessWorker.get_default_base_job_template()


# build_worker_image -----------------------------------------------------------------------------------------------
@pytest.fixture
def target(sandbox_target) -> GcpTarget:
    """A target with a repository and build bucket of its own: the first build really builds."""
    n = next(_ids)
    return sandbox_target.model_copy(
        update={
            "artifact_repository": f"worker-images-{n}",
            "build_bucket": f"worker-builds-{n}-{uuid.uuid4().hex[:6]}",
        }
    )


@pytest.fixture
def project(tmp_path) -> Path:
    """A copy of this project as a user has it: with a virtualenv, git metadata and caches beside the sources (a
    copy, so other edits to the working tree cannot change the content tag between the two calls)."""
    copy = tmp_path / "project"
    for path in context_files(ROOT):
        dest = copy / path.relative_to(ROOT)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, dest)
    for junk in (
        ".venv/lib/python3.11/site-packages/big.py",
        ".git/HEAD",
        ".sandbox/state.json",
        "flows/__pycache__/x.pyc",
    ):
        (copy / junk).parent.mkdir(parents=True, exist_ok=True)
        (copy / junk).write_text("junk\n")
    return copy


def writes(sb, since: int) -> list[str]:
    return [f"{r['method']} {r['path']}" for r in sb.requests(since=since) if r["method"] not in ("GET", "HEAD")]


# Counts build creates: the grants bootstrap makes count at once here, so that no create is refused while they
# propagate (test_build_identity.py covers the product's waits through that window).
@pytest.mark.usefixtures("grants_propagated")
def test_the_worker_image_is_built_once_from_the_projects_dockerfile_and_found_the_second_time(sb, target, project):
    since = sb.last_request_seq()
    image = build_worker_image(target, project)
    host = f"{target.region}-docker.pkg.dev/{target.project}/{target.artifact_repository}"
    assert image.startswith(f"{host}/{WORKER_IMAGE_NAME}@sha256:")
    builds = [w for w in writes(sb, since) if w.startswith("POST") and w.endswith("/builds")]
    assert len(builds) == 1  # one attempt: no OOM ladder for pip installing the project

    # The upload carries the build context only: no virtualenv, git metadata, sandbox state or bytecode.
    build = worker_image_build(project)
    plan = build_plan(target, build, content_tag(build, source_digest(build)))
    data = clients.storage(target).bucket(plan.source_bucket).blob(plan.source_object).download_as_bytes()
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        uploaded = archive.getnames()
    assert {"Dockerfile", "pyproject.toml", "flows/promote.py", "prefect.yaml"} <= set(uploaded)
    assert not [n for n in uploaded if n.split("/")[0] in (".venv", ".git", ".sandbox") or "__pycache__" in n]

    since = sb.last_request_seq()
    assert build_worker_image(target, project) == image
    assert writes(sb, since) == []  # found by its content tag: nothing created, granted, uploaded or built
