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

from tasks.checks.findings import PreflightError
from tasks.checks.in_use import observed_instances
from tasks.common import clients
from tasks.deploy.probe import VerificationFailed
from tests.support.artifacts import artifact
from tests.support.locks import wait_until
from tests.support.promotion import promote, promote_watched, run_service
from tests.support.region import running, writes

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
