"""The staging task inside a Prefect flow: token from a Secret block, progress artifact, logs without secrets."""

from __future__ import annotations

import asyncio

import pytest
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey, LogFilter, LogFilterFlowRunId
from prefect.logging.handlers import APILogWorker

from blocks import ModelSource
from tasks import clients
from tasks.staging import StagingResult, hf_stage_model

pytestmark = pytest.mark.prefect


@flow(name="stage-only")
def stage_only(target, source: ModelSource, token_secret_block: str) -> StagingResult:
    return hf_stage_model(target, source, token_secret_block=token_secret_block)


async def _artifacts_and_logs(key: str, flow_run_id):
    async with get_client() as client:
        artifacts = await client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))
        logs = await client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))
    return artifacts, logs


def test_staging_task_reports_progress_and_keeps_the_token_out_of_the_record(prefect_api, sb, sandbox_target):
    from prefect.blocks.system import Secret

    target = sandbox_target.model_copy(update={"bucket": "stage-task-bucket"})
    clients.storage(target).create_bucket(target.bucket_name, location=target.region)
    Secret(value=sb.hub_token).save("sandbox-hf-token", overwrite=True)
    source = ModelSource(repo_id="sandbox/gated-chat", hub_endpoint=sb.hub_url)

    state = stage_only(target, source, "sandbox-hf-token", return_state=True)
    result = state.result()
    assert result.files_uploaded > 0 and not result.noop

    APILogWorker.drain_all()  # logs reach the API in batches
    artifacts, logs = asyncio.run(_artifacts_and_logs("staging-sandbox-gated-chat", state.state_details.flow_run_id))
    assert artifacts and artifacts[0].type == "progress"
    assert artifacts[0].data == 100
    messages = [log.message for log in logs]
    assert any("staging sandbox/gated-chat@" in m for m in messages)
    assert any("100% (" in m and "MB/s" in m for m in messages)
    assert not any(sb.hub_token in m for m in messages)
    assert all(sb.hub_token not in str(a.data) + str(a.description) for a in artifacts)
