"""A revision whose engine dies is restarted (issue 35): by Cloud Run's liveness probe when vLLM's API server keeps
answering over a dead engine, and as a container that exited when the server shuts itself down; either way the
service answers again and the revision's logs say what happened, in Cloud Run's words."""

from __future__ import annotations

import httpx
import pytest
from google.api_core import exceptions
from google.cloud import run_v2

from tasks.common import clients
from tasks.deploy.render import LIVENESS_FAILURES, LIVENESS_PERIOD_S, LIVENESS_TIMEOUT_S
from tasks.deploy.revision_logs import revision_log_tail
from tests.support.identity import bearer
from tests.support.locks import wait_until
from tests.support.services import SERVED_NAME, gpu_service

BUCKET = "liveness-test-weights"
# The product's liveness probe (tasks/deploy/render.py), on vLLM's /health.
LIVENESS = run_v2.Probe(
    http_get=run_v2.HTTPGetAction(path="/health", port=8080),
    period_seconds=LIVENESS_PERIOD_S,
    timeout_seconds=LIVENESS_TIMEOUT_S,
    failure_threshold=LIVENESS_FAILURES,
)
LIVENESS_LINE = (
    'LIVENESS HTTP probe failed 3 times consecutively for container "vllm-1" on port 8080 path "/health". '
    "The instance has been shut down."
)
RESTART_S = 300  # real seconds for the probe's misses and a fresh start on a busy host
# Raw calls grant the weights bucket, with no product wait for its propagation.
pytestmark = pytest.mark.usefixtures("grants_propagated")


def deploy_with_fault(sb, services, target, service_id: str, faults: dict, **spec) -> run_v2.Service:
    """The service's first instance starts with ``faults``; an instance started later has none."""
    sb.run("POST", "/faults", json={"service": service_id, "faults": faults})
    # The smallest L4 instance (4 vCPU / 16 GiB): a new project's 20 vCPU / 40 GiB holds it.
    service = gpu_service(BUCKET, cpu="4", memory="16Gi", **spec)
    return services.create_service(parent=target.location_path, service=service, service_id=service_id).result(
        timeout=120, polling=clients.operation_polling(target)
    )


def chat(url: str, stream: bool = False) -> httpx.Response:
    body = {"model": SERVED_NAME, "messages": [{"role": "user", "content": "Say hello"}], "max_tokens": 8}
    return httpx.post(f"{url}/v1/chat/completions", headers=bearer(url), json={**body, "stream": stream}, timeout=120)


def instance_of(sb, revision: str) -> dict:
    return next(i for i in sb.run("GET", "/instances") if i["revision"] == revision)


def restarted(sb, revision: str, before: dict) -> bool:
    now = instance_of(sb, revision)
    return now["restarts"] == 1 and now["running"] and (now["ready_at"] or 0) > before["ready_at"]


def test_a_dead_engine_fails_its_liveness_probe_and_the_instance_is_restarted(sb, services, sandbox_target, service_id):
    # The engine dies after one request; the API server keeps answering, /health at 503 (vllm-project/vllm#39863).
    service = deploy_with_fault(
        sb, services, sandbox_target, service_id, {"engine_dead_after_requests": 1}, liveness=LIVENESS
    )
    revision = service.latest_ready_revision
    first = instance_of(sb, revision)
    assert chat(service.uri).status_code == 200  # the request after which the engine core dies

    wait_until(lambda: restarted(sb, revision, first), RESTART_S, "the liveness probe to restart the instance")
    answer = chat(service.uri)
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-sandbox-revision"] == service.latest_ready_revision.rsplit("/", 1)[1]

    short = revision.rsplit("/", 1)[1]
    log = revision_log_tail(sandbox_target, service_id, short, lines=1000)
    assert log.count(LIVENESS_LINE) == 1, log[-20:]
    died = log.index(LIVENESS_LINE)
    assert sum('"GET /health HTTP/1.1" 503' in line for line in log[:died]) >= LIVENESS_FAILURES
    # A fresh container started after the shutdown, and it answers its probes again.
    assert any("Application startup complete." in line for line in log[died:])
    assert any('"GET /health HTTP/1.1" 200' in line for line in log[died:])


@pytest.mark.parametrize(
    ("keep_alive", "ended_by"),
    [
        # vLLM's default: the API server shuts down soon after its engine died and exits 0 (launcher.py's watchdog):
        # Cloud Run logs the exit and starts another instance before any liveness verdict.
        (False, "Container called exit(0)."),
        # VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1 keeps the server up over the dead engine: only the probe ends it.
        (True, LIVENESS_LINE),
    ],
    ids=["server-exits", "server-kept-alive"],
)
def test_an_engine_dying_mid_stream_ends_its_instance_and_a_new_one_serves(
    sb, services, sandbox_target, service_id, keep_alive, ended_by
):
    env = {"VLLM_KEEP_ALIVE_ON_ENGINE_DEATH": "1"} if keep_alive else {}
    service = deploy_with_fault(
        sb, services, sandbox_target, service_id, {"engine_dies_mid_stream": 1}, liveness=LIVENESS, env=env
    )
    revision = service.latest_ready_revision
    first = instance_of(sb, revision)
    stream = chat(service.uri, stream=True)
    assert stream.status_code == 200 and "EngineCore encountered an issue" in stream.text

    wait_until(lambda: restarted(sb, revision, first), RESTART_S, "a new instance")
    assert chat(service.uri).status_code == 200

    log = revision_log_tail(sandbox_target, service_id, revision.rsplit("/", 1)[1], lines=1000)
    endings = [line for line in log if line.startswith(("LIVENESS", "Container called", "Container terminated"))]
    assert endings == [ended_by]


def log_lines(sb, revision: str) -> list[str]:
    """The revision's container log as the Cloud Run stand-in wrote it (the admin API reads the file)."""
    return sb.admin.get(f"/run/logs/{revision.rsplit('/', 1)[1]}").text.splitlines()


def test_a_healthy_instance_passes_its_liveness_probes_and_keeps_running(sb, services, sandbox_target, service_id):
    service = deploy_with_fault(sb, services, sandbox_target, service_id, {}, liveness=LIVENESS)
    revision = service.latest_ready_revision

    def probed_after_start() -> int:
        lines = log_lines(sb, revision)
        started = next(i for i, line in enumerate(lines) if "Application startup complete." in line)
        return sum('"GET /health HTTP/1.1" 200' in line for line in lines[started:])

    wait_until(lambda: probed_after_start() >= 2 * LIVENESS_FAILURES, RESTART_S, "liveness probes to pass")
    assert chat(service.uri).status_code == 200
    assert (instance_of(sb, revision)["restarts"], instance_of(sb, revision)["running"]) == (0, True)
    assert not any(line.startswith(("LIVENESS", "Container called")) for line in log_lines(sb, revision))


def test_a_liveness_probe_whose_timeout_exceeds_its_period_is_refused(services, sandbox_target, service_id):
    probe = run_v2.Probe(http_get=run_v2.HTTPGetAction(path="/health"), period_seconds=5, timeout_seconds=10)
    spec = gpu_service(BUCKET, cpu="4", memory="16Gi", liveness=probe)
    with pytest.raises(exceptions.BadRequest, match=r"livenessProbe\.timeoutSeconds: 10 must not exceed"):
        services.create_service(parent=sandbox_target.location_path, service=spec, service_id=service_id)
