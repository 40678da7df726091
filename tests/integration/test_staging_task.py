"""The staging task inside a Prefect flow: token from a Secret block, progress artifact, logs without secrets."""

from __future__ import annotations

import asyncio
import json

import pytest
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterFlowRunId,
    ArtifactFilterKey,
    LogFilter,
    LogFilterFlowRunId,
)
from prefect.logging.handlers import APILogWorker

from blocks import ModelSource
from tasks.common import clients
from tasks.weights.staging import MANIFEST, StagingResult, hf_stage_model

pytestmark = pytest.mark.prefect


@flow(name="stage-only")
def stage_only(target, source: ModelSource, token_secret_block: str) -> StagingResult:
    return hf_stage_model(target, source, token_secret_block=token_secret_block)


async def _artifacts_and_logs(key: str, flow_run_id):
    async with get_client() as client:
        artifacts = await client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))
        logs = await client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))
    return artifacts, logs


async def _run_artifacts(flow_run_id) -> list:
    """The keyed artifacts one run made other than progress bars: what its page's Artifacts tab lists."""
    async with get_client() as client:
        found = await client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
        )
    return [a for a in found if a.key and a.type != "progress"]


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


def test_staging_task_lists_every_staged_file_in_a_table(prefect_api, sb, sandbox_target):
    from prefect.blocks.system import Secret

    target = sandbox_target.model_copy(update={"bucket": "stage-table-bucket"})
    clients.storage(target).create_bucket(target.bucket_name, location=target.region)
    Secret(value=sb.hub_token).save("sandbox-hf-token", overwrite=True)
    source = ModelSource(repo_id="sandbox/tiny-chat", hub_endpoint=sb.hub_url)
    bucket = clients.storage(target).bucket(target.bucket_name)

    first = stage_only(target, source, "sandbox-hf-token", return_state=True).result()
    assert first.uploaded_paths, "nothing was uploaded on the first stage"
    prefix = first.object_prefix
    bucket.blob(f"{prefix}/{MANIFEST}").delete()  # an interrupted stage: the files are there, the manifest not yet
    largest = max(first.uploaded_paths, key=lambda path: bucket.get_blob(f"{prefix}/{path}").size)
    bucket.blob(f"{prefix}/{largest}").delete()
    state = stage_only(target, source, "sandbox-hf-token", return_state=True)
    assert state.result().uploaded_paths == [largest]

    artifacts = asyncio.run(_run_artifacts(state.state_details.flow_run_id))
    assert [(a.key, a.type) for a in artifacts] == [("staged-files-sandbox-tiny-chat", "table")]
    rows = json.loads(artifacts[0].data)
    staged = {b.name.removeprefix(f"{prefix}/"): b for b in bucket.list_blobs(prefix=f"{prefix}/")}
    staged.pop(MANIFEST)
    assert {r["path"] for r in rows} == set(staged) and len(rows) == len(staged)
    for row in rows:
        blob = staged[row["path"]]
        assert row["MB"] == round(blob.size / 1e6, 2)
        assert blob.metadata["sha256"].startswith(row["sha256"]) and len(row["sha256"]) == 12
        assert row["this run"] == ("uploaded" if row["path"] == largest else "already there")
    assert f"1 of {len(rows)} uploaded" in artifacts[0].description
