"""The Cloud Run stand-in as a new project's region at run time: what running instances and job tasks hold counts
against the quotas (20 vCPU, 40 GiB, 3 L4), an idle instance holds its share until Cloud Run's idle time has
passed, and an unknown bearer token is refused."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator

import httpx
import pytest
from google.api_core import exceptions
from google.cloud import run_v2

from tasks.common import clients
from tests.support.identity import bearer
from tests.support.locks import wait_until
from tests.support.sandbox_config import sandbox_settings
from tests.support.services import MODEL_GARDEN, gpu_service

BUCKET = "capacity-test-weights"
_ids = itertools.count()
# Raw calls grant the weights bucket without the product's wait for propagation.
pytestmark = pytest.mark.usefixtures("grants_propagated")


@pytest.fixture
def fresh(sb, services, sandbox_target) -> Iterator[list[str]]:
    """Service ids to use; what earlier tests left idle is gone first, and these are deleted afterwards."""
    sb.run("POST", "/idle")
    made: list[str] = []
    yield made
    for service_id in made:
        with contextlib.suppress(exceptions.NotFound):
            services.delete_service(name=f"{sandbox_target.location_path}/services/{service_id}").result(
                polling=clients.operation_polling(sandbox_target)
            )


def deploy(services, target, made: list[str], spec: run_v2.Service) -> run_v2.Service:
    service_id = f"cap-{next(_ids)}"
    made.append(service_id)
    return services.create_service(parent=target.location_path, service=spec, service_id=service_id).result(
        timeout=120, polling=clients.operation_polling(target)
    )


def kept_warm(spec: run_v2.Service) -> run_v2.Service:
    """``spec`` with a minimum of one instance: it holds its share however long the next deploys take on a busy host
    (an idle instance would stop after Cloud Run's idle time)."""
    spec.template.scaling.min_instance_count = 1
    return spec


def running(sb) -> list[str]:
    return [i["revision"] for i in sb.run("GET", "/instances") if i["running"]]


def test_a_second_l4_instance_does_not_start_beside_the_first_on_a_new_projects_memory(
    sb, services, sandbox_target, fresh
):
    first = deploy(services, sandbox_target, fresh, gpu_service(BUCKET))  # 8 vCPU, 32 GiB of 20 and 40
    with pytest.raises(exceptions.GoogleAPICallError) as refused:
        deploy(services, sandbox_target, fresh, gpu_service(BUCKET))
    assert "is not ready and cannot serve traffic. Quota exceeded for total allowable memory per project per " \
        "region." in str(refused.value)  # fmt: skip
    assert running(sb) == [first.latest_ready_revision]
    # Once the first has been idle for Cloud Run's idle time, its instance is gone and the second starts.
    sb.run("POST", "/idle")
    second = deploy(services, sandbox_target, fresh, gpu_service(BUCKET))
    assert second.latest_ready_revision in running(sb)


def test_vcpu_is_counted_as_well(sb, services, sandbox_target, fresh):
    with sandbox_settings(sb, memory_quota_gib=800):  # memory out of the way: vCPU alone decides (8 + 8 + 8 > 20)
        deploy(services, sandbox_target, fresh, kept_warm(gpu_service(BUCKET, memory="16Gi")))
        deploy(services, sandbox_target, fresh, kept_warm(gpu_service(BUCKET, memory="16Gi")))
        with pytest.raises(exceptions.GoogleAPICallError, match="Quota exceeded for total allowable CPU per project"):
            deploy(services, sandbox_target, fresh, gpu_service(BUCKET, memory="16Gi"))


def test_an_idle_instance_stops_after_cloud_runs_idle_time_and_the_next_request_starts_one(
    sb, services, sandbox_target, fresh
):
    with sandbox_settings(sb, idle_instance_seconds=300):  # 3 s at the default clock, so that the test is short
        service = deploy(services, sandbox_target, fresh, gpu_service(BUCKET))
        revision = service.latest_ready_revision
        assert revision in running(sb)
        wait_until(lambda: revision not in running(sb), 120, "the idle instance to stop")
    answer = httpx.get(f"{service.uri}/health", headers=bearer(service.uri), timeout=120)  # a cold start
    assert answer.status_code == 200 and revision in running(sb)


def test_a_job_task_holds_its_share_while_it_runs(sb, services, sandbox_target, fresh):
    deploy(services, sandbox_target, fresh, kept_warm(gpu_service(BUCKET)))  # 32 GiB of 40
    jobs = clients.run_jobs(sandbox_target)
    job_id = f"cap-job-{next(_ids)}"
    limits = run_v2.ResourceRequirements(limits={"cpu": "4", "memory": "16Gi"})
    # An image the sandbox's Cloud Run knows; a job task runs its command on this host's Python (job_tasks.py).
    container = run_v2.Container(image=MODEL_GARDEN, command=["python", "-c", "print(1)"], resources=limits)
    task = run_v2.TaskTemplate(containers=[container], max_retries=0)
    job = run_v2.Job(template=run_v2.ExecutionTemplate(template=task))
    jobs.create_job(parent=sandbox_target.location_path, job=job, job_id=job_id).result(
        polling=clients.operation_polling(sandbox_target)
    )
    try:
        with pytest.raises(exceptions.GoogleAPICallError, match="Quota exceeded for total allowable memory"):
            jobs.run_job(name=f"{sandbox_target.location_path}/jobs/{job_id}").result(
                timeout=120, polling=clients.operation_polling(sandbox_target)
            )
    finally:
        jobs.delete_job(name=f"{sandbox_target.location_path}/jobs/{job_id}").result(
            polling=clients.operation_polling(sandbox_target)
        )


def test_a_bearer_token_google_never_issued_is_refused_401(sandbox_target):
    url = f"{sandbox_target.endpoint('run')}/v2/{sandbox_target.location_path}/services"
    answer = httpx.get(url, headers={"Authorization": "Bearer ya29.not-a-token-google-issued"}, timeout=30)
    assert answer.status_code == 401
    assert answer.json()["error"]["status"] == "UNAUTHENTICATED"
    assert httpx.get(url, timeout=30).status_code == 200  # no token: the sandbox's anonymous caller
