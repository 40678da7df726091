"""Fault injection (issue 8), the control plane: Cloud Build INTERNAL_ERROR, Cloud Run operation errors, and a
429 and a 503 from every API a promotion calls.

The outcomes each test asserts, and the helpers: tests/support/faults.py.
"""

from __future__ import annotations

import pytest

from blocks import ServingProfile
from tasks.common import clients
from tasks.infra import ensure
from tests.support.artifacts import report_artifact
from tests.support.faults import (
    TINY,
    answering_revision,
    assert_staged_once_and_verified,
    completed,
    completed_uploads,
    new_repo,
    promote,
    traffic,
    unique,
)

pytestmark = pytest.mark.prefect


@pytest.fixture
def build_profile(tmp_path):
    """Save a ServingProfile block (l4) that builds its image with Cloud Build from a fresh local folder."""

    def make() -> str:
        name = unique("flt-build")
        src = tmp_path / name
        src.mkdir()
        (src / "Dockerfile").write_text("FROM python:3.12-slim\nCOPY . /app\n")
        (src / "app.py").write_text(f"print({name!r})\n")  # a new tree, so a new content tag and a real build
        build = {"source_dir": str(src), "image_name": name}
        ServingProfile.preset("l4", image=None, build=build).save(name, overwrite=True)
        return name

    return make


# 5. Cloud Build ------------------------------------------------------------------------------------------------
def test_cloud_build_internal_error_twice_then_success(sb, flow_env, build_profile):
    profile, service = build_profile(), unique("flt-build")
    sb.admin.post("/cloudbuild/outcomes", json={"outcomes": ["INTERNAL_ERROR", "INTERNAL_ERROR"]}).raise_for_status()
    try:
        report = completed(promote(TINY, service, profile=profile))
    finally:
        sb.admin.delete("/cloudbuild/outcomes").raise_for_status()
    assert report.image is not None and not report.image.reused
    assert [(a.max_jobs, a.status) for a in report.image.attempts] == [
        (32, "INTERNAL_ERROR"),
        (16, "INTERNAL_ERROR"),
        (8, "SUCCESS"),
    ]
    revision = clients.run_revisions(flow_env).get_revision(
        name=f"{flow_env.location_path}/services/{service}/revisions/{report.serving_revision}"
    )
    assert revision.containers[0].image == report.image.image  # the built image, by digest, runs `vllm serve`
    assert traffic(flow_env, service) == [(report.serving_revision, 100, "")]
    assert answering_revision(report.service_url) == report.serving_revision


# 6. Cloud Run operation errors ---------------------------------------------------------------------------------
@pytest.mark.usefixtures("raised_quota")  # re-promotes an L4 service zero-downtime; a new project's 40 GiB cannot
def test_a_crashing_revision_fails_cleanly_and_a_503_on_the_update_is_retried(sb, flow_env):
    service = unique("flt-run")
    first = completed(promote(TINY, service))
    # A revision that crashes at start: the flow fails, traffic stays, the report says where it stands.
    sb.run("POST", "/faults", json={"service": service, "faults": {"crash_at_start": "CUDA error: out of memory"}})
    failed = promote(TINY, service, revision="dev")
    assert failed.is_failed() and "DeployFailed" in failed.message and "did not become ready" in failed.message
    assert traffic(flow_env, service) == [(first.serving_revision, 100, "")]  # no candidate tag left either
    assert answering_revision(first.service_url) == first.serving_revision
    text = report_artifact(service)
    assert "NOT promoted" in text and "did not become ready" in text and f"{first.serving_revision} 100 %" in text
    # A 503 on the service update: retried, and the promotion completes.
    sb.add_fault("control", method="PATCH", path=rf"/services/{service}$", status=503, times=1)
    since = sb.last_request_seq()
    second = completed(promote(TINY, service, revision="dev"))
    patches = [r["status"] for r in sb.requests("control", since=since) if r["method"] == "PATCH"]
    assert patches[0] == 503 and patches[1:] and set(patches[1:]) == {200}
    assert (second.outcome, second.previous_revision) == ("promoted", first.serving_revision)
    assert traffic(flow_env, service) == [(second.serving_revision, 100, "")]


# 7. 429 and 503 from every API the promotion calls -------------------------------------------------------------
# (server, method, path regex). Secret Manager is absent: promote-model never calls it (the Hub token stays in a
# Prefect Secret block and the serving revision needs none).
SURVIVED = [
    ("control", None, r"^/compute/v1/"),  # network, subnet
    ("control", None, r"^/v1/projects/[^/]+/serviceAccounts"),  # IAM service account
    ("control", None, r"/repositories"),  # Artifact Registry repository and the built image's tag
    ("control", "GET", r"/builds/"),  # Cloud Build: reading the finished build back
    ("control", "GET", r"^/v2/.*/services/[^/:]+$"),  # Cloud Run: service read
    ("control", "PATCH", r"^/v2/.*/services/[^/:]+$"),  # Cloud Run: new revision, then traffic
    ("control", None, r":getIamPolicy$"),  # Cloud Run: invokers
    ("gcs", None, r"^/storage/v1/b/[^/]+$"),  # bucket
    ("gcs", None, r"^/storage/v1/b/[^/]+/iam$"),  # bucket IAM
    ("gcs", None, r"^/download/"),  # manifest read
    ("gcs", None, r"^/storage/v1/b/[^/]+/o$"),  # object listing
    ("gcs", None, r"^/storage/v1/b/[^/]+/o/.+"),  # object metadata (the build source archive)
    ("gcs", None, r"^/upload/"),  # weights, manifest, build source
]


# raised_quota: re-promotes an L4 service zero-downtime, which a new project's 40 GiB cannot hold; grants_propagated:
# it counts build attempts, and a push denied while the run's repository grant propagates is one more
# (tests/integration/test_build_identity.py covers that wait).
@pytest.mark.usefixtures("raised_quota", "grants_propagated")
def test_one_429_then_one_503_from_every_api_the_promotion_calls(sb, flow_env, build_profile):
    repo, service = new_repo(sb), unique("flt-apis")
    completed(promote(repo, service))  # the service exists: the next promotion updates it
    profile = build_profile()
    sb.hub("POST", f"/repos/{repo}/commits", json={"regenerate_weights": 7})  # new weights to stage
    for server, method, path in SURVIVED:
        for status in (429, 503):
            sb.add_fault(server, method=method, path=path, status=status, times=1)
    since = sb.last_request_seq()
    report = completed(promote(repo, service, profile=profile))
    unfired = [(r["server"], r["method"], r["path"], r["status"]) for r in sb.faults() if r["fired"] != 1]
    assert unfired == []
    assert report.outcome == "promoted" and [a.status for a in report.image.attempts] == ["SUCCESS"]
    assert_staged_once_and_verified(sb, flow_env, report, since)
    assert completed_uploads(sb, since, flow_env.build_bucket_name) == 1  # the build source archive, once
    assert traffic(flow_env, service) == [(report.serving_revision, 100, "")]


# Calls made once per promotion, each behind its own retry: the build's creation and its operation, the Cloud Run
# operation and the revision lookup.
RETRIED_SINGLY = [
    pytest.param(("control", "POST", r"/builds$", 429), id="cloudbuild-create"),
    # A 503 may have created the build: it is looked up by its attempt tag before anything is submitted again.
    pytest.param(("control", "POST", r"/builds$", 503), id="cloudbuild-create-503"),
    pytest.param(("control", "GET", r"^/v1/projects/[^/]+/locations/[^/]+/operations/", 429), id="build-operation"),
    pytest.param(("control", "GET", r"^/v2/projects/[^/]+/locations/[^/]+/operations/", 429), id="run-operation"),
    pytest.param(("control", "GET", r"^/v2/.*/services/[^/]+/revisions/", 503), id="run-get-revision"),
    pytest.param(("control", "GET", r"^/v1/projects/[^/]+/locations/[^/]+/operations/", 503), id="build-operation-503"),
    pytest.param(("control", "GET", r"^/v2/projects/[^/]+/locations/[^/]+/operations/", 503), id="run-operation-503"),
    pytest.param(("control", "GET", r"^/v2/.*/services/[^/]+/revisions/", 429), id="run-get-revision-429"),
    # A new service name: the first deploy creates the service.
    pytest.param(("control", "POST", r"^/v2/projects/[^/]+/locations/[^/]+/services$", 429), id="run-create-429"),
    pytest.param(("control", "POST", r"^/v2/projects/[^/]+/locations/[^/]+/services$", 503), id="run-create-503"),
]


@pytest.mark.parametrize("fault", RETRIED_SINGLY)
@pytest.mark.usefixtures("raised_quota")  # the revision-lookup cases re-promote an L4 service zero-downtime
def test_a_transient_error_on_a_build_operation_or_revision_call_is_retried(sb, flow_env, build_profile, fault):
    server, method, path, status = fault
    service = unique("flt-retry")
    if "/revisions/" in path:
        completed(promote(TINY, service))  # an existing service, so the update path (revision lookup) runs
    profile = build_profile() if "builds" in path or "/v1/" in path else None
    ensure.ensure_artifact_registry(flow_env)  # the registry exists: the v1 operation polled is the build's
    sb.add_fault(server, method=method, path=path, status=status, times=1)
    state = promote(TINY, service, revision="dev", **({"profile": profile} if profile else {}))
    assert [r["fired"] for r in sb.faults()] == [1]
    assert state.is_completed(), f"one transient {status} failed the promotion: {state.message}"


# Bursts of 503 from the Hub: the revision lookup, shard resolves (run in parallel), or both in one promotion.
HUB_503_BURSTS = [
    pytest.param([(r"^/api/models/", 1)], id="revision-lookup"),
    pytest.param([(r"/resolve/.*\.safetensors$", 2)], id="two-shard-resolves"),
    pytest.param([(r"^/api/models/", 1), (r"/resolve/.*\.safetensors$", 2)], id="lookup-and-two-shards"),
]


@pytest.mark.parametrize("bursts", HUB_503_BURSTS)
def test_a_burst_of_503_from_the_hub_is_retried(sb, flow_env, bursts):
    repo, service = new_repo(sb, 3_000_000, shards=3), unique("flt-hub503")
    for path, times in bursts:
        sb.add_fault("hub", path=path, status=503, times=times)
    since = sb.last_request_seq()
    state = promote(repo, service)
    assert [r["fired"] for r in sb.faults()] == [times for _, times in bursts]
    report = completed(state)
    assert report.outcome == "promoted"
    assert sum(1 for r in sb.requests("hub", since=since) if r["status"] == 503) == sum(t for _, t in bursts)
    assert_staged_once_and_verified(sb, flow_env, report, since)
    assert traffic(flow_env, service) == [(report.serving_revision, 100, "")]
