"""promote-model on a new project, as Google ships it: the sandbox's defaults (20 vCPU, 40 GiB and 3 L4 GPUs in the
region, every running instance counted, idle instances kept 15 minutes, a stopped instance's GPU released later).

One L4 instance (8 vCPU, 32 GiB) fits; a second beside it does not (64 GiB of 40). Preflight adds up what runs in the
region (tasks/checks/in_use.py) and refuses, before any write, what Cloud Run would not start: a zero-downtime
re-promotion, which keeps the serving revision up beside the candidate, and a second service beside the first. A
replace rollout that sends traffic back gets the old revision its GPU back: the candidate's instance is stopped first
(an idle one would hold it for up to 15 minutes), and the promotion returns once the old revision answers again.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import httpx
import pytest
from google.api_core.exceptions import NotFound
from google.cloud import run_v2

from tasks.checks.findings import PreflightError
from tasks.checks.in_use import observed_instances
from tasks.common import clients
from tasks.common.permissions import DEPLOYER_ROLES
from tasks.deploy.cloudrun import DeployFailed
from tasks.deploy.probe import VerificationFailed
from tests.support.artifacts import artifact
from tests.support.locks import wait_until
from tests.support.promotion import promote, promote_watched, run_service
from tests.support.region import running, writes
from tests.support.services import MODEL_GARDEN

pytestmark = pytest.mark.prefect
_ids = itertools.count()
SLO = {"max_error_ratio": 0.02, "max_p95_ms": "off", "min_requests": 5}  # the fault here is errors, not latency


def answers(flow_env, service: str) -> httpx.Response:
    url = run_service(flow_env, service).uri
    token = clients.identity_token(flow_env, url).get_secret_value()
    return httpx.get(f"{url}/health", headers={"Authorization": f"Bearer {token}"}, timeout=60)


@pytest.fixture
def one_l4(sb) -> Iterator[None]:
    """One L4 in the region: a replace rollout's old and new revisions take turns on it."""
    before = sb.configure()
    sb.run("POST", "/idle")  # what earlier tests left idle holds no GPU any more, as after Cloud Run's idle time
    sb.configure(gpu_quota={**before["gpu_quota"], "nvidia-l4": 1})
    yield
    sb.configure(gpu_quota=before["gpu_quota"])


def test_a_zero_downtime_repromotion_that_memory_cannot_hold_is_refused_and_replace_promotes(sb, flow_env):
    service = f"new-project-{next(_ids)}"
    old = promote(service).serving_revision
    since = sb.last_request_seq()
    with pytest.raises(PreflightError) as refused:
        promote(service, revision="dev")
    message = str(refused.value)
    assert "MemAllocPerProjectRegion" in message and "memory" in message, message
    assert "of the project's 40 GiB" in message and f"revision {old}" in message
    assert "set rollout: replace" in message
    assert writes(sb, since) == []  # refused before anything was spent

    report = promote(service, revision="dev", rollout="replace")
    assert report.outcome == "promoted" and report.serving_revision != old, report.reason
    assert running(sb, service) == [report.serving_revision]


def test_new_flags_on_the_same_weights_that_memory_cannot_hold_are_refused_before_the_deploy(sb, flow_env):
    """The same weights with another load mode (a new image or new vLLM flags alike) make a new candidate: once the
    image is known, the room check judges it like new weights, and refuses it before any write to the service."""
    service = f"new-flags-{next(_ids)}"
    old = promote(service).serving_revision
    assert promote(service).outcome == "unchanged"  # the same inputs make no candidate: nothing to judge
    since = sb.last_request_seq()
    with pytest.raises(PreflightError) as refused:
        promote(service, load_mode="runai-streamer")
    message = str(refused.value)
    assert "MemAllocPerProjectRegion" in message and f"revision {old}" in message, message
    assert "set rollout: replace" in message
    assert not [w for w in writes(sb, since) if "/services/" in w], writes(sb, since)
    report = promote(service, load_mode="runai-streamer", rollout="replace")
    assert report.outcome == "promoted" and report.serving_revision != old, report.reason


def test_a_running_jobs_share_counts_and_a_service_that_does_not_fit_beside_it_is_refused(sb, flow_env):
    """A job's running task holds its container's vCPU and memory (this pipeline's own job on a cloud-run-v2 pool
    among them): a first L4 service (32 GiB) does not fit beside a 16 GiB task on a 40 GiB project."""
    jobs, job_id = clients.run_jobs(flow_env), f"staging-job-{next(_ids)}"
    limits = run_v2.ResourceRequirements(limits={"cpu": "4", "memory": "16Gi"})
    container = run_v2.Container(image=MODEL_GARDEN, command=["python", "-c", "import time; time.sleep(600)"],
                                 resources=limits)  # fmt: skip
    job = run_v2.Job(template=run_v2.ExecutionTemplate(template=run_v2.TaskTemplate(containers=[container])))
    name = f"{flow_env.location_path}/jobs/{job_id}"
    jobs.create_job(parent=flow_env.location_path, job=job, job_id=job_id).result(
        polling=clients.operation_polling(flow_env)
    )
    try:
        jobs.run_job(name=name)  # runs on: its execution holds the share until it is cancelled
        executions = clients.run_executions(flow_env)
        wait_until(lambda: any(e.running_count for e in executions.list_executions(parent=name)), 120,
                   "the job's task to run")  # fmt: skip
        service = f"beside-job-{next(_ids)}"
        since = sb.last_request_seq()
        with pytest.raises(PreflightError) as refused:
            promote(service)
        message = str(refused.value)
        assert f"job {job_id}: 1 x 16 GiB" in message and "MemAllocPerProjectRegion" in message, message
        assert "stop or scale down what holds it" in message
        assert not [w for w in writes(sb, since) if "/services/" in w]
    finally:
        for execution in clients.run_executions(flow_env).list_executions(parent=name):
            if not execution.completion_time:
                clients.run_executions(flow_env).cancel_execution(name=execution.name).result(
                    polling=clients.operation_polling(flow_env)
                )
        jobs.delete_job(name=name).result(polling=clients.operation_polling(flow_env))


def test_an_instance_cloud_run_refuses_for_the_quota_at_the_deploy_says_what_to_do(sb, flow_env, traffic):
    """A room check that cannot read Cloud Monitoring (no roles/monitoring.viewer) judges by minimums and misses an
    instance that runs without one; Cloud Run then refuses the candidate's instance at the deploy. The failure keeps
    Cloud Run's words and says what to do about them."""
    first, second = f"busy-{next(_ids)}", f"unseen-{next(_ids)}"
    promote(first)
    traffic(first)  # its instance stays up, with no minimum to count it by
    without_monitoring = [n.role for n in DEPLOYER_ROLES if n.role != "roles/monitoring.viewer"]
    with sb.caller_roles(without_monitoring), pytest.raises(DeployFailed) as refused:
        promote(second)
    message = str(refused.value)
    assert "Quota exceeded for total allowable memory per project per region." in message, message
    assert "stop or scale down what else runs in the region, or request more of that quota" in message
    assert "rollout: replace" not in message  # a first deploy: nothing of its own runs beside it
    with pytest.raises(NotFound):
        run_service(flow_env, second)  # a first deploy that never served is removed


def test_a_second_service_that_does_not_fit_beside_the_first_is_refused_before_any_write(sb, flow_env, traffic):
    first, second = f"first-{next(_ids)}", f"second-{next(_ids)}"
    promote(first)
    traffic(first)  # the first has users: its instance stays up, and Cloud Monitoring counts it
    wait_until(lambda: any(service == first for service, _ in observed_instances(flow_env)), 120,
               f"Cloud Monitoring's instance count of {first}")  # fmt: skip
    since = sb.last_request_seq()
    with pytest.raises(PreflightError) as refused:
        promote(second)
    message = str(refused.value)
    assert f"service {first}" in message and "MemAllocPerProjectRegion" in message, message
    assert "rollout: replace" not in message  # nothing of the second's own to stop: only quota helps
    assert "request MemAllocPerProjectRegion of" in message
    assert writes(sb, since) == []
    with pytest.raises(NotFound):
        run_service(flow_env, second)


def test_a_replace_candidate_failing_verification_gives_the_old_revision_its_gpu_back(sb, flow_env, one_l4):
    service = f"replace-verify-{next(_ids)}"
    old = promote(service).serving_revision
    # The candidate starts and answers /health, but its chat fails: verification fails with its instance up. (The
    # first tries may be refused while Cloud Run releases the old revision's GPU: each new revision gets the fault.)
    sb.run("POST", "/faults", json={"service": service, "faults": {"fail_prompts_longer_than": 1}, "revisions": 5})
    with pytest.raises(VerificationFailed):
        promote(service, revision="dev", rollout="replace")
    # Back when the promotion returned: the candidate stopped (its GPU freed), the old revision answering on it.
    assert running(sb, service) == [old]
    answer = answers(flow_env, service)
    assert answer.status_code == 200 and answer.headers["x-sandbox-revision"] == old
    current = run_service(flow_env, service)
    assert current.scaling.scaling_mode.name == "AUTOMATIC"
    assert [(s.revision, s.percent) for s in current.traffic_statuses if s.percent] == [(old, 100)]
    assert "the old revision answered again" in artifact(f"promotion-{service}")


def test_a_replace_candidate_breaching_its_watch_gives_the_old_revision_its_gpu_back(sb, flow_env, one_l4, traffic):
    service = f"replace-watch-{next(_ids)}"
    old = promote(service).serving_revision
    client = traffic(service)
    # Every long prompt of the candidate's users fails: the watch at 100 % breaches and rolls back.
    sb.run("POST", "/faults", json={"service": service, "faults": {"fail_prompts_longer_than": 40}, "revisions": 5})
    with pytest.raises(Exception, match="breached the SLO"):
        promote_watched(service, revision="dev", rollout="replace", watch={"samples": 10, **SLO})
    client.stop.set()
    assert running(sb, service) == [old]
    answer = answers(flow_env, service)
    assert answer.status_code == 200 and answer.headers["x-sandbox-revision"] == old
    assert run_service(flow_env, service).scaling.scaling_mode.name == "AUTOMATIC"
    assert "the old revision answered again" in artifact(f"promotion-{service}")
