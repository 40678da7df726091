"""promote-model through prefect-gcp's cloud-run-v2 worker: the flow run becomes a Cloud Run job of the sandbox, the
job's task runs `prefect flow-run execute`, the flow promotes the model, and the worker reports the outcome."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from uuid import UUID

import httpx
import pytest
from prefect.client.orchestration import SyncPrefectClient
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey, LogFilter, LogFilterFlowRunId
from prefect.client.schemas.objects import FlowRun
from prefect.client.schemas.sorting import ArtifactSort

from sandbox.handle import SandboxHandle
from tests.support.identity import bearer
from tests.support.prefect_server import run_command
from tests.support.worker import Pipeline
from tests.worker.conftest import dump, wait_until

PREFECT = str(Path(sys.executable).parent / "prefect")
RUN_TIMEOUT_S = 1200  # a promotion in a job: image pull, flow start-up, staging, deploy, probe, watch; a busy host


def deployment_run(env: dict[str, str], name: str, *params: str) -> UUID:
    """`prefect deployment run NAME -p ...`, as typed; the new flow run's id."""
    args = [PREFECT, "deployment", "run", name]
    for param in params:
        args += ["-p", param]
    out = run_command(args, env).stdout
    found = re.search(r"UUID: ([0-9a-f-]{36})", out)
    assert found, out
    return UUID(found.group(1))


def finished(env: dict[str, str], flow_run_id: UUID) -> FlowRun:
    with SyncPrefectClient(api=env["PREFECT_API_URL"]) as client:

        def final() -> FlowRun | None:
            run = client.read_flow_run(flow_run_id)
            return run if run.state is not None and run.state.is_final() else None

        return wait_until(final, RUN_TIMEOUT_S, f"flow run {flow_run_id} to finish", interval=2)


def run_logs(env: dict[str, str], flow_run_id: UUID) -> str:
    with SyncPrefectClient(api=env["PREFECT_API_URL"]) as client:
        logs = client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))
    return "\n".join(log.message for log in logs)


def report(env: dict[str, str], service: str) -> str:
    """The newest promotion report of ``service``, as the UI shows it."""
    with SyncPrefectClient(api=env["PREFECT_API_URL"]) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[f"promotion-{service}"])),
            sort=ArtifactSort.CREATED_DESC,
        )
    return str(found[0].data) if found else ""


def run_methods(sandbox: SandboxHandle, since: int) -> list[str]:
    """The Cloud Run job calls the sandbox received since ``since``: "METHOD path" (query left out)."""
    calls = []
    for request in sandbox.requests("control", since=since):
        if "/jobs" in request["path"]:
            calls.append(f"{request['method']} {request['path']}")
    return calls


@pytest.mark.slow
def test_promote_model_runs_as_a_cloud_run_job_and_the_service_answers(
    sandbox: SandboxHandle, prefect: dict[str, str], pipeline: Pipeline, worker: Path
):
    since = sandbox.last_request_seq()
    flow_run_id = deployment_run(
        prefect, "promote-model/promote", "model=sandbox/tiny-chat", "spec_file=deployments/sandbox/tiny-chat.yaml",
        "token_secret_block=hf-token",
    )  # fmt: skip
    run = finished(prefect, flow_run_id)
    logs = run_logs(prefect, flow_run_id)
    assert run.state_name == "Completed", f"{run.state}\n{logs[-6000:]}\n{worker.read_text()[-6000:]}"
    # The worker's own calls, through https://run.googleapis.com (the TLS face), each held to run.v2's schema.
    # The worker cleans up once it sees the execution complete (it polls every 5 s): the job is deleted last.
    def cleaned_up() -> list[str] | None:
        calls = run_methods(sandbox, since)
        return calls if calls and calls[-1].startswith("DELETE") and "/executions" not in calls[-1] else None

    calls = wait_until(cleaned_up, 120, "the worker's clean-up")
    job = "/v2/projects/sandbox-project/locations/us-central1/jobs"
    assert any(c.startswith(f"POST {job}") and ":" not in c.rsplit("/", 1)[-1] for c in calls), dump(calls)
    assert any(c.startswith("POST") and c.endswith(":run") for c in calls), dump(calls)
    assert any(c.startswith("GET") and "/executions/" in c for c in calls), dump(calls)
    assert [c.split()[0] for c in calls[-2:]] == ["DELETE", "DELETE"], dump(calls)  # the execution, then the job
    assert sandbox.conformance_violations() == []
    # The worker's logs and the flow's own, from the job's process, are the run's logs in Prefect; so is its report.
    assert "Creating Cloud Run JobV2" in logs and "verified http" in logs, logs[-4000:]
    assert "tiny-chat: promoted" in report(prefect, "tiny-chat")
    # The promoted service answers a chat through its URL.
    services = httpx.get(
        f"{sandbox.control_url}/v2/projects/sandbox-project/locations/us-central1/services/tiny-chat", timeout=30
    ).json()
    url = services["uri"]
    answer = httpx.post(
        f"{url}/v1/chat/completions",
        json={"model": "sandbox/tiny-chat", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8},
        headers=bearer(services["urls"][1]),
        timeout=120,
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"]
