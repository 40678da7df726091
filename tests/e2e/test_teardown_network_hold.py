"""Teardown of a network whose subnet Cloud Run's Direct VPC egress still holds (issue 12, first-run failures).

Compute refuses to delete the subnet for 1-2 hours after the last service using it is deleted (the sandbox's
``serverless_ip_hold_seconds``). The teardown must say what holds it and when to retry, finish the service's
teardown anyway, and schedule the retry when it runs from a deployment.
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest
from google.api_core import exceptions as gexc
from google.cloud import run_v2
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId, FlowRunFilter
from prefect.flow_engine import run_flow

from blocks import GcpTarget
from flows.teardown import teardown
from tasks.common import clients
from tasks.infra import ensure
from tests.support.models import tiny_model_files, upload_model
from tests.support.services import SMALLEST_L4, gpu_service

pytestmark = [
    pytest.mark.prefect,
    # held_target grants the revisions' account its bucket with raw calls (no product wait for the grant to count).
    pytest.mark.usefixtures("grants_propagated"),
]
_ids = itertools.count()


@pytest.fixture
def held_target(flow_env) -> tuple[str, GcpTarget, str]:
    """A saved target with a network and subnet of its own, and a service using the subnet (Direct VPC egress)."""
    n = next(_ids)
    name = f"e2e-hold-{n}"
    gcp = GcpTarget.model_validate(
        {**flow_env.model_dump(), "network": f"hold-net-{n}", "subnet": f"hold-subnet-{n}", "bucket": f"hold-{n}"}
    )
    gcp.save(name, overwrite=True)
    for step in (ensure.ensure_bucket, ensure.ensure_network, ensure.ensure_subnet):
        step(gcp)
    upload_model(clients.storage(gcp), gcp.bucket_name, "models/tiny", tiny_model_files())
    service = f"hold-svc-{n}"
    deploy_on_subnet(gcp, service)
    return name, gcp, service


def deploy_on_subnet(gcp: GcpTarget, service: str) -> None:
    """The smallest L4 instance: two services on the subnet fit a new project's 40 GiB side by side."""
    spec = gpu_service(gcp.bucket_name, **SMALLEST_L4)
    spec.template.vpc_access = run_v2.VpcAccess(
        network_interfaces=[run_v2.VpcAccess.NetworkInterface(network=gcp.network, subnetwork=gcp.subnet)],
        egress=run_v2.VpcAccess.VpcEgress.ALL_TRAFFIC,
    )
    operation = clients.run_services(gcp).create_service(parent=gcp.location_path, service=spec, service_id=service)
    operation.result(polling=clients.operation_polling(gcp))


def subnet_exists(gcp: GcpTarget) -> bool:
    try:
        clients.compute_subnetworks(gcp).get(project=gcp.project, region=gcp.region, subnetwork=gcp.subnet)
    except gexc.NotFound:
        return False
    return True


def test_compute_refuses_the_subnet_while_a_service_uses_it_naming_the_serverless_address(held_target):
    _, gcp, _ = held_target
    with pytest.raises(gexc.BadRequest) as caught:
        clients.compute_subnetworks(gcp).delete_unary(project=gcp.project, region=gcp.region, subnetwork=gcp.subnet)
    (error,) = caught.value.errors
    assert error["reason"] == "resourceInUseByAnotherResource"
    prefix = (
        f"The subnetwork resource 'projects/{gcp.project}/regions/{gcp.region}/subnetworks/{gcp.subnet}' is already "
        f"being used by 'projects/{gcp.project}/regions/{gcp.region}/addresses/serverless-ipv4-"
    )
    assert error["message"].startswith(prefix)


def test_teardown_right_after_the_service_reports_the_held_subnet_then_succeeds_once_released(held_target, ip_hold):
    name, gcp, service = held_target
    ip_hold(3600)  # an hour, as on Google Cloud (36 s real at the default time scale): still held below
    before = datetime.now(UTC)
    results = teardown(service=service, target=name, network=True)

    assert [(r.kind, r.action) for r in results] == [("service", "deleted"), ("subnet", "held"), ("network", "held")]
    subnet = results[1]
    assert subnet.holder.startswith(f"projects/{gcp.project}/regions/{gcp.region}/addresses/serverless-ipv4-")
    assert subnet.services == []  # the only user is gone: it is Cloud Run's release delay, not a live service
    assert before + timedelta(hours=2) <= subnet.retry_at <= datetime.now(UTC) + timedelta(hours=2)
    why, retry = subnet.changes
    assert "1-2 h after the last service using the subnet is deleted" in why
    assert f"retry at {subnet.retry_at:%Y-%m-%d %H:%M} UTC" in why
    # Not run from a deployment: nothing scheduled, the exact command instead.
    assert retry == (
        "not run from a deployment, nothing scheduled; to retry, run: prefect deployment run teardown/teardown "
        f"-p service={service} -p target={name} -p network=true --start-at "
        f"'{subnet.retry_at:%Y-%m-%d %H:%M:%S} UTC'"
    )
    assert subnet_exists(gcp)

    ip_hold(0)  # Cloud Run has released the IPs
    again = teardown(service=service, target=name, network=True)
    assert [(r.kind, r.action) for r in again] == [("service", "absent"), ("subnet", "deleted"), ("network", "deleted")]
    assert not subnet_exists(gcp)


def test_teardown_run_from_a_deployment_schedules_its_own_network_retry(held_target, ip_hold):
    name, _, service = held_target
    ip_hold(3600)
    deployment_id = teardown.to_deployment(name=f"teardown-{name}").apply()
    params = {"service": service, "target": name, "network": True}
    with get_client(sync_client=True) as client:
        flow_run = client.create_flow_run_from_deployment(deployment_id, parameters=params)
    results = run_flow(teardown, flow_run=flow_run, parameters=params)

    subnet = results[1]
    assert (subnet.kind, subnet.action) == ("subnet", "held")
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(
            deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id])),
            flow_run_filter=FlowRunFilter(),
        )
    (retry,) = [r for r in runs if r.id != flow_run.id]
    assert retry.state.is_scheduled()
    assert retry.state.state_details.scheduled_time == subnet.retry_at
    assert retry.parameters == {"service": service, "target": name, "network": True}
    assert subnet.changes[-1] == (
        f"scheduled flow run {retry.name} ({retry.id}) of this deployment at {subnet.retry_at:%Y-%m-%d %H:%M} UTC"
    )


def test_a_subnet_another_service_still_uses_names_that_service_and_schedules_nothing(held_target, ip_hold):
    name, gcp, service = held_target
    other = f"{service}-b"
    deploy_on_subnet(gcp, other)
    ip_hold(0)  # not Cloud Run's release delay: a live service holds the IPs
    results = teardown(service=service, target=name, network=True)

    # Found from Cloud Run before any delete (the other service's egress names the subnet): kept, not tried.
    assert [(r.kind, r.action) for r in results] == [("service", "deleted"), ("subnet", "kept"), ("network", "kept")]
    assert results[1].changes == [
        f"in use by {other} (Direct VPC egress through it); tear that service down first to delete it"
    ]
    assert [(r.kind, r.action) for r in teardown(service=other, target=name, network=True)] == [
        ("service", "deleted"), ("subnet", "deleted"), ("network", "deleted"),
    ]  # fmt: skip
