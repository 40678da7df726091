"""The flows as users run them, in-process under a Prefect harness, against the sandbox."""

from __future__ import annotations

import asyncio
import itertools
import re
import threading
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest
from google.api_core import exceptions as gexc
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
from prefect.client.schemas.sorting import TaskRunSort
from prefect.events.worker import EventsWorker

from blocks import GcpTarget, ServingProfile
from flows.rollback import rollback_model
from flows.scale import scale_service
from flows.teardown import teardown
from tasks.common import clients
from tasks.deploy.probe import VerifyOptions
from tasks.infra import ensure
from tests.support.artifacts import artifact
from tests.support.locks import lock_slots, wait_until
from tests.support.promotion import promote, run_service

pytestmark = pytest.mark.prefect
_ids = itertools.count()
WRITES = {"POST", "PUT", "PATCH", "DELETE"}


@pytest.fixture
def service() -> str:
    return f"e2e-{next(_ids)}"


def test_promotion_writes_a_report_with_the_figures_and_an_event(flow_env, service, asserting_events_worker):
    report = promote(service)
    assert report.outcome == "promoted"
    text = artifact(f"promotion-{service}")
    for expected in ("promoted", report.commit, "uploaded", "pytorch-vllm-serve", "healthy after", "/month",
                     "| stage |", "| verify |", report.serving_revision):  # fmt: skip
        assert expected in text
    assert artifact(f"service-{service}")  # the link artifact
    asserting_events_worker.drain()
    events = [e for e in asserting_events_worker._client.events if e.event.startswith("model.")]
    assert [(e.event, e.resource.name) for e in events] == [("model.promoted", service)]
    assert events[0].payload["revision"] == report.serving_revision


@pytest.mark.usefixtures("raised_quota")  # the candidate beside the serving revision (zero-downtime), for its report
def test_a_failed_promotion_reports_why_and_where_traffic_stands(sb, flow_env, service, asserting_events_worker):
    first = promote(service)
    sb.run("POST", "/faults", json={"service": service, "faults": {"completions_status": 500}})
    with pytest.raises(Exception, match="chat completion answered HTTP 500"):
        promote(service, revision="dev")
    text = artifact(f"promotion-{service}")
    assert "NOT promoted" in text and "HTTP 500" in text
    assert f"{first.serving_revision} 100 %" in text
    asserting_events_worker.drain()
    names = [e.event for e in asserting_events_worker._client.events if e.event.startswith("model.")]
    assert names[-1] == "model.promotion_failed"


def test_dry_run_renders_the_plan_and_writes_nothing(sb, flow_env, service):
    since = sb.last_request_seq()
    report = promote(service, dry_run=True, profile="cpu")
    assert report.outcome == "dry-run"
    writes = [f"{r['server']} {r['method']} {r['path']}" for r in sb.requests(since=since)
              if r["method"] in WRITES and r["server"] in ("control", "gcs")]  # fmt: skip
    assert writes == []
    plan = artifact(f"plan-{service}")
    assert "gcloud run deploy" in plan and "serving.knative.dev/v1" in plan
    assert "DOCKER_BUILDKIT=1" in plan and "docker/Dockerfile.cpu" in plan  # the cpu profile builds its image


def test_a_scale_up_run_after_the_days_warm_hours_starts_nothing(flow_env, service):
    """A schedule's scale-up that runs once its day's warm hours are over (its worker was down) changes nothing."""
    promote(service)
    # A zone where it is now between 02:00 and 22:00, so that 01:00 today has passed and tomorrow has not begun.
    zone = next(z for z in ("UTC", "Asia/Tokyo", "America/Los_Angeles") if 2 <= datetime.now(ZoneInfo(z)).hour < 22)
    assert scale_service(service=service, min_instances=1, warm_until="01:00", timezone=zone) is None
    assert run_service(flow_env, service).scaling.min_instance_count == 0
    assert scale_service(service=service, min_instances=1, warm_until="23:59", timezone=zone).changed


def test_scale_sets_min_instances_and_is_a_no_op_when_already_there(flow_env, service, asserting_events_worker):
    promote(service)
    revision = run_service(flow_env, service).latest_ready_revision
    assert scale_service(service=service, min_instances=1).changed
    scaled = run_service(flow_env, service)
    assert scaled.scaling.min_instance_count == 1
    assert scaled.latest_ready_revision == revision  # no new revision, traffic untouched
    assert not scale_service(service=service, min_instances=1).changed
    assert scale_service(service=service, min_instances=0).changed
    kept = [b.name for b in clients.storage(flow_env).list_blobs(flow_env.bucket_name, prefix=f"reports/{service}/")]
    assert len([name for name in kept if "-scale-" in name and name.endswith(".md")]) == 3  # each run's, in the bucket
    asserting_events_worker.drain()
    scaled_events = [e for e in asserting_events_worker._client.events if e.event == "service.scaled"]
    assert [e.payload["min_instances"] for e in scaled_events] == [1, 0]


@pytest.mark.usefixtures("raised_quota")  # a zero-downtime re-promotion: the candidate beside the serving revision
def test_rollback_and_teardown(flow_env, service):
    first = promote(service)
    second = promote(service, revision="dev")
    assert second.serving_revision != first.serving_revision
    back = rollback_model(service=service)
    assert (back.from_revision, back.to_revision) == (second.serving_revision, first.serving_revision)
    results = teardown(service=service)
    assert [(r.kind, r.action) for r in results] == [("service", "deleted")]
    assert [(r.kind, r.action) for r in teardown(service=service)] == [("service", "absent")]


@pytest.mark.usefixtures("raised_quota")  # the second run's candidate beside the first's revision (zero-downtime)
def test_two_promotions_of_one_service_never_interleave(flow_env, service):
    outcomes: dict[str, object] = {}

    def run(name: str, revision: str) -> None:
        outcomes[name] = promote(service, revision=revision)

    threads = [threading.Thread(target=run, args=(n, r)) for n, r in (("a", "main"), ("b", "dev"))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # Both completed, and the one that got the lock second found the first one's revision serving: had they
    # interleaved, each would have seen the old traffic and one promotion would have been lost.
    assert {r.outcome for r in outcomes.values()} == {"promoted"}
    previous = {r.previous_revision for r in outcomes.values()}
    serving = {r.serving_revision for r in outcomes.values()}
    assert len(previous & serving) == 1


def test_a_second_promotion_reuses_the_built_image_and_changes_nothing(sb, flow_env, service, tmp_path):
    (tmp_path / "Dockerfile").write_text("FROM python:3.12-slim\nCOPY . /app\n")
    (tmp_path / "app.py").write_text(f"print({service!r})\n")  # a new tree: the first promotion really builds
    profile = f"{service}-build"
    ServingProfile.preset("l4", image=None, build={"source_dir": str(tmp_path), "image_name": service}).save(profile)

    def builds_created_since(since: int) -> list[str]:
        # Created: a create refused while the new build account's grants propagate (the product waits) made none.
        return [r["path"] for r in sb.requests("control", since=since)
                if r["method"] == "POST" and r["path"].endswith("/builds") and r["status"] == 200]  # fmt: skip

    since = sb.last_request_seq()
    first = promote(service, profile=profile)
    assert first.image is not None and not first.image.reused and len(builds_created_since(since)) == 1
    since = sb.last_request_seq()
    second = promote(service, profile=profile)
    assert builds_created_since(since) == []
    assert second.image is not None and second.image.reused and second.image.image == first.image.image
    assert second.outcome == "unchanged" and second.serving_revision == first.serving_revision


@pytest.mark.usefixtures("raised_quota")  # re-promotions with the candidate beside the serving revision
def test_the_image_strategy_is_a_run_parameter(sb, flow_env, service, tmp_path):
    (tmp_path / "Dockerfile").write_text("FROM python:3.12-slim\nCOPY . /app\n")
    (tmp_path / "app.py").write_text(f"print({service!r})\n")
    build = {"source_dir": str(tmp_path), "image_name": service}
    built = promote(service, build=build)  # the l4 preset pins an image; this run builds one instead
    assert built.outcome == "promoted" and [a.status for a in built.image.attempts] == ["SUCCESS"]
    revision = clients.run_revisions(flow_env).get_revision(
        name=f"{flow_env.location_path}/services/{service}/revisions/{built.serving_revision}"
    )
    assert revision.containers[0].image == built.image.image and f"/{service}@sha256:" in built.image.image
    pinned = promote(service, image=ServingProfile.preset("l4").image)  # and back to the pinned image
    assert pinned.outcome == "promoted" and pinned.image.attempts == []
    since = sb.last_request_seq()
    with pytest.raises(ValueError, match="image and build: give one image strategy"):
        promote(service, image=ServingProfile.preset("l4").image, build=build)
    assert [r for r in sb.requests("control", since=since) if r["method"] in WRITES] == []


def test_a_runtime_token_reaches_the_service_only_through_secret_manager(sb, flow_env, service):
    ServingProfile.preset("l4", hf_token_at_runtime=True).save("e2e-runtime-token", overwrite=True)
    report = promote(service, profile="e2e-runtime-token")
    assert report.outcome == "promoted"  # the revision started: Cloud Run read the secret as the service account
    revision = clients.run_revisions(flow_env).get_revision(
        name=f"{flow_env.location_path}/services/{service}/revisions/{report.serving_revision}"
    )
    env = {var.name: var for var in revision.containers[0].env}
    assert env["HF_TOKEN"].value == ""  # a reference, never the value
    assert env["HF_TOKEN"].value_source.secret_key_ref.secret == flow_env.hf_token_secret
    secret = ensure.secret_path(flow_env)
    manager = clients.secret_manager(flow_env)
    assert manager.access_secret_version(name=f"{secret}/versions/latest").payload.data.decode() == sb.hub_token
    bindings = [(b.role, list(b.members)) for b in manager.get_iam_policy(request={"resource": secret}).bindings]
    assert bindings == [("roles/secretmanager.secretAccessor", [f"serviceAccount:{flow_env.service_account_email}"])]
    since = sb.last_request_seq()
    again = promote(service, profile="e2e-runtime-token")
    assert again.outcome == "unchanged"
    writes = [
        f"{r['method']} {r['path']}"
        for r in sb.requests("control", since=since)
        if r["method"] in WRITES and not r["path"].endswith(":testIamPermissions")  # a POST that only reads
    ]
    assert writes == []  # no new secret version, no policy edit, no revision


def _task_run_names(flow_run_id, last: str) -> list[str]:
    """The flow run's task runs in the order they started, without the ``-abc`` Prefect may add to default names,
    once the run's ``last`` task run has reached the API (task runs are recorded from events, asynchronously)."""

    async def read() -> list[str]:
        async with get_client() as client:
            runs = await client.read_task_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])),
                sort=TaskRunSort.EXPECTED_START_TIME_ASC,
            )
        return [re.sub(r"-[0-9a-f]{3}$", "", run.name) for run in runs]

    EventsWorker.drain_all()
    names: list[str] = []

    def recorded() -> bool:
        names[:] = asyncio.run(read())
        return last in names

    wait_until(recorded, 30, f"task run {last} of flow run {flow_run_id}")
    return names


def _between(names: list[str], first: str, last: str) -> list[str]:
    return names[names.index(first) + 1 : names.index(last)]


def test_the_run_graph_shows_one_task_run_per_infrastructure_resource(sb, flow_env, service, tmp_path):
    (tmp_path / "Dockerfile").write_text("FROM python:3.12-slim\nCOPY . /app\n")
    (tmp_path / "app.py").write_text(f"print({service!r})\n")
    profile = f"{service}-infra"
    build = {"source_dir": str(tmp_path), "image_name": service}
    ServingProfile.preset("l4", image=None, build=build, hf_token_at_runtime=True).save(profile)
    state = promote(service, profile=profile, return_state=True)
    assert state.result().outcome == "promoted"
    names = _task_run_names(state.state_details.flow_run_id, "gcs_archive_report")
    infrastructure = _between(names, "hf_resolve_model", "stage sandbox/tiny-chat@main")
    assert infrastructure == [
        "gcs_ensure_bucket",
        "artifactregistry_ensure_repository",
        "gcs_ensure_build_bucket",
        "compute_ensure_network",
        "compute_ensure_subnet",
        "iam_ensure_service_account",
        f"iam_check_act_as {flow_env.service_account_email}",
        "gcs_grant_object_viewer",
        "iam_ensure_build_service_account",
        "gcs_grant_build_bucket_admin",
        "artifactregistry_grant_build_writer",
        "gcs_revoke_build_model_bucket_roles",
        f"iam_check_act_as {flow_env.build_service_account_email}",
        "secretmanager_ensure_hf_token",
        "secretmanager_grant_accessor",
    ]
    since = sb.last_request_seq()
    again = promote(service, profile=profile, return_state=True)
    assert again.result().outcome == "unchanged"
    writes = [
        f"{r['method']} {r['path']}"
        for r in sb.requests("control", since=since)
        if r["method"] in WRITES and not r["path"].endswith(":testIamPermissions")  # a POST that only reads
    ]
    assert writes == []  # every resource found as it is: no create, no policy edit, no secret version, no build
    # After the promotion, the service's invokers, then the report archived in the bucket: task runs too.
    assert names[-2:] == ["run_ensure_invokers", "gcs_archive_report"]
    again_names = _task_run_names(again.state_details.flow_run_id, "gcs_archive_report")
    assert _between(again_names, "hf_resolve_model", "stage sandbox/tiny-chat@main") == infrastructure


@pytest.mark.usefixtures("raised_quota")  # two L4 services at once (64 GiB of a new project's 40)
def test_promotions_of_two_services_run_side_by_side(sb, flow_env):
    held, other = f"e2e-{next(_ids)}", f"e2e-{next(_ids)}"
    # The held service's candidate answers /health with 503 until the rule goes: its promotion waits inside
    # verify, holding its service's lock, for exactly as long as the test keeps the rule (no sleep decides).
    candidate = f"run:{held}:candidate"
    sb.add_fault(candidate, method="GET", path="^/health$", action="status", status=503)
    outcome: dict[str, object] = {}

    def run_held() -> None:
        try:
            # A window far longer than the other promotion takes, short enough that a lock shared across services
            # (the other promotion waiting for this one) fails the test in about a minute, not at pytest's timeout.
            outcome["report"] = promote(held, verify=VerifyOptions(health_period_s=0.05, health_window_s=90))
        except BaseException as exc:
            outcome["error"] = exc

    runner = threading.Thread(target=run_held)
    runner.start()
    try:
        wait_until(lambda: lock_slots(flow_env, held) == 1 and any(r["fault"] for r in sb.requests(candidate)),
                   120, f"{held} to hold its lock and probe its candidate")  # fmt: skip
        since = sb.last_request_seq()
        report = promote(other)  # another service: its lock is another lock, so nothing waits for `held`
        assert report.outcome == "promoted", report.reason
        assert run_service(flow_env, other).traffic_statuses[0].revision == report.serving_revision
        assert lock_slots(flow_env, other) == 0
        # ... and all that time `held` was inside its promotion, holding its lock, its candidate refused.
        assert runner.is_alive() and outcome == {}
        assert lock_slots(flow_env, held) == 1
        assert [r["status"] for r in sb.requests(candidate, since=since) if r["path"] == "/health"][:1] == [503]
        serving = [(s.revision, s.percent, s.tag) for s in run_service(flow_env, held).traffic_statuses]
        assert [tag for _, _, tag in serving] == ["candidate"]  # deployed, not promoted: verify is still waiting
    finally:
        sb.clear_faults(candidate)
        runner.join(timeout=240)
    assert not runner.is_alive() and "error" not in outcome, outcome
    held_report = outcome["report"]
    assert held_report.outcome == "promoted" and held_report.verification.health_checks > 1
    assert lock_slots(flow_env, held) == 0


@pytest.mark.usefixtures("raised_quota")  # zero-downtime re-promotions: each candidate beside the serving revision
def test_rollback_to_a_named_revision_and_a_teardown_of_everything(flow_env, service, ip_hold):
    # A target of its own (network, subnet, service account, secret, bucket): the teardown deletes them, and the
    # session's other tests keep the shared "sandbox" ones.
    n = next(_ids)
    target = f"e2e-teardown-{n}"
    gcp = GcpTarget.model_validate({
        **flow_env.model_dump(), "network": f"e2e-td-net-{n}", "subnet": f"e2e-td-subnet-{n}",
        "service_account_name": f"e2e-td-sa-{n}", "build_service_account_name": f"e2e-td-build-{n}",
        "hf_token_secret": f"e2e-td-token-{n}",
        "bucket": f"e2e-td-weights-{n}", "build_bucket": f"e2e-td-builds-{n}",
    })  # fmt: skip
    gcp.save(target, overwrite=True)
    profile = f"e2e-td-runtime-token-{n}"  # the token in Secret Manager: the teardown has a secret to delete
    ServingProfile.preset("l4", hf_token_at_runtime=True).save(profile, overwrite=True)
    first, second, third = (promote(service, revision=rev, target=target, profile=profile)
                            for rev in ("main", "dev", "v1.0"))  # fmt: skip
    assert [r.outcome for r in (first, second, third)] == ["promoted"] * 3
    assert len({first.serving_revision, second.serving_revision, third.serving_revision}) == 3

    back = rollback_model(service=service, to_revision=first.serving_revision, target=target)
    # Not the previous revision (that is `second`): the one named.
    assert (back.from_revision, back.to_revision) == (third.serving_revision, first.serving_revision)
    traffic = [(s.revision, s.percent) for s in run_service(gcp, service).traffic_statuses if s.percent]
    assert traffic == [(first.serving_revision, 100)]

    kept = [b.name for b in clients.storage(gcp).list_blobs(gcp.bucket_name, prefix=f"reports/{service}/")]
    assert [name for name in kept if "-rollback-" in name and name.endswith(".md")]  # the rollback's own report

    everything = dict.fromkeys(("network", "service_account", "secret", "staged_weights", "build_bucket", "reports"),
                               True)  # fmt: skip
    ip_hold(0)  # as if Cloud Run had released the subnet's IPs (test_teardown_network_hold.py covers the hold)
    results = teardown(service=service, target=target, **everything)
    # The second service account and the last bucket are the build identity and the build bucket: absent, as a
    # prebuilt image needed no build (neither is created then).
    assert [(r.kind, r.action) for r in results] == [
        ("service", "deleted"), ("subnet", "deleted"), ("network", "deleted"), ("service-account", "deleted"),
        ("service-account", "absent"), ("secret", "deleted"), ("reports", "deleted"), ("bucket", "deleted"),
        ("bucket", "absent"),
    ]  # fmt: skip
    assert results[-1].name == f"gs://{gcp.build_bucket_name}"
    staged = results[-2].changes
    # Each of the three commits the service's revisions served, then "N objects deleted" in all.
    assert len(staged) == 4 and int(staged[-1].split()[0]) > 0, staged
    with pytest.raises(gexc.NotFound):
        run_service(gcp, service)
    with pytest.raises(gexc.NotFound):
        clients.compute_subnetworks(gcp).get(project=gcp.project, region=gcp.region, subnetwork=gcp.subnet)
    with pytest.raises(gexc.NotFound):
        clients.compute_networks(gcp).get(project=gcp.project, network=gcp.network)
    iam = clients.iam(gcp)
    account = iam.session.get(iam.url(f"projects/{gcp.project}/serviceAccounts/{gcp.service_account_email}"))
    assert account.status_code == 404
    with pytest.raises(gexc.NotFound):
        clients.secret_manager(gcp).get_secret(name=ensure.secret_path(gcp))
    assert clients.storage(gcp).lookup_bucket(gcp.bucket_name) is None

    again = teardown(service=service, target=target, **everything)  # idempotent: all already gone
    assert [(r.kind, r.action) for r in again] == [
        ("service", "absent"), ("subnet", "absent"), ("network", "absent"), ("service-account", "absent"),
        ("service-account", "absent"), ("secret", "absent"), ("reports", "absent"), ("bucket", "absent"),
        ("bucket", "absent"),
    ]  # fmt: skip
