"""What a scale-service or rollback-model run says it did (issue 33, items 3 and 6).

A schedule's scale of a service not promoted yet completes as a no-op that says so, while the same scale started by
hand fails naming the service; every scale and rollback ends with one outcome line and an artifact with its facts.
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from uuid import UUID

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey, DeploymentFilter, DeploymentFilterId
from prefect.client.schemas.objects import FlowRun
from prefect.client.schemas.sorting import ArtifactSort
from prefect.flow_engine import run_flow
from prefect.schedules import Cron

from flows.rollback import rollback_model
from flows.scale import scale_service
from tasks.common import clients
from tests.support.promotion import promote
from tests.support.run_log import run_logs

pytestmark = pytest.mark.prefect
_ids = itertools.count()


@pytest.fixture
def service() -> str:
    return f"outcome-{next(_ids)}"


def hours_deployment(service: str) -> UUID:
    """A scale-service deployment on an hourly schedule, as sync_deployments writes one per model file."""
    up = Cron("0 * * * *", timezone="Europe/Berlin", slug=f"{service}-scale-up", parameters={"min_instances": 1})
    return scale_service.to_deployment(
        name=f"{service}-hours", parameters={"service": service, "min_instances": 0}, schedules=[up]
    ).apply()


def scheduled_run(deployment_id: UUID) -> FlowRun:
    """A run of the deployment's schedule as Prefect's scheduler makes it: the server's schedule_runs (the function
    its scheduler service calls), here for a time an hour or so ago so that the run may start at once."""
    now = datetime.now(UTC)
    window = {"start_time": (now - timedelta(hours=2)).isoformat(), "end_time": now.isoformat(), "max_runs": 1}
    with get_client(sync_client=True) as client:
        response = client.request("POST", "/deployments/{id}/schedule", path_params={"id": deployment_id}, json=window)
        response.raise_for_status()
        runs = client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id])))
    (run,) = [r for r in runs if r.expected_start_time <= now]
    assert run.created_by is not None and run.created_by.type == "SCHEDULE"  # what makes it a schedule's run
    return run


def final_state(run: FlowRun) -> str:
    with get_client(sync_client=True) as client:
        return client.read_flow_run(run.id).state.name


def artifact(key: str) -> str:
    """The markdown of the newest artifact under ``key`` ("" when there is none)."""
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])), sort=ArtifactSort.CREATED_DESC
        )
    return found[0].data if found else ""


def serving(flow_env, service: str):
    return clients.run_services(flow_env).get_service(name=f"{flow_env.location_path}/services/{service}")


def test_a_scheduled_scale_of_a_service_never_promoted_completes_saying_so(flow_env, service):
    run = scheduled_run(hours_deployment(service))
    with run_logs() as logs:
        assert run_flow(scale_service, flow_run=run, parameters=run.parameters) is None
    assert final_state(run) == "Completed"
    (line,) = [line for line in logs.lines if "not promoted yet" in line]
    assert line.startswith(f"scale {service}: not promoted yet, nothing to scale (schedule {service}-scale-up)")
    assert line.endswith(f"promote it first: prefect deployment run promote-model/{service}")
    assert "not promoted yet" in artifact(f"scale-{service}")


def test_a_manual_scale_of_a_missing_service_fails_naming_it(flow_env, service):
    with pytest.raises(Exception, match=f"no Cloud Run service '{service}'"):
        scale_service(service=service, min_instances=1)
    # And a run of the same scheduled deployment started by hand (`prefect deployment run`) fails too.
    deployment_id = hours_deployment(service)
    with get_client(sync_client=True) as client:
        run = client.create_flow_run_from_deployment(deployment_id)
    with pytest.raises(Exception, match=f"no Cloud Run service '{service}'"):
        run_flow(scale_service, flow_run=run, parameters=run.parameters)
    assert final_state(run) == "Failed"


def test_scale_ends_with_one_outcome_line_and_an_artifact_of_its_facts(flow_env, service):
    report = promote(service)
    url = serving(flow_env, service).uri
    assert not serving(flow_env, service).scaling.max_instance_count  # the profile leaves it to Cloud Run
    with run_logs() as logs:
        assert scale_service(service=service, min_instances=1).changed
    outcome = [line for line in logs.lines if line.startswith(f"scale {service}:")]
    assert outcome == [
        f"scale {service}: min 0 -> 1, max not set (changed); traffic {report.serving_revision} 100 %, url {url}"
    ]
    text = artifact(f"scale-{service}")
    for fact in (outcome[0], f"| serving revision | {report.serving_revision} |", f"| URL | {url} |",
                 "| min instances | 0 -> 1 |", "| max instances | not set |", "| changed | yes |"):  # fmt: skip
        assert fact in text, text
    with run_logs() as logs:
        assert scale_service(service=service, min_instances=1, max_instances=2).changed
    assert f"scale {service}: min 1, max not set -> 2 (changed)" in logs.text()
    with run_logs() as logs:
        assert not scale_service(service=service, min_instances=1).changed
    assert f"scale {service}: min 1, max 2 (no change)" in logs.text()
    assert "| changed | no |" in artifact(f"scale-{service}")


@pytest.mark.usefixtures("raised_quota")  # a zero-downtime re-promotion: the candidate beside the serving revision
def test_rollback_ends_with_one_outcome_line_and_an_artifact_of_its_facts(flow_env, service):
    first = promote(service)
    second = promote(service, revision="dev")
    url = serving(flow_env, service).uri
    with run_logs() as logs:
        rollback_model(service=service)
    outcome = [line for line in logs.lines if line.startswith(f"rollback {service}:")]
    assert outcome == [
        f"rollback {service}: traffic 100 % -> {first.serving_revision} (was {second.serving_revision}), url {url}"
    ]
    text = artifact(f"rollback-{service}")
    for fact in (outcome[0], f"| serving revision | {first.serving_revision} |", f"| URL | {url} |",
                 f"| rolled back from | {second.serving_revision} (recorded as rolled back) |"):  # fmt: skip
        assert fact in text, text
