"""Each rung of the OOM ladder is its own Prefect task run, visible in the UI with its max_jobs, and an INFO line
in the run's logs with its build, outcome and duration."""

from __future__ import annotations

import asyncio

import pytest
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, LogFilter, LogFilterFlowRunId
from prefect.logging.handlers import APILogWorker

from blocks import ImageBuild
from tasks.common import clients
from tasks.image.builds import ImageResult, build_image, cloudbuild_run_build
from tasks.infra import build_identity, ensure

pytestmark = pytest.mark.prefect


@flow(name="build-only")
def build_only(target, build: ImageBuild) -> ImageResult:
    return build_image(target, build, attempt=cloudbuild_run_build)


async def _task_run_names(flow_run_id) -> list[str]:
    async with get_client() as client:
        runs = await client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    return sorted(run.name for run in runs)


async def _logs(flow_run_id) -> list[tuple[int, str]]:
    async with get_client() as client:
        logs = await client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))
    return [(log.level, log.message) for log in logs]


def test_each_ladder_attempt_is_a_task_run(prefect_api, sandbox_target, tmp_path):
    target = sandbox_target.model_copy(update={"bucket": "builds-task-runs", "artifact_repository": "task-runs"})
    ensure.ensure_bucket(target)
    ensure.ensure_build_bucket(target)
    ensure.ensure_artifact_registry(target)
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
    # The run's logs tell the ladder's story, one INFO line per attempt, each naming the build Cloud Build ran.
    APILogWorker.drain_all()  # logs reach the API in batches
    lines = [m for level, m in asyncio.run(_logs(state.state_details.flow_run_id)) if level >= 20]
    attempts = [m for m in lines if m.startswith("build attempt ")]
    assert len(attempts) == 3, lines
    builds = [
        clients.cloud_build(target).get_build(name=f"{target.build_location_path}/builds/{a.build_id}")
        for a in state.result().attempts
    ]
    outcomes = ["OOM -> next rung max_jobs=16", "OOM -> next rung max_jobs=8", "success"]
    for number, (line, build, outcome) in enumerate(zip(attempts, builds, outcomes, strict=True), 1):
        max_jobs = (32, 16, 8)[number - 1]
        assert line.startswith(f"build attempt {number} of 4: max_jobs={max_jobs}, build {build.id}: {outcome} ("), line
        assert f"({build.status.name}) in " in line and line.endswith(f" s; log: {build.log_url}"), line
