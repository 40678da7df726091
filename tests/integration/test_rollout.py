"""Deploy, verify and promote on the sandbox, through promote-model's own steps (flows/promote._promote with the
zero-downtime rollout, no canary and no watch): a new revision takes traffic only after proving itself.

Failing candidates of a service that already serves, through the whole flow: tests/reliability/test_faults_traffic.py;
load modes through the whole flow: tests/e2e/test_image_strategies.py.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from typing import NamedTuple

import httpx
import pytest
from google.api_core.exceptions import NotFound
from google.cloud import run_v2
from pydantic import SecretStr

from blocks import GcpTarget, ModelSource, ServingProfile
from tasks.common import clients
from tasks.common.gcp import InfraError
from tasks.common.naming import CANDIDATE_TAG
from tasks.deploy.cloudrun import (
    Candidate,
    DeployFailed,
    abandon_candidate,
    check_candidate_verdict,
    deploy_when_startable,
    promote_candidate,
    rollback,
    service_path,
    verify_candidate,
)
from tasks.deploy.probe import Verification, VerificationFailed, VerifyOptions
from tasks.deploy.render import Weights, render_service, revision_name
from tasks.infra import access, ensure, teardown
from tasks.weights.staging import StagingResult, stage_model
from tests.support.identity import bearer

_ids = itertools.count()
# Zero-downtime mechanics: each candidate's L4 instance (8 vCPU, 32 GiB) runs beside the serving one, which a new
# project's 40 GiB cannot hold (preflight refuses it there: tests/e2e/test_new_project.py).
pytestmark = pytest.mark.usefixtures("raised_quota")
MODEL = "rollout/model"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
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
    sandbox.hub("POST", "/repos", json={"repo_id": MODEL, "weight_bytes": 2_000_000, "replace": True})
    source = ModelSource(repo_id=MODEL, hub_endpoint=sandbox.hub_url)
    token = SecretStr(sandbox.hub_token)
    old = stage_model(target, source, token)
    sandbox.hub("POST", f"/repos/{MODEL}/commits", json={"regenerate_weights": 7, "message": "new weights"})
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


class Promoted(NamedTuple):
    candidate: Candidate
    verification: Verification | None  # None: the candidate already served all traffic (nothing verified)


def deploy(env, staged: StagingResult, service_id: str, profile: ServingProfile | None = None) -> Candidate:
    """promote-model's "deploy candidate" step: the verdicts checked, then the revision deployed at 0 % under its
    `candidate` tag (the functions of run_check_candidate_verdict and run_deploy_candidate)."""
    wanted = spec(env, staged, service_id, profile)
    check_candidate_verdict(env["target"], service_id, wanted.template.revision, False)
    return deploy_when_startable(env["target"], service_id, wanted)


def verify_then_promote(env, service_id: str, candidate: Candidate, options: VerifyOptions = FAST) -> Promoted:
    """promote-model's "verify" step, and delivery's "promote" without canary or watch: the candidate verified at its
    tag URL, then given all traffic; one that fails verification is abandoned (traffic as before, or no service on a
    first deploy) and the failure raised, as the flow does."""
    if candidate.unchanged:
        return Promoted(candidate, None)
    try:
        verification = verify_candidate(env["target"], candidate, MODEL, options)
    except Exception:
        abandon_candidate(env["target"], service_id, candidate)
        raise
    promote_candidate(env["target"], service_id, candidate)
    return Promoted(candidate, verification)


def promote(env, staged, service_id, profile=None, options: VerifyOptions = FAST) -> Promoted:
    return verify_then_promote(env, service_id, deploy(env, staged, service_id, profile), options)


def serving(env, service_id) -> list[tuple[str, int, str]]:
    service = clients.run_services(env["target"]).get_service(name=service_path(env["target"], service_id))
    return [(s.revision, s.percent, s.tag) for s in service.traffic_statuses]


def revision_serving(url: str, audience: str | None = None) -> str:
    """The revision that answers a chat at ``url``; ``audience``: the service URL, when ``url`` is a tag URL."""
    response = httpx.post(f"{url}/v1/chat/completions", headers=bearer(audience or url), timeout=30, json=CHAT)
    response.raise_for_status()
    return response.headers["x-sandbox-revision"]


@pytest.fixture
def service_id(env) -> Iterator[str]:
    """A fresh service id; the service is deleted after the test (its instances stop)."""
    name = f"rollout-{next(_ids)}"
    yield name
    teardown.delete_service(env["target"], name)


def test_first_deploy_verifies_then_serves_all_traffic(env, service_id):
    result = promote(env, env["old"], service_id)
    candidate = result.candidate
    assert candidate.first_deploy and not candidate.unchanged
    assert result.verification is not None and result.verification.served_models == [MODEL]
    assert result.verification.usage["completion_tokens"] > 0
    assert serving(env, service_id) == [(candidate.revision, 100, "")]  # the candidate tag is gone
    assert revision_serving(candidate.service_url) == candidate.revision


def test_new_weights_wait_at_no_traffic_then_are_promoted_and_the_old_revision_kept_for_rollback(env, service_id):
    first = promote(env, env["old"], service_id).candidate
    candidate = deploy(env, env["new"], service_id)
    # Deployed, not yet verified: reachable only at its tag URL, with no traffic; the service answers as before.
    assert candidate.revision != first.revision and candidate.previous_revision == first.revision
    assert serving(env, service_id) == [(first.revision, 100, ""), (candidate.revision, 0, CANDIDATE_TAG)]
    assert revision_serving(first.service_url) == first.revision
    assert revision_serving(candidate.url, candidate.service_url) == candidate.revision
    second = verify_then_promote(env, service_id, candidate).candidate
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
    first = promote(env, env["old"], service_id).candidate
    since = sb.last_request_seq()
    second = promote(env, env["old"], service_id)
    assert second.candidate.unchanged and second.candidate.revision == first.revision and second.verification is None
    writes = [r for r in sb.requests("control", since=since) if r["method"] in ("POST", "PATCH", "PUT", "DELETE")]
    assert writes == []


@pytest.mark.parametrize(
    ("faults", "error", "expected"),
    [
        (
            {"crash_at_start": "CUDA error: out of memory"},
            DeployFailed,
            ["RuntimeError: CUDA error: out of memory", "nothing was serving before; the service was removed"],
        ),
        ({"completions_status": 500}, VerificationFailed, ["chat completion answered HTTP 500"]),
    ],
    ids=["crash-at-start", "completions-500"],
)
def test_a_failing_first_deploy_leaves_no_service_and_the_rerun_starts_clean(sb, env, service_id, faults, error,
                                                                              expected):  # fmt: skip
    sb.run("POST", "/faults", json={"service": service_id, "faults": faults})
    with pytest.raises(error) as caught:
        promote(env, env["old"], service_id)
    assert all(text in str(caught.value) for text in expected), str(caught.value)
    with pytest.raises(NotFound):  # no unverified revision serves, and no candidate tag is left behind
        serving(env, service_id)
    again = promote(env, env["old"], service_id)
    assert again.candidate.first_deploy and again.verification is not None
    assert serving(env, service_id) == [(again.candidate.revision, 100, "")]


def test_crash_reports_carry_the_container_log(sb, env, service_id):
    promote(env, env["old"], service_id)
    sb.run("POST", "/faults", json={"service": service_id, "faults": {"crash_at_start": "boom"}})
    with pytest.raises(DeployFailed) as caught:
        promote(env, env["new"], service_id)
    message = str(caught.value)
    assert "container log (last lines):" in message and "Container called exit(1)" in message


def test_a_client_calling_the_service_throughout_a_promotion_sees_no_failure(env, service_id):
    first = promote(env, env["old"], service_id).candidate
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
        second = promote(env, env["new"], service_id).candidate
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
    first = promote(env, env["old"], service_id).candidate
    loaded = FAST.model_copy(update={"load_requests": 8, "load_concurrency": 4})
    figures = promote(env, env["new"], service_id, options=loaded).verification
    assert figures is not None and figures.requests == 8
    assert 0 < figures.p50_ms <= figures.p95_ms and figures.tokens_per_s > 0
    rollback(env["target"], service_id, to_revision=first.revision)
    strict = FAST.model_copy(update={"load_requests": 4, "slo_min_tokens_per_s": 10**9})
    other = ServingProfile.preset("l4", max_instances=2)  # another revision: the one rolled back from is refused
    with pytest.raises(VerificationFailed, match=r"throughput .* tokens/s is below the SLO"):
        promote(env, env["new"], service_id, other, strict)
    assert serving(env, service_id) == [(first.revision, 100, "")]
