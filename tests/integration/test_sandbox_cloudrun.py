"""Cloud Run stand-in at run time: revisions really start, probes decide, URLs route, traffic only moves on success."""

from __future__ import annotations

import httpx
import pytest
from google.api_core import exceptions
from google.cloud import run_v2

from tasks.common import clients
from tests.support.identity import bearer
from tests.support.services import MODEL_DIR, SERVED_NAME, SMALLEST_L4, gpu_service, health_probe, vllm_args

BUCKET = "cloudrun-test-weights"
REVISION_TYPE = run_v2.TrafficTargetAllocationType.TRAFFIC_TARGET_ALLOCATION_TYPE_REVISION
# The weights bucket is granted with raw calls right before the deploys, which have no product wait for the grant.
pytestmark = pytest.mark.usefixtures("grants_propagated")
# Tests that run two revisions' instances at once (the serving one and the next) size them SMALLEST_L4: they fit a new
# project's 40 GiB together, as two 8 vCPU / 32 GiB instances do not (tests/integration/test_sandbox_capacity.py).


def deploy(services, target, service_id: str, service: run_v2.Service) -> run_v2.Service:
    return services.create_service(parent=target.location_path, service=service, service_id=service_id).result(
        timeout=60, polling=clients.operation_polling(target)
    )


def update(services, target, name: str, service: run_v2.Service) -> run_v2.Service:
    return services.update_service(service=run_v2.Service(service, name=name)).result(
        timeout=60, polling=clients.operation_polling(target)
    )


def served_models(url: str) -> list[str]:
    response = httpx.get(f"{url}/v1/models", headers=bearer(url), timeout=30)
    response.raise_for_status()
    return [m["id"] for m in response.json()["data"]]


def chat(url: str, prompt: str = "Say hello", audience: str | None = None) -> httpx.Response:
    """A chat request with an ID token for ``audience`` (the service URL; ``url`` itself when it is one)."""
    body = {"model": SERVED_NAME, "messages": [{"role": "user", "content": prompt}], "max_tokens": 8}
    return httpx.post(f"{url}/v1/chat/completions", headers=bearer(audience or url), json=body, timeout=30)


def revision_log(sb, revision: str) -> str:
    return sb.admin.get(f"/run/logs/{revision}").text


def short(name: str) -> str:
    return name.rsplit("/", 1)[1]


def test_gpu_service_becomes_ready_and_answers_through_its_url(services, sandbox_target, service_id):
    service = deploy(services, sandbox_target, service_id, gpu_service(BUCKET))
    assert service.uri.startswith("http://127.0.0.1:")
    assert service.latest_ready_revision == service.latest_created_revision
    assert service.terminal_condition.state == run_v2.Condition.State.CONDITION_SUCCEEDED
    assert [(t.revision, t.percent) for t in service.traffic_statuses] == [(short(service.latest_ready_revision), 100)]
    assert served_models(service.uri) == [SERVED_NAME]
    answer = chat(service.uri)
    assert answer.status_code == 200
    assert answer.json()["choices"][0]["message"]["content"]
    assert answer.json()["usage"]["completion_tokens"] > 0
    revision = clients.run_revisions(sandbox_target).get_revision(name=service.latest_ready_revision)
    assert any(
        c.type_ == "Ready" and c.state == run_v2.Condition.State.CONDITION_SUCCEEDED for c in revision.conditions
    )
    assert revision.node_selector.accelerator == "nvidia-l4"


def test_private_service_refuses_calls_without_a_token_until_made_public(services, sandbox_target, service_id):
    service = deploy(services, sandbox_target, service_id, gpu_service(BUCKET))
    assert httpx.get(f"{service.uri}/v1/models", timeout=30).status_code == 403
    policy = services.get_iam_policy(request={"resource": service.name})
    assert list(policy.bindings) == []
    policy.bindings.add(role="roles/run.invoker", members=["allUsers"])
    services.set_iam_policy(request={"resource": service.name, "policy": policy})
    assert httpx.get(f"{service.uri}/v1/models", timeout=30).status_code == 200


def test_a_stale_policy_etag_is_a_conflict(services, sandbox_target, service_id):
    service = deploy(services, sandbox_target, service_id, gpu_service(BUCKET))
    stale = services.get_iam_policy(request={"resource": service.name})
    fresh = services.get_iam_policy(request={"resource": service.name})
    fresh.bindings.add(role="roles/run.invoker", members=["user:alice@example.com"])
    services.set_iam_policy(request={"resource": service.name, "policy": fresh})
    stale.bindings.add(role="roles/run.invoker", members=["user:bob@example.com"])
    with pytest.raises(exceptions.Conflict, match="concurrent policy changes"):
        services.set_iam_policy(request={"resource": service.name, "policy": stale})


def test_tagged_candidate_gets_no_traffic_until_promoted(services, sandbox_target, service_id):
    first = deploy(services, sandbox_target, service_id, gpu_service(BUCKET, **SMALLEST_L4))
    old = short(first.latest_ready_revision)
    candidate = f"{service_id}-candidate-1"
    spec = gpu_service(
        BUCKET,
        **SMALLEST_L4,
        args=vllm_args("--dtype=bfloat16"),
        revision=candidate,
        traffic=[
            run_v2.TrafficTarget(type_=REVISION_TYPE, revision=old, percent=100),
            run_v2.TrafficTarget(type_=REVISION_TYPE, revision=candidate, percent=0, tag="candidate"),
        ],
    )
    second = update(services, sandbox_target, first.name, spec)
    tag_url = next(t.uri for t in second.traffic_statuses if t.tag == "candidate")
    assert tag_url and tag_url != second.uri
    assert chat(tag_url, audience=second.uri).headers["x-sandbox-revision"] == candidate
    assert {chat(second.uri).headers["x-sandbox-revision"] for _ in range(5)} == {old}

    spec.traffic = [run_v2.TrafficTarget(type_=REVISION_TYPE, revision=candidate, percent=100)]
    promoted = update(services, sandbox_target, first.name, spec)
    assert [(t.revision, t.percent) for t in promoted.traffic_statuses] == [(candidate, 100)]
    assert chat(promoted.uri).headers["x-sandbox-revision"] == candidate
    with pytest.raises(httpx.ConnectError):  # the tag is gone, and so is its URL
        httpx.get(f"{tag_url}/health", timeout=5)


def test_unchanged_template_makes_no_new_revision(services, sandbox_target, service_id):
    first = deploy(services, sandbox_target, service_id, gpu_service(BUCKET))
    again = update(services, sandbox_target, first.name, gpu_service(BUCKET))
    assert again.latest_created_revision == first.latest_created_revision
    revisions = clients.run_revisions(sandbox_target).list_revisions(parent=first.name)
    assert len(list(revisions)) == 1


def test_a_probe_that_never_passes_fails_the_deploy_and_keeps_traffic(sb, services, sandbox_target, service_id):
    first = deploy(services, sandbox_target, service_id, gpu_service(BUCKET, **SMALLEST_L4))
    # vLLM's default port: nothing listens on the container port, so /health never answers (lesson 4).
    broken = gpu_service(BUCKET, **SMALLEST_L4, args=[a for a in vllm_args() if not a.startswith("--port")])
    with pytest.raises(exceptions.GoogleAPICallError) as caught:
        update(services, sandbox_target, first.name, broken)
    message = caught.value.message
    assert "is not ready and cannot serve traffic" in message
    assert "failed the configured startup probe checks" in message
    after = services.get_service(name=first.name)
    failed = clients.run_revisions(sandbox_target).get_revision(name=after.latest_created_revision)
    ready = next(c for c in failed.conditions if c.type_ == "Ready")
    assert ready.state == run_v2.Condition.State.CONDITION_FAILED
    assert ready.revision_reason == run_v2.Condition.RevisionReason.HEALTH_CHECK_CONTAINER_ERROR
    assert after.latest_ready_revision == first.latest_ready_revision
    assert [(t.revision, t.percent) for t in after.traffic_statuses] == [(short(first.latest_ready_revision), 100)]
    assert chat(after.uri).status_code == 200


def test_default_tcp_probe_names_the_port_vllm_should_listen_on(services, sandbox_target, service_id):
    # Seed 000's CPU deploy listened on 8000; Cloud Run's default probe waits 240 s for the PORT it announced.
    spec = gpu_service(BUCKET, args=[a for a in vllm_args() if not a.startswith("--port")])
    del spec.template.containers[0].startup_probe
    with pytest.raises(exceptions.GoogleAPICallError, match="listen on the port defined provided by the PORT=8080"):
        deploy(services, sandbox_target, service_id, spec)


def test_without_enforce_eager_a_normal_probe_window_rolls_back(sb, services, sandbox_target, service_id):
    # Lesson 3: compile + CUDA graph capture takes over 5 minutes; a 240 s window (2 s x 120) is not enough.
    spec = gpu_service(BUCKET, args=vllm_args(eager=False))
    with pytest.raises(exceptions.GoogleAPICallError, match="is not ready and cannot serve traffic"):
        deploy(services, sandbox_target, service_id, spec)
    service = services.get_service(name=f"{sandbox_target.location_path}/services/{service_id}")
    assert service.latest_ready_revision == ""
    # The same args pass once the window covers the compile (10 s x 60 = 600 s, within the GPU limit).
    patient = gpu_service(BUCKET, args=vllm_args(eager=False), probe=health_probe(period=10, threshold=60))
    assert update(services, sandbox_target, service.name, patient).latest_ready_revision


def test_seed_004s_probe_idles_four_minutes_then_dies_on_one_miss(sb, services, sandbox_target, service_id):
    # initialDelaySeconds=240, failureThreshold=1 with a slow load: one miss and the revision is gone.
    spec = gpu_service(BUCKET, **SMALLEST_L4, probe=health_probe(period=10, threshold=1, initial=240))
    deploy(services, sandbox_target, service_id, gpu_service(BUCKET, **SMALLEST_L4))
    sb.run("POST", "/faults", json={"service": service_id, "faults": {"load_seconds": 400}})
    with pytest.raises(exceptions.GoogleAPICallError, match="is not ready and cannot serve traffic"):
        update(services, sandbox_target, f"{sandbox_target.location_path}/services/{service_id}", spec)


def test_a_start_slowed_by_a_busy_host_is_not_a_failed_probe(sb, services, sandbox_target, service_id):
    # The host stalls the container for 3 real seconds: 300 simulated seconds at the sandbox's 0.01, more than
    # the probe's 245 s window (5 + 2 x 120) when counted on the wall clock. A starved laptop or CI runner is
    # not a slow revision: the probe runs on the container's own clock, and the revision starts.
    deploy(services, sandbox_target, service_id, gpu_service(BUCKET, **SMALLEST_L4))
    sb.run("POST", "/faults", json={"service": service_id, "faults": {"host_stall_s": 3.0}})
    name = f"{sandbox_target.location_path}/services/{service_id}"
    updated = update(
        services, sandbox_target, name, gpu_service(BUCKET, **SMALLEST_L4, args=vllm_args("--dtype=float16"))
    )
    assert updated.latest_ready_revision == updated.latest_created_revision
    # The same 300 s spent by the container itself (a slow weight load) fails that window, as on Cloud Run. Idle
    # time passes first: a third instance would not fit beside the first two on a new project's 40 GiB.
    sb.run("POST", "/idle")
    sb.run("POST", "/faults", json={"service": service_id, "faults": {"load_seconds": 300}})
    with pytest.raises(exceptions.GoogleAPICallError, match="is not ready and cannot serve traffic"):
        update(services, sandbox_target, name, gpu_service(BUCKET, **SMALLEST_L4, args=vllm_args("--dtype=bfloat16")))


@pytest.mark.parametrize(
    ("image", "args", "log_line"),
    [
        (
            "vllm/vllm-openai:latest",
            vllm_args()[2:],
            "The NVIDIA driver on your system is too old (found version 12020)",
        ),
        (None, vllm_args()[1:], "serve: command not found"),
    ],
    ids=["generic-image-on-l4", "model-garden-without-vllm-prefix"],
)
def test_field_failures_of_seed_000_fail_the_revision_with_their_log(
    sb, services, sandbox_target, service_id, image, args, log_line
):
    kwargs = {"image": image} if image else {}
    with pytest.raises(exceptions.GoogleAPICallError, match="is not ready and cannot serve traffic"):
        deploy(services, sandbox_target, service_id, gpu_service(BUCKET, args=args, **kwargs))
    service = services.get_service(name=f"{sandbox_target.location_path}/services/{service_id}")
    assert log_line in revision_log(sb, short(service.latest_created_revision))


def test_container_crash_reports_its_exit_code(sb, services, sandbox_target, service_id):
    deploy(services, sandbox_target, service_id, gpu_service(BUCKET, **SMALLEST_L4))
    sb.run("POST", "/faults", json={"service": service_id, "faults": {"crash_at_start": "CUDA error: out of memory"}})
    with pytest.raises(exceptions.GoogleAPICallError, match=r"Container called exit\(1\)"):
        update(
            services,
            sandbox_target,
            f"{sandbox_target.location_path}/services/{service_id}",
            gpu_service(BUCKET, **SMALLEST_L4, args=vllm_args("--dtype=float16")),
        )


def test_traffic_split_sends_requests_to_both_revisions(services, sandbox_target, service_id):
    first = deploy(services, sandbox_target, service_id, gpu_service(BUCKET, **SMALLEST_L4))
    old = short(first.latest_ready_revision)
    second = update(
        services, sandbox_target, first.name, gpu_service(BUCKET, **SMALLEST_L4, args=vllm_args("--dtype=float16"))
    )
    new = short(second.latest_ready_revision)
    spec = gpu_service(
        BUCKET,
        **SMALLEST_L4,
        args=vllm_args("--dtype=float16"),
        traffic=[
            run_v2.TrafficTarget(type_=REVISION_TYPE, revision=old, percent=50),
            run_v2.TrafficTarget(type_=REVISION_TYPE, revision=new, percent=50),
        ],
    )
    split = update(services, sandbox_target, first.name, spec)
    seen = {chat(split.uri).headers["x-sandbox-revision"] for _ in range(40)}
    assert seen == {old, new}  # 40 fair coin flips all landing on one side: 2 in 10^12


def test_deleting_a_service_closes_its_url_and_stops_its_instances(sb, services, sandbox_target, service_id):
    service = deploy(services, sandbox_target, service_id, gpu_service(BUCKET))
    services.delete_service(name=service.name).result(polling=clients.operation_polling(sandbox_target))
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{service.uri}/health", timeout=5)
    with pytest.raises(exceptions.NotFound):
        services.get_service(name=service.name)
    assert [i for i in sb.run("GET", "/instances") if f"/services/{service_id}/" in i["revision"]] == []


def test_model_path_must_exist_in_the_bucket(sb, services, sandbox_target, service_id):
    spec = gpu_service(BUCKET, args=vllm_args(model=f"{MODEL_DIR}-missing"))
    with pytest.raises(exceptions.GoogleAPICallError, match="Container called exit"):
        deploy(services, sandbox_target, service_id, spec)
