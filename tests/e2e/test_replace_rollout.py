"""A re-promotion on one GPU (the RTX Pro 6000's default quota): the candidate cannot start beside the serving
revision, so zero-downtime is refused before anything is spent, naming the quota and the choice; `rollout: replace`
stops the serving revision first (manual scaling to 0, tasks/deploy/rollout.py), verifies the candidate on the freed GPU
and moves all traffic to it, reporting the downtime it caused.

The sandbox counts running instances' GPUs against the quota (``runtime_quota``, a new project's default), as Cloud Run
does ("About maximum instances": quotas are "accounted as a sum of all in-use resources in the region").
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import httpx
import pytest

from tasks.checks.findings import PreflightError
from tasks.common import clients
from tasks.deploy.cloudrun import DeployFailed, deploy_candidate
from tests.support.artifacts import artifact
from tests.support.promotion import promote, run_service
from tests.support.region import running, writes
from tests.support.run_log import run_logs

pytestmark = pytest.mark.prefect
RTX = "rtx-pro-6000"
_ids = itertools.count()


@pytest.fixture
def one_rtx_gpu(sb, raised_quota) -> Iterator[None]:
    """One RTX Pro 6000 (a new project's), in a project whose vCPU and memory quotas were raised for its 20 vCPU and
    80 GiB instance (a new project's 40 GiB holds none)."""
    before = sb.configure()
    sb.configure(gpu_quota={**before["gpu_quota"], "nvidia-rtx-pro-6000": 1})
    yield
    sb.configure(gpu_quota=before["gpu_quota"])


def test_on_one_gpu_a_candidate_cannot_start_beside_the_serving_revision(sb, flow_env, one_rtx_gpu):
    """What zero-downtime meets on one GPU, with the preflight out of the way: Cloud Run's own refusal."""
    service = f"one-gpu-{next(_ids)}"
    old = promote(service, profile=RTX).serving_revision
    spec = run_service(flow_env, service)
    spec.template.revision = f"{service}-beside"
    spec.template.containers[0].env.append({"name": "CHANGED", "value": "1"})
    with pytest.raises(DeployFailed, match=r"Quota exceeded for total allowable count of GPUs per project per region"):
        deploy_candidate(flow_env, service, spec)
    assert running(sb, service) == [old]  # the serving revision kept its GPU and serves


def test_zero_downtime_is_refused_before_any_write_and_replace_promotes_with_its_downtime(
    sb, flow_env, one_rtx_gpu, traffic
):
    service = f"replace-{next(_ids)}"
    old = promote(service, profile=RTX).serving_revision
    since = sb.last_request_seq()
    with pytest.raises(PreflightError) as refused:
        promote(service, profile=RTX, revision="dev")
    message = str(refused.value)
    assert "2 nvidia-rtx-pro-6000 GPUs at once" in message and "quota of 1" in message
    assert "request NvidiaRtxPro6000GpuAllocNoZonalRedundancyPerProjectRegion of 2 GPUs" in message
    assert "set rollout to replace" in message
    assert writes(sb, since) == []  # refused before anything was spent

    client = traffic(service)
    report = promote(service, profile=RTX, revision="dev", rollout="replace")
    client.stop.set()
    assert report.outcome == "promoted" and report.serving_revision != old
    # The downtime users saw: the old revision answered, then nothing did (503), then the new one.
    statuses = [(a.status, a.revision) for a in client.answers]
    first_503 = next(i for i, (status, _) in enumerate(statuses) if status == 503)
    assert all(status == 200 and revision == old for status, revision in statuses[:first_503]), statuses[:first_503]
    assert statuses[-1] == (200, report.serving_revision)
    assert report.downtime is not None and "replace rollout" in report.downtime
    current = run_service(flow_env, service)
    assert [(s.revision, s.percent) for s in current.traffic_statuses if s.percent] == [(report.serving_revision, 100)]
    assert current.scaling.scaling_mode.name == "AUTOMATIC"  # scaling is automatic again
    assert running(sb, service) == [report.serving_revision]  # one GPU, held by the new revision
    assert "| downtime |" in artifact(f"promotion-{service}")
    token = clients.identity_token(flow_env, current.uri).get_secret_value()
    answer = httpx.get(f"{current.uri}/health", headers={"Authorization": f"Bearer {token}"}, timeout=60)
    assert answer.status_code == 200 and answer.headers["x-sandbox-revision"] == report.serving_revision


def test_replace_waits_while_cloud_run_releases_the_stopped_revisions_gpu(sb, flow_env, one_rtx_gpu):
    """Cloud Run releases a stopped instance's GPU some time after it stops (a public single-GPU deploy script
    retries on "Quota exceeded ..." for that): the candidate's first revisions are refused on the quota, and the
    replace rollout deploys again, logged, until the GPU is free; it promotes, and says the downtime grew."""
    service = f"replace-release-{next(_ids)}"
    old = promote(service, profile=RTX).serving_revision
    before = sb.configure()["gpu_release_seconds"]
    sb.configure(gpu_release_seconds=1500)  # 15 s at the default clock: far longer than the stop-to-deploy steps
    try:
        with run_logs() as log:
            report = promote(service, profile=RTX, revision="dev", rollout="replace")
    finally:
        sb.configure(gpu_release_seconds=before)
    assert report.outcome == "promoted" and report.serving_revision != old, report.reason
    waits = [line for line in log.lines if "has not released the stopped revision's GPU yet" in line]
    assert waits, log.text()[-3000:]
    revisions = clients.run_revisions(flow_env).list_revisions(parent=f"{flow_env.location_path}/services/{service}")
    refused = [r.name for r in revisions if any("Quota exceeded for total allowable count of GPUs" in c.message
                                               for c in r.conditions)]  # fmt: skip
    assert len(refused) == len(waits), (refused, waits)  # each refused try logged, then a new revision served
    assert running(sb, service) == [report.serving_revision]
    assert report.downtime is not None and "replace rollout" in report.downtime
    # Run again: the spec serves already, under its later name, so nothing is stopped: no write at all (its instance
    # may idle out meanwhile on a loaded host, as Cloud Run's would; the run must not be what stops it).
    since = sb.last_request_seq()
    again = promote(service, profile=RTX, revision="dev", rollout="replace")
    assert (again.outcome, again.serving_revision, again.downtime) == ("unchanged", report.serving_revision, None)
    assert run_service(flow_env, service).scaling.scaling_mode.name == "AUTOMATIC"
    assert writes(sb, since) == []


def test_a_replace_candidate_that_never_starts_leaves_the_old_revision_serving_again(sb, flow_env, one_rtx_gpu):
    """The serving revision was stopped for the candidate; the candidate crashes at start. The promotion fails, and the
    service scales automatically again with all traffic on the old revision, which answers (a cold start)."""
    service = f"replace-crash-{next(_ids)}"
    old = promote(service, profile=RTX).serving_revision
    # The first tries may be refused while Cloud Run releases the old revision's GPU (gpu_release_seconds): each new
    # revision gets the fault, so the one that starts crashes.
    sb.run("POST", "/faults", json={"service": service, "faults": {"crash_at_start": "CUDA error: out of memory"},
                                    "revisions": 5})  # fmt: skip
    with pytest.raises(DeployFailed, match="CUDA error: out of memory"):
        promote(service, profile=RTX, revision="dev", rollout="replace")
    current = run_service(flow_env, service)
    assert current.scaling.scaling_mode.name == "AUTOMATIC"
    assert [(s.revision, s.percent) for s in current.traffic_statuses if s.percent] == [(old, 100)]
    token = clients.identity_token(flow_env, current.uri).get_secret_value()
    answer = httpx.get(f"{current.uri}/health", headers={"Authorization": f"Bearer {token}"}, timeout=120)
    assert answer.status_code == 200 and answer.headers["x-sandbox-revision"] == old
