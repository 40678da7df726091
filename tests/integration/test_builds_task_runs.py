"""Each rung of the OOM ladder is its own Prefect task run, visible in the UI with its max_jobs."""

from __future__ import annotations

import asyncio

import pytest
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

from blocks import ImageBuild
from tasks import build_identity, infra
from tasks.builds import ImageResult, build_image, cloudbuild_run_build

pytestmark = pytest.mark.prefect


@flow(name="build-only")
def build_only(target, build: ImageBuild) -> ImageResult:
    return build_image(target, build, attempt=cloudbuild_run_build)


async def _task_run_names(flow_run_id) -> list[str]:
    async with get_client() as client:
        runs = await client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    return sorted(run.name for run in runs)


def test_each_ladder_attempt_is_a_task_run(prefect_api, sandbox_target, tmp_path):
    target = sandbox_target.model_copy(update={"bucket": "builds-task-runs", "artifact_repository": "task-runs"})
    infra.ensure_bucket(target)
    infra.ensure_build_bucket(target)
    infra.ensure_artifact_registry(target)
    build_identity.ensure_build_identity(target)  # the ensure-infrastructure step's grants for builds
    source = tmp_path / "src"
    source.mkdir()
    (source / "Dockerfile").write_text(
        "ARG max_jobs=32\nFROM python:3.12\nENV MAX_JOBS=${max_jobs}\nRUN pip install .\n"
    )
    state = build_only(target, ImageBuild(source_dir=str(source), image_name="task-runs"), return_state=True)
    assert [a.max_jobs for a in state.result().attempts] == [32, 16, 8]
    names = asyncio.run(_task_run_names(state.state_details.flow_run_id))
    assert names == ["build max_jobs=16", "build max_jobs=32", "build max_jobs=8"]
