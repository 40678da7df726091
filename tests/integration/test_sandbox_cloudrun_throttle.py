"""A revision whose instance is busy: requests beyond its concurrency pend, then Cloud Run answers 429 itself.

The window is 3.5 x the service's start-up time or 10 s, whichever is greater (sandbox/control/run/throttle.py, with
the sources); the 429 lands in the revision's request log and not in Monitoring's request_count."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from google.cloud import run_v2

from tasks.common import clients
from tests.support.identity import bearer
from tests.support.services import SERVED_NAME, gpu_service, health_probe

BUCKET = "throttle-test-weights"
# Raw calls grant the weights bucket, with no product wait for its propagation.
pytestmark = pytest.mark.usefixtures("grants_propagated")


def deploy_slow(sb, services, target, service_id: str, *, seconds_per_request: float, probe: run_v2.Probe):
    """A service taking 2 requests at once, whose every chat takes ``seconds_per_request`` simulated seconds."""
    faults = {"first_token_delay_ms": seconds_per_request * 1000}
    sb.run("POST", "/faults", json={"service": service_id, "faults": faults, "revisions": 1})
    spec = gpu_service(BUCKET, probe=probe)
    spec.template.max_instance_request_concurrency = 2
    return services.create_service(parent=target.location_path, service=spec, service_id=service_id).result(
        timeout=120, polling=clients.operation_polling(target)
    )


def chats_at_once(url: str, count: int) -> list[httpx.Response]:
    body = {"model": SERVED_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    headers = bearer(url)
    with ThreadPoolExecutor(count) as pool:
        calls = [pool.submit(httpx.post, f"{url}/v1/chat/completions", headers=headers, json=body, timeout=120)
                 for _ in range(count)]  # fmt: skip
        return [call.result() for call in calls]


def test_requests_beyond_the_concurrency_get_cloud_runs_429_and_only_in_the_request_log(
    sb, services, sandbox_target, service_id
):
    # Start-up about 5 s (the probe's initial delay): the window is its floor, 10 s; each chat takes 500 s.
    service = deploy_slow(sb, services, sandbox_target, service_id, seconds_per_request=500, probe=health_probe())
    answers = chats_at_once(service.uri, 5)

    assert sorted(a.status_code for a in answers) == [200, 200, 429, 429, 429]
    throttled = [a for a in answers if a.status_code == 429]
    assert {a.text for a in throttled} == {"Rate exceeded."}
    # They pended for the window first: at least its 10 simulated seconds (0.1 real s at the default time scale).
    scale = sb.configure()["time_scale"]
    assert all(a.elapsed.total_seconds() >= 10 * scale for a in throttled)

    # Cloud Logging has them in the revision's request log, as Cloud Run writes them ...
    revision = service.latest_ready_revision.rsplit("/", 1)[1]
    rest = clients.logging_api(sandbox_target)
    query = (f'logName="projects/{sandbox_target.project}/logs/run.googleapis.com%2Frequests"\n'
             f'resource.labels.revision_name="{revision}"\nhttpRequest.status=429')  # fmt: skip
    entries = rest.session.post(
        rest.url("entries:list"), json={"resourceNames": [f"projects/{sandbox_target.project}"], "filter": query}
    ).json()["entries"]
    assert len(entries) == 3
    assert {e["severity"] for e in entries} == {"WARNING"}
    assert {e["httpRequest"]["requestMethod"] for e in entries} == {"POST"}
    assert all(e["textPayload"].startswith("The request was aborted because there was no available instance.")
               for e in entries)  # fmt: skip
    # ... and Monitoring's request_count leaves them out: they never reached the container.
    codes = [e["code"] for e in sb.admin.get("/monitoring/events", params={"service": service_id}).json()]
    assert 429 not in codes and codes.count(200) >= 2


def test_a_request_served_within_the_window_is_not_refused(sb, services, sandbox_target, service_id):
    # A start-up of about 150 s makes the window 3.5 x that; a chat of 100 s frees its slot well within it.
    probe = health_probe(initial=150)
    service = deploy_slow(sb, services, sandbox_target, service_id, seconds_per_request=100, probe=probe)
    assert [a.status_code for a in chats_at_once(service.uri, 2)] == [200, 200]  # at the concurrency: none pends
    assert [a.status_code for a in chats_at_once(service.uri, 3)] == [200, 200, 200]  # the third pended, then ran
