"""A cold start as Cloud Logging shows it (issue 38): Cloud Run's own lines in varlog/system (why the instance started,
its startup probe passing, its end) around the container's lines, each stamped when it arrived, on the stream the
container wrote it to. Read through entries.list with a real authorized session, as the product reads it."""

from __future__ import annotations

import re

import httpx
import pytest
from google.cloud import run_v2
from google.protobuf import timestamp_pb2

from tasks.common import clients
from tasks.deploy.revision_logs import revision_filter
from tests.support.identity import bearer
from tests.support.locks import wait_until
from tests.support.services import SERVED_NAME, SMALLEST_L4, gpu_service

BUCKET = "cold-start-logs-weights"
SYSTEM = "run.googleapis.com%2Fvarlog%2Fsystem"
AUTOSCALING = (
    "Starting new instance. Reason: AUTOSCALING - Instance started due to configured scaling factors (e.g. CPU "
    "utilization, request throughput, etc.) or no existing capacity for current traffic."
)
ROLLOUT = (
    "Starting new instance. Reason: DEPLOYMENT_ROLLOUT - Instance started due to traffic shifting between revisions "
    "due to deployment, traffic split adjustment, or deployment health check."
)
MIN_INSTANCE = (
    "Starting new instance. Reason: MANUAL_OR_CUSTOMER_MIN_INSTANCE - Instance started because of customer-configured "
    "min-instances or manual scaling."
)
HTTP_PROBE_PASSED = re.compile(
    r'STARTUP HTTP probe succeeded after (1 attempt|[2-9]\d* attempts|1\d+ attempts) for container "vllm-1" on port '
    r'8080 path "/health"\.'
)
RESTART_S = 300  # real seconds for an exit and a fresh start on a busy host
# Raw calls grant the weights bucket, with no product wait for its propagation.
pytestmark = pytest.mark.usefixtures("grants_propagated")


def deploy(services, target, service_id: str, service: run_v2.Service) -> run_v2.Service:
    return services.create_service(parent=target.location_path, service=service, service_id=service_id).result(
        timeout=120, polling=clients.operation_polling(target)
    )


def chat(url: str, stream: bool = False) -> httpx.Response:
    body = {"model": SERVED_NAME, "messages": [{"role": "user", "content": "Say hello"}], "max_tokens": 8}
    return httpx.post(f"{url}/v1/chat/completions", headers=bearer(url), json={**body, "stream": stream}, timeout=120)


def entries(target, *clauses: str) -> list[dict]:
    """Every entry matching all ``clauses``, oldest first."""
    rest = clients.logging_api(target)
    body = {"resourceNames": [f"projects/{target.project}"], "filter": "\n".join(clauses), "pageSize": 1000}
    response = rest.session.post(rest.url("entries:list"), json=body, timeout=30)
    assert response.status_code == 200, response.text
    return response.json().get("entries", [])


def of_revision(target, service: run_v2.Service) -> str:
    return revision_filter(target, service.name.rsplit("/", 1)[1], service.latest_ready_revision.rsplit("/", 1)[1])


def nanos(entry: dict) -> int:
    stamp = timestamp_pb2.Timestamp()
    stamp.FromJsonString(entry["timestamp"])
    return stamp.ToNanoseconds()


def log_of(entry: dict) -> str:
    return entry["logName"].rsplit("/", 1)[1]


def first_index(found: list[dict], fragment: str) -> int:
    return next(i for i, e in enumerate(found) if fragment in e["textPayload"])


def test_a_request_to_a_scaled_to_zero_service_reads_as_a_cold_start(sb, services, sandbox_target, service_id):
    service = deploy(services, sandbox_target, service_id, gpu_service(BUCKET, **SMALLEST_L4))
    sb.run("POST", "/idle")  # Cloud Run's idle time passes: the service has no instance
    assert chat(service.uri).status_code == 200

    revision = of_revision(sandbox_target, service)
    system = entries(sandbox_target, revision, 'logName:"varlog"')
    assert [e["textPayload"] for e in system if e["textPayload"].startswith("Starting new instance")] == [
        ROLLOUT,  # the deploy's instance, stopped at /idle
        AUTOSCALING,  # the request's
    ]
    start = next(e for e in system if e["textPayload"] == AUTOSCALING)
    instance = start["labels"]["instanceId"]
    assert start["labels"]["container_name"] == "vllm-1"
    assert (log_of(start), start["severity"]) == (SYSTEM, "INFO")

    cold = entries(sandbox_target, revision, f'labels.instanceId="{instance}"')
    stamps = [nanos(e) for e in cold]
    assert stamps == sorted(stamps) and len(set(stamps)) == len(stamps), "each line stamped on arrival, in order"
    assert cold[0] == start
    probe = next(i for i, e in enumerate(cold) if HTTP_PROBE_PASSED.fullmatch(e["textPayload"]))
    assert (log_of(cold[probe]), cold[probe]["severity"]) == (SYSTEM, "INFO")
    assert first_index(cold, "Starting to load model") < first_index(cold, "Application startup complete.") < probe
    # Between Cloud Run's two lines, the container's own: vLLM's on stdout, uvicorn's start-up on stderr.
    between = {log_of(e) for e in cold[1:probe]}
    assert between == {"run.googleapis.com%2Fstdout", "run.googleapis.com%2Fstderr"}
    assert log_of(cold[first_index(cold, "Starting to load model")]) == "run.googleapis.com%2Fstdout"
    assert log_of(cold[first_index(cold, "Application startup complete.")]) == "run.googleapis.com%2Fstderr"
    # The line stamps span the start in real time: the first container line after the start line, the probe last.
    assert stamps[1] > stamps[0] and stamps[probe] >= stamps[first_index(cold, "Application startup complete.")]

    # The same entries through the filters a cold-start reader uses: the system log by name, and time.
    project = sandbox_target.project
    by_name = entries(sandbox_target, revision, f'logName="projects/{project}/logs/{SYSTEM}"')
    assert [e["insertId"] for e in by_name] == [e["insertId"] for e in system]
    since = entries(sandbox_target, revision, f'timestamp>="{start["timestamp"]}"', f'labels.instanceId="{instance}"')
    assert [e["insertId"] for e in since] == [e["insertId"] for e in cold]


def test_a_deploy_with_cloud_runs_default_probe_logs_a_rollout(services, sandbox_target, service_id):
    spec = gpu_service(BUCKET, **SMALLEST_L4)
    del spec.template.containers[0].startup_probe  # Cloud Run's own TCP probe on the container port
    service = deploy(services, sandbox_target, service_id, spec)
    system = entries(sandbox_target, of_revision(sandbox_target, service), f'logName:"{SYSTEM}"')
    assert [e["textPayload"] for e in system] == [
        ROLLOUT,
        'Default STARTUP TCP probe succeeded after 1 attempt for container "vllm-1" on port 8080.',
    ]
    assert {e["labels"]["instanceId"] for e in system} == {system[0]["labels"]["instanceId"]}
    assert {e["severity"] for e in system} == {"INFO"}


def test_an_exit_is_cloud_runs_line_and_a_minimum_starts_the_next_instance(sb, services, sandbox_target, service_id):
    # The engine dies under a stream and vLLM's API server exits 0 (sandbox/vllm/instance.py): Cloud Run logs the exit
    # at WARNING in its own log, not as the container's output, and the revision's minimum starts another instance.
    sb.run("POST", "/faults", json={"service": service_id, "faults": {"engine_dies_mid_stream": 1}})
    spec = gpu_service(BUCKET, **SMALLEST_L4)
    spec.template.scaling.min_instance_count = 1
    service = deploy(services, sandbox_target, service_id, spec)
    assert chat(service.uri, stream=True).status_code == 200
    revision = of_revision(sandbox_target, service)

    def restarted() -> bool:
        now = next(i for i in sb.run("GET", "/instances") if i["revision"] == service.latest_ready_revision)
        return now["restarts"] == 1 and now["running"] and now["ready_at"] is not None

    wait_until(restarted, RESTART_S, "the revision's minimum to start a new instance")
    system = entries(sandbox_target, revision, 'logName:"varlog"')
    texts = [e["textPayload"] for e in system]
    exited = texts.index("Container called exit(0).")
    assert texts[0] == ROLLOUT and texts[exited + 1] == MIN_INSTANCE
    assert (system[exited]["severity"], system[exited]["labels"]["container_name"]) == ("WARNING", "vllm-1")
    assert system[exited]["labels"]["instanceId"] == system[0]["labels"]["instanceId"]
    assert system[exited + 1]["labels"]["instanceId"] != system[0]["labels"]["instanceId"]
    warnings = entries(sandbox_target, revision, "severity=WARNING")
    assert [e["textPayload"] for e in warnings if "Container called" in e["textPayload"]] == texts[exited : exited + 1]
    for stream in ("stdout", "stderr"):
        written = entries(sandbox_target, revision, f'logName:"{stream}"')
        assert written and not any("Container called" in e["textPayload"] for e in written)
