"""Deploy, verify and promote on the sandbox: a new revision takes traffic only after proving itself."""

from __future__ import annotations

import itertools
import threading
import time

import httpx
import pytest
from google.api_core.exceptions import NotFound
from google.cloud import run_v2
from pydantic import SecretStr

from blocks import GcpTarget, ModelSource, ServingProfile
from tasks.common import clients
from tasks.common.gcp import InfraError
from tasks.common.naming import CANDIDATE_TAG
from tasks.deploy.cloudrun import DeployFailed, PromotionFailed, roll_out, rollback, service_path
from tasks.deploy.probe import VerifyOptions
from tasks.deploy.render import Weights, render_service, revision_name
from tasks.infra import access, ensure
from tasks.weights.staging import StagingResult, stage_model
from tests.support.identity import bearer

_ids = itertools.count()
CHAT = {"model": "rollout/model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
FAST = VerifyOptions(health_period_s=0.05, health_window_s=30)


@pytest.fixture(scope="module")
def env(sandbox, sandbox_target):
    """Infra for one target, and a repo with two commits staged (old and new weights)."""
    target = sandbox_target.model_copy(
        update={"bucket": "rollout-weights", "network": "rollout-vpc", "subnet": "rollout-subnet",
                "service_account_name": "rollout-serving"}
    )  # fmt: skip
    for step in (ensure.ensure_bucket, ensure.ensure_network, ensure.ensure_subnet, ensure.ensure_service_account,
                 access.grant_bucket_object_viewer):  # fmt: skip
        step(target)
    sandbox.hub("POST", "/repos", json={"repo_id": "rollout/model", "weight_bytes": 2_000_000, "replace": True})
    source = ModelSource(repo_id="rollout/model", hub_endpoint=sandbox.hub_url)
    token = SecretStr(sandbox.hub_token)
    old = stage_model(target, source, token)
    sandbox.hub("POST", "/repos/rollout/model/commits", json={"regenerate_weights": 7, "message": "new weights"})
    new = stage_model(target, source, token)
    assert old.commit != new.commit
    return {"target": target, "source": source, "old": old, "new": new}


def weights(target: GcpTarget, staged: StagingResult) -> Weights:
    return Weights(staged.repo_id, staged.commit, target.bucket_name, staged.object_prefix, staged.total_bytes)


def spec(env, staged: StagingResult, service_id: str, profile: ServingProfile | None = None) -> run_v2.Service:
    profile = profile or ServingProfile.preset("l4")
    w = weights(env["target"], staged)
    image = profile.image or ""
    return render_service(profile, env["target"], env["source"], w, image, revision_name(service_id, w, image, profile))


def promote(env, staged, service_id, profile=None):
    return roll_out(env["target"], service_id, spec(env, staged, service_id, profile), "rollout/model", FAST)


def serving(env, service_id) -> list[tuple[str, int, str]]:
    service = clients.run_services(env["target"]).get_service(name=service_path(env["target"], service_id))
    return [(s.revision, s.percent, s.tag) for s in service.traffic_statuses]


def revision_serving(url: str) -> str:
    response = httpx.post(f"{url}/v1/chat/completions", headers=bearer(url), timeout=30, json=CHAT)
    response.raise_for_status()
    return response.headers["x-sandbox-revision"]


@pytest.fixture
def service_id() -> str:
    return f"rollout-{next(_ids)}"


def test_first_deploy_verifies_then_serves_all_traffic(env, service_id):
    result = promote(env, env["old"], service_id)
    assert result.first_deploy and not result.unchanged
    assert result.verification is not None and result.verification.served_models == ["rollout/model"]
    assert result.verification.usage["completion_tokens"] > 0
    assert serving(env, service_id) == [(result.revision, 100, "")]  # the candidate tag is gone
    assert revision_serving(result.service_url) == result.revision


def test_new_weights_are_promoted_and_the_old_revision_kept_for_rollback(env, service_id):
    first = promote(env, env["old"], service_id)
    second = promote(env, env["new"], service_id)
    assert second.revision != first.revision and second.previous_revision == first.revision
    assert serving(env, service_id) == [(second.revision, 100, "")]
    assert second.revision.startswith(f"{service_id}-{env['new'].commit[:7]}-")
    back = rollback(env["target"], service_id)
    assert (back.from_revision, back.to_revision) == (second.revision, first.revision)
    assert revision_serving(first.service_url) == first.revision
    # The revision rolled back from is recorded as such: going forward to it again is a deliberate act.
    with pytest.raises(InfraError, match=r"was rolled back \(recorded on the service\); set force"):
        rollback(env["target"], service_id, to_revision=second.revision)
    again = rollback(env["target"], service_id, to_revision=second.revision, force=True)
    assert serving(env, service_id) == [(again.to_revision, 100, "")]


def test_promoting_the_same_inputs_again_changes_nothing(sb, env, service_id):
    first = promote(env, env["old"], service_id)
    since = sb.last_request_seq()
    second = promote(env, env["old"], service_id)
    assert second.unchanged and second.revision == first.revision
    writes = [r for r in sb.requests("control", since=since) if r["method"] in ("POST", "PATCH", "PUT", "DELETE")]
    assert writes == []


@pytest.mark.parametrize(
    ("faults", "error", "expected"),
    [
        ({"engine_dead_after_requests": 0}, DeployFailed, "failed the configured startup probe checks"),
        ({"crash_at_start": "CUDA error: out of memory"}, DeployFailed, "RuntimeError: CUDA error: out of memory"),
        ({"served_model_name": "someone/else"}, PromotionFailed, "lists ['someone/else'] but not 'rollout/model'"),
        ({"completions_status": 500}, PromotionFailed, "chat completion answered HTTP 500"),
    ],
    ids=["never-healthy", "crash-at-start", "wrong-model-name", "completions-500"],
)
def test_a_failing_candidate_leaves_traffic_where_it_was(sb, env, service_id, faults, error, expected):
    first = promote(env, env["old"], service_id)
    sb.run("POST", "/faults", json={"service": service_id, "faults": faults})
    with pytest.raises(error) as caught:
        promote(env, env["new"], service_id)
    assert expected in str(caught.value)
    assert serving(env, service_id) == [(first.revision, 100, "")]  # no candidate tag left behind either
    assert revision_serving(first.service_url) == first.revision


@pytest.mark.parametrize(
    ("faults", "error", "expected"),
    [
        ({"crash_at_start": "CUDA error: out of memory"}, DeployFailed, "RuntimeError: CUDA error: out of memory"),
        ({"completions_status": 500}, PromotionFailed, "chat completion answered HTTP 500"),
    ],
    ids=["crash-at-start", "completions-500"],
)
def test_a_failing_first_deploy_leaves_no_service_and_the_rerun_starts_clean(sb, env, service_id, faults, error,
                                                                              expected):  # fmt: skip
    sb.run("POST", "/faults", json={"service": service_id, "faults": faults})
    with pytest.raises(error) as caught:
        promote(env, env["old"], service_id)
    assert expected in str(caught.value) and "nothing was serving before; the service was removed" in str(caught.value)
    with pytest.raises(NotFound):  # no unverified revision serves, and no candidate tag is left behind
        serving(env, service_id)
    again = promote(env, env["old"], service_id)
    assert again.first_deploy and again.verification is not None
    assert serving(env, service_id) == [(again.revision, 100, "")]


def test_crash_reports_carry_the_container_log(sb, env, service_id):
    promote(env, env["old"], service_id)
    sb.run("POST", "/faults", json={"service": service_id, "faults": {"crash_at_start": "boom"}})
    with pytest.raises(DeployFailed) as caught:
        promote(env, env["new"], service_id)
    message = str(caught.value)
    assert "container log (last lines):" in message and "Container called exit(1)" in message


def test_a_client_calling_the_service_throughout_a_promotion_sees_no_failure(env, service_id):
    first = promote(env, env["old"], service_id)
    stop = threading.Event()
    seen: list[str] = []
    failures: list[str] = []

    def hammer() -> None:
        with httpx.Client(headers=bearer(first.service_url), timeout=30) as client:
            while not stop.is_set():
                try:
                    response = client.post(f"{first.service_url}/v1/chat/completions", json=CHAT)
                    if response.status_code != 200:
                        failures.append(f"HTTP {response.status_code}")
                    else:
                        seen.append(response.headers["x-sandbox-revision"])
                except httpx.HTTPError as exc:
                    failures.append(repr(exc))

    workers = [threading.Thread(target=hammer) for _ in range(3)]
    for worker in workers:
        worker.start()
    try:
        second = promote(env, env["new"], service_id)
        limit = time.monotonic() + 30  # keep calling until the new revision has served a while too
        while seen.count(second.revision) < 10 and time.monotonic() < limit:
            time.sleep(0.05)
    finally:
        stop.set()
        for worker in workers:
            worker.join()
    assert failures == []
    assert first.revision in seen and second.revision in seen


def test_the_candidate_is_called_with_an_identity_token(sb, env, service_id):
    promote(env, env["old"], service_id)
    since = sb.last_request_seq()
    promote(env, env["new"], service_id)
    candidate_calls = sb.requests(f"run:{service_id}:{CANDIDATE_TAG}", since=since)
    assert candidate_calls and all(r["headers"].get("authorization", "").startswith("Bearer ") for r in candidate_calls)
    assert {r["path"] for r in candidate_calls} >= {"/health", "/v1/models", "/v1/chat/completions"}


def test_load_test_figures_and_the_slo_gate(env, service_id):
    first = promote(env, env["old"], service_id)
    measured = roll_out(
        env["target"], service_id, spec(env, env["new"], service_id), "rollout/model",
        FAST.model_copy(update={"load_requests": 8, "load_concurrency": 4}),
    )  # fmt: skip
    figures = measured.verification
    assert figures is not None and figures.requests == 8
    assert 0 < figures.p50_ms <= figures.p95_ms and figures.tokens_per_s > 0
    rollback(env["target"], service_id, to_revision=first.revision)
    strict = FAST.model_copy(update={"load_requests": 4, "slo_min_tokens_per_s": 10**9})
    other = spec(env, env["new"], service_id, ServingProfile.preset("l4", max_instances=2))
    with pytest.raises(PromotionFailed, match=r"throughput .* tokens/s is below the SLO"):
        roll_out(env["target"], service_id, other, "rollout/model", strict)
    assert serving(env, service_id) == [(first.revision, 100, "")]


def test_weights_streamed_from_gs_with_the_runai_streamer(env, service_id):
    result = promote(env, env["old"], service_id, ServingProfile.preset("l4", load_mode="runai-streamer"))
    assert result.verification is not None and result.verification.served_models == ["rollout/model"]
    revision = clients.run_revisions(env["target"]).get_revision(
        name=f"{service_path(env['target'], service_id)}/revisions/{result.revision}"
    )
    assert list(revision.volumes) == [] and list(revision.containers[0].args)[2].startswith("gs://rollout-weights/")
