"""promote-model through prefect-gcp's cloud-run-v2 worker: the flow run becomes a Cloud Run job of the sandbox, the
job's task runs `prefect flow-run execute`, the flow promotes the model, and the worker reports the outcome."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from uuid import UUID

import httpx
import pytest
from prefect.client.orchestration import SyncPrefectClient
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterKey,
    FlowRunFilter,
    FlowRunFilterId,
    LogFilter,
    LogFilterFlowRunId,
)
from prefect.client.schemas.objects import FlowRun
from prefect.client.schemas.sorting import ArtifactSort

from sandbox.handle import SandboxHandle
from tests.support.identity import bearer
from tests.support.prefect_server import run_command
from tests.support.project_copy import add_model_file, copy_of_project
from tests.support.worker import TARGET_BLOCK, Pipeline, dump, wait_until

PREFECT = str(Path(sys.executable).parent / "prefect")
RUN_TIMEOUT_S = 1200  # a promotion in a job: image pull, flow start-up, staging, deploy, probe, watch; a busy host
# A test waits for up to three runs, each within RUN_TIMEOUT_S: pytest's 300 s default (pyproject.toml) would cut a
# test short on a loaded host before its own waits could judge anything.
pytestmark = pytest.mark.timeout(2 * RUN_TIMEOUT_S)


def deployment_run(env: dict[str, str], name: str, *params: str, job_variables: tuple[str, ...] = ()) -> UUID:
    """`prefect deployment run NAME -p ... [--job-variable k=v]`, as typed; the new flow run's id."""
    args = [PREFECT, "deployment", "run", name]
    for param in params:
        args += ["-p", param]
    for variable in job_variables:
        args += ["--job-variable", variable]
    out = run_command(args, env).stdout
    found = re.search(r"UUID: ([0-9a-f-]{36})", out)
    assert found, out
    return UUID(found.group(1))


def finished(env: dict[str, str], flow_run_id: UUID) -> FlowRun:
    with SyncPrefectClient(api=env["PREFECT_API_URL"], auth_string=env["PREFECT_API_AUTH_STRING"]) as client:

        def final() -> FlowRun | None:
            run = client.read_flow_run(flow_run_id)
            return run if run.state is not None and run.state.is_final() else None

        return wait_until(final, RUN_TIMEOUT_S, f"flow run {flow_run_id} to finish", interval=2)


def run_logs(env: dict[str, str], flow_run_id: UUID) -> str:
    with SyncPrefectClient(api=env["PREFECT_API_URL"], auth_string=env["PREFECT_API_AUTH_STRING"]) as client:
        logs = client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))
    return "\n".join(log.message for log in logs)


def unfinished(env: dict[str, str], runs: list[UUID], states: list[FlowRun]) -> str:
    """For an assertion's message: each run that did not complete, its state and the end of its log."""
    return "\n".join(f"{run}: {state.state}\n{run_logs(env, run)[-1500:]}"
                     for run, state in zip(runs, states, strict=True) if state.state_name != "Completed")  # fmt: skip


def report(env: dict[str, str], service: str) -> str:
    """The newest promotion report of ``service``, as the UI shows it."""
    with SyncPrefectClient(api=env["PREFECT_API_URL"], auth_string=env["PREFECT_API_AUTH_STRING"]) as client:
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
    # The server's auth string reached the job as a Secret Manager reference, which Cloud Run resolved for the flow
    # (it ran, authenticated): the job as created names the secret, and no request anywhere carried the value.
    [created] = [r for r in sandbox.requests("control", since=since)
                 if r["method"] == "POST" and r["path"].endswith("/jobs") and r.get("status") == 200]  # fmt: skip
    containers = json.loads(created["body"])["template"]["template"]["containers"]
    env_vars = {e["name"]: e for c in containers for e in c.get("env", [])}
    reference = env_vars["PREFECT_API_AUTH_STRING"]
    assert "value" not in reference, reference
    assert reference["valueSource"]["secretKeyRef"]["secret"].endswith("/secrets/prefect-api-auth-string"), reference
    password = prefect["PREFECT_API_AUTH_STRING"].split(":", 1)[1]
    assert not [r["path"] for r in sandbox.requests(since=since) if password in json.dumps(r)]

    # The worker's logs and the flow's own, from the job's process, are the run's logs in Prefect; so is its report.
    # The job's process sends its logs in batches (every 2 s), so its last ones may arrive after the run's final state:
    # the flow's outcome line is its last.
    def all_logs() -> str | None:
        text = run_logs(prefect, flow_run_id)
        return text if "tiny-chat: promoted; traffic " in text else None

    logs = wait_until(all_logs, 120, "the run's last log lines")
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


def started_jobs(sandbox: SandboxHandle, since: int) -> list[str]:
    """The jobs the worker ran (jobs.run answered 200) since ``since``."""
    return [r["path"].rsplit("/", 1)[1].removesuffix(":run") for r in sandbox.requests("control", since=since)
            if r["method"] == "POST" and r["path"].endswith(":run") and r.get("status") == 200]  # fmt: skip


@pytest.mark.slow
def test_a_refused_promotion_fails_the_run_and_its_report_lists_the_findings(
    sandbox: SandboxHandle, prefect: dict[str, str], pipeline: Pipeline, worker: Path
):
    """seed 000's failure (the generic vllm-openai image on an L4) and a name Cloud Run refuses, through a job."""
    flow_run_id = deployment_run(
        prefect, "promote-model/promote", "model=sandbox/tiny-chat", "spec_file=deployments/sandbox/tiny-chat.yaml",
        "token_secret_block=hf-token", "image=vllm/vllm-openai:v0.33.0", "service=tiny_chat_v2",
    )  # fmt: skip
    run = finished(prefect, flow_run_id)
    assert run.state_name == "Failed", run.state
    # Every finding, each with its fix, in the run's state (the UI's run page); `prefect flow-run execute` exits 0
    # after reporting that state itself, so the job succeeded and the worker had nothing to add.
    findings = [line for line in (run.state.message or "").splitlines() if line.startswith("- error: ")]
    assert any("image" in f and "CUDA" in f for f in findings), run.state.message
    assert any(f.startswith("- error: service") for f in findings), run.state.message


@pytest.mark.slow
def test_a_runner_without_a_deployer_role_fails_naming_the_permission_and_the_grant(
    sandbox: SandboxHandle, prefect: dict[str, str], pipeline: Pipeline, worker: Path
):
    member = f"serviceAccount:{pipeline.runner}"
    sandbox.set_caller_roles([r for r in pipeline.roles if r != "roles/compute.networkAdmin"], member=member)
    try:
        flow_run_id = deployment_run(
            prefect, "promote-model/promote", "model=sandbox/tiny-chat", "spec_file=deployments/sandbox/tiny-chat.yaml",
            "token_secret_block=hf-token",
        )  # fmt: skip
        run = finished(prefect, flow_run_id)
    finally:
        sandbox.set_caller_roles(list(pipeline.roles), member=member)
    assert run.state_name == "Failed", run.state
    message = f"{run.state.message}\n{run_logs(prefect, flow_run_id)}"
    assert "compute.networks.get" in message and "roles/compute.networkAdmin" in message, message[-4000:]
    assert pipeline.runner in message, message[-4000:]  # who lacks it: the pool's identity, not whoever looks


@pytest.mark.slow
def test_a_staging_longer_than_the_jobs_timeout_is_stopped_and_the_run_crashes(
    sandbox: SandboxHandle, prefect: dict[str, str], pipeline: Pipeline, worker: Path
):
    # The Hub's CDN sends 64 KiB every 5 s: the staging (4 MB) cannot finish within the job's 40 s, so no candidate
    # is ever deployed and, unlike in the cancel test below, nothing after staging needs holding.
    sandbox.add_fault("cdn", action="slow", delay_s=5)
    since = sandbox.last_request_seq()
    try:
        flow_run_id = deployment_run(
            prefect, "promote-model/promote", "model=sandbox/tiny-chat", "revision=dev", "service=slow-chat",
            "token_secret_block=hf-token", "target=sandbox", job_variables=("timeout=40",),
        )  # fmt: skip
        run = finished(prefect, flow_run_id)
    finally:
        sandbox.clear_faults("cdn")
    assert run.state_name == "Crashed", run.state
    assert len(started_jobs(sandbox, since)) == 1
    logs = run_logs(prefect, flow_run_id)
    assert "The configured timeout was reached." in logs, logs[-4000:]


def delete_job_mid_run(sandbox: SandboxHandle, job: str) -> None:
    """What kill_infrastructure does (prefect-gcp's JobV2.delete): delete each execution, then the job."""
    session = httpx.Client(base_url=sandbox.control_url, timeout=60)
    listed = session.get(f"{job}/executions").json().get("executions", [])
    for execution in listed:
        session.delete(f"/v2/{execution['name']}").raise_for_status()
    session.delete(job).raise_for_status()


@pytest.mark.slow
def test_a_job_killed_mid_run_crashes_the_run_and_the_next_run_finishes_the_promotion(
    sandbox: SandboxHandle, prefect: dict[str, str], pipeline: Pipeline, worker: Path
):
    params = ("model=sandbox/tiny-chat", "revision=v1.0", "service=killed-chat", "token_secret_block=hf-token",
              "target=sandbox", "profile=l4")  # fmt: skip
    sandbox.add_fault("cdn", action="slow", delay_s=5)  # a slow staging: the kill lands mid-run
    since = sandbox.last_request_seq()
    try:
        flow_run_id = deployment_run(prefect, "promote-model/promote", *params)
        [job] = wait_until(lambda: started_jobs(sandbox, since), 600, "the job's execution to start")
        wait_until(lambda: "staging" in run_logs(prefect, flow_run_id), 600, "the staging to start")
        delete_job_mid_run(sandbox, f"/v2/projects/sandbox-project/locations/us-central1/jobs/{job}")
        killed = finished(prefect, flow_run_id)
    finally:
        sandbox.clear_faults("cdn")
    assert killed.state_name == "Crashed", f"{killed.state}\n{run_logs(prefect, flow_run_id)[-3000:]}"
    # Why, in the run's logs: the worker's next executions.get was a 404 (its log lines arrive in batches).
    wait_until(lambda: "was deleted" in run_logs(prefect, flow_run_id), 120, "the worker's account of the kill")
    # The lock the killed run held expires with its lease; the same promotion then completes (resumed staging).
    again = finished(prefect, deployment_run(prefect, "promote-model/promote", *params))
    assert again.state_name == "Completed", f"{again.state}\n{run_logs(prefect, again.id)[-4000:]}"
    assert "killed-chat: promoted" in report(prefect, "killed-chat")


@pytest.mark.slow
def test_a_run_cancelled_mid_run_stops_its_job(
    sandbox: SandboxHandle, prefect: dict[str, str], pipeline: Pipeline, worker: Path
):
    """`prefect flow-run cancel` on a running flow: the flow in the job cancels itself (Prefect 3.9's workers kill
    only pending runs' infrastructure); the execution ends and the worker deletes the job."""
    sandbox.add_fault("cdn", action="slow", delay_s=5)
    # Nor may it finish before the cancel lands: its candidate answers /health 503 until the test ends (a first
    # deploy is not watched, so nothing after staging would otherwise hold it).
    sandbox.add_fault(
        "run:cancelled-chat:candidate", method="GET", path="^/health$", action="status", status=503,
        may_not_fire="a guard: the cancel normally lands in the slow staging, before any candidate exists",
    )  # fmt: skip
    since = sandbox.last_request_seq()
    try:
        flow_run_id = deployment_run(
            prefect, "promote-model/promote", "model=sandbox/tiny-chat", "revision=dev", "service=cancelled-chat",
            "token_secret_block=hf-token", "target=sandbox",
        )  # fmt: skip
        [job] = wait_until(lambda: started_jobs(sandbox, since), 600, "the job's execution to start")
        wait_until(lambda: "staging" in run_logs(prefect, flow_run_id), 600, "the staging to start")
        run_command([PREFECT, "flow-run", "cancel", str(flow_run_id)], prefect)
        cancelled = finished(prefect, flow_run_id)
    finally:
        sandbox.clear_faults("cdn")
        sandbox.clear_faults("run:cancelled-chat:candidate")
    assert cancelled.state_name == "Cancelled", cancelled.state
    path = f"/v2/projects/sandbox-project/locations/us-central1/jobs/{job}"
    wait_until(lambda: httpx.get(f"{sandbox.control_url}{path}", timeout=30).status_code == 404, 120, "the job gone")


@pytest.mark.slow
@pytest.mark.usefixtures("raised_quota")  # two L4 services at once: 64 GiB, above a new project's 40 (test_new_project)
def test_promotions_run_as_jobs_side_by_side_and_one_service_serializes(
    sandbox: SandboxHandle, prefect: dict[str, str], pipeline: Pipeline, worker: Path
):
    since = sandbox.last_request_seq()
    common = ("model=sandbox/tiny-chat", "token_secret_block=hf-token", "target=sandbox", "profile=l4")
    runs = [
        deployment_run(prefect, "promote-model/promote", *common, "service=side-a"),
        deployment_run(prefect, "promote-model/promote", *common, "service=side-b"),
        deployment_run(prefect, "promote-model/promote", *common, "service=side-b"),
    ]
    states = [finished(prefect, run) for run in runs]
    assert [s.state_name for s in states] == ["Completed"] * 3, unfinished(prefect, runs, states)
    started = started_jobs(sandbox, since)
    assert len(started) == 3, started
    # Side by side: the sandbox ran the jobs' tasks at the same time (their executions overlap in time).
    windows = job_windows(sandbox, since)
    assert any(a[0] < b[1] and b[0] < a[1] for i, a in enumerate(windows) for b in windows[i + 1 :]), windows
    # One service: the two promotions of side-b held its lock (flows/common.py) one after the other: the task runs
    # each ran under it (all but hf_resolve_model, which runs before the lock is taken) do not interleave.
    first, second = sorted(locked_window(prefect, run) for run in runs[1:])
    assert first[1] <= second[0], (first, second)


def locked_window(env: dict[str, str], flow_run_id: UUID) -> tuple[float, float]:
    """From the first task run under the service lock to the end of the last."""
    with SyncPrefectClient(api=env["PREFECT_API_URL"], auth_string=env["PREFECT_API_AUTH_STRING"]) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    locked = [r for r in runs if not r.name.startswith("hf_resolve_model") and r.start_time and r.end_time]
    assert locked, [r.name for r in runs]
    return min(r.start_time.timestamp() for r in locked), max(r.end_time.timestamp() for r in locked)


def job_windows(sandbox: SandboxHandle, since: int) -> list[tuple[float, float]]:
    """(jobs.run, deletion) request times of each job the worker ran since ``since``."""
    started = set(started_jobs(sandbox, since))
    spans: dict[str, list[float]] = {}
    for request in sandbox.requests("control", since=since):
        if "/jobs/" in request["path"]:
            job = request["path"].split("/jobs/")[1].split("/")[0].split(":")[0]
            if job in started:
                spans.setdefault(job, []).append(request["time"])
    return [(min(times), max(times)) for times in spans.values()]


@pytest.mark.slow
def test_the_pools_concurrency_limit_holds_runs_back(
    sandbox: SandboxHandle, prefect: dict[str, str], pipeline: Pipeline, worker: Path
):
    run_command([PREFECT, "work-pool", "set-concurrency-limit", pipeline.pool, "1"], prefect)
    since = sandbox.last_request_seq()
    try:
        common = ("model=sandbox/tiny-chat", "token_secret_block=hf-token", "target=sandbox", "profile=l4")
        runs = [deployment_run(prefect, "promote-model/promote", *common, f"service=limited-{i}") for i in range(2)]
        states = [finished(prefect, run) for run in runs]
    finally:
        run_command([PREFECT, "work-pool", "clear-concurrency-limit", pipeline.pool], prefect)
    assert [s.state_name for s in states] == ["Completed"] * 2, unfinished(prefect, runs, states)
    assert len(started_jobs(sandbox, since)) == 2
    # One at a time: the worker submitted the second run only when the first had finished (it freed the slot).
    first, second = sorted((s.start_time, s.end_time) for s in states)
    assert first[1] <= second[0], (first, second)


@pytest.mark.slow
def test_a_run_cancelled_while_its_job_is_pending_never_starts_the_promotion(
    sandbox: SandboxHandle, prefect: dict[str, str], pipeline: Pipeline, worker: Path
):
    """Cancelled while its Cloud Run job is still provisioning: Prefect 3.9.1's worker does not kill the job (its
    FlowRunCancellingObserver dispatches only runs it is still submitting: prefect/workers/base.py registers a run
    before jobs.run and drops it once the run is "submitted to infrastructure"), so the job starts, and the flow
    engine in it finds the run Cancelling and ends it Cancelled before the flow's first step; the worker then deletes
    the job. No promotion work is done: no service, no staging."""
    before = sandbox.configure()["job_start_seconds"]
    sandbox.configure(job_start_seconds=6_000)  # a minute of real time provisioning: the cancel lands in it
    since = sandbox.last_request_seq()
    try:
        flow_run_id = deployment_run(
            prefect, "promote-model/promote", "model=sandbox/tiny-chat", "service=pending-chat",
            "token_secret_block=hf-token", "target=sandbox",
        )  # fmt: skip
        [job] = wait_until(lambda: started_jobs(sandbox, since), 600, "the job's execution to be submitted")
        run_command([PREFECT, "flow-run", "cancel", str(flow_run_id)], prefect)
        cancelled = finished(prefect, flow_run_id)
    finally:
        sandbox.configure(job_start_seconds=before)
    assert cancelled.state_name == "Cancelled", f"{cancelled.state}\n{run_logs(prefect, flow_run_id)[-3000:]}"
    assert cancelled.start_time is None or "staging" not in run_logs(prefect, flow_run_id)
    service = "/v2/projects/sandbox-project/locations/us-central1/services/pending-chat"
    assert httpx.get(f"{sandbox.control_url}{service}", timeout=30).status_code == 404
    path = f"/v2/projects/sandbox-project/locations/us-central1/jobs/{job}"
    wait_until(lambda: httpx.get(f"{sandbox.control_url}{path}", timeout=30).status_code == 404, 120, "the job gone")


@pytest.mark.slow
def test_a_new_model_file_the_pools_image_does_not_hold_is_refused_naming_the_image(
    sandbox: SandboxHandle, prefect: dict[str, str], pipeline: Pipeline, tmp_path: Path
):
    """The pool's image was built from the project as bootstrap found it; a team then adds a model file. Every run
    reads its spec file inside that image, so `bootstrap deploy` refuses to register it, naming the image and the
    rebuild, before anything changes."""
    project = copy_of_project(tmp_path / "project")
    model = add_model_file(project)
    since = sandbox.last_request_seq()
    done = subprocess.run([sys.executable, "-m", "flows.bootstrap", "deploy", "--name", TARGET_BLOCK], cwd=project,
                          env=prefect, capture_output=True, text=True, timeout=900)  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    [error] = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert f"work pool '{pipeline.pool}' runs the worker image " in error, error
    assert f"--build-worker-image --name {TARGET_BLOCK}" in error
    assert not [r for r in sandbox.requests(since=since) if r["method"] not in ("GET", "HEAD")]
    with SyncPrefectClient(api=prefect["PREFECT_API_URL"], auth_string=prefect["PREFECT_API_AUTH_STRING"]) as client:
        assert not [d for d in client.read_deployments() if d.name == model]
